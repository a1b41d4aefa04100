package matclient

import "strings"

// Schema tells which shape of the MAT `GET /machines/status` body was decoded.
type Schema int

const (
	// SchemaLegacy is MAT's first status API (July 2026): only `machines[]`,
	// no inventory identity and no `device_kind`.
	SchemaLegacy Schema = 1
	// SchemaV2 is the shape with `inventory_id`, `epoch_id`, `generation` and
	// a `device_kind` on every device (Aug 2026).
	SchemaV2 Schema = 2
)

// DeviceKind is the kind of a simulated device, as MAT writes it in
// `device_kind` (snake_case). Legacy bodies have no such field: the decoder
// derives it from the position (nested = dpu) and the hardware type.
type DeviceKind string

// Device kinds of the MAT status schema.
const (
	KindMachine    DeviceKind = "machine"
	KindDPU        DeviceKind = "dpu"
	KindSwitch     DeviceKind = "switch"
	KindPowerShelf DeviceKind = "power_shelf"
)

// Status is a decoded and validated MAT `GET /machines/status` body.
// Machines holds the valid top-level devices in MAT's registry order; DPUs
// are nested under their host. Invalid lists the devices Decode left out,
// in body order. For SchemaLegacy, InventoryID, EpochID and Generation are
// empty/zero.
type Status struct {
	Schema      Schema
	InventoryID string
	EpochID     string
	Generation  uint64
	Machines    []Device
	// Invalid are the devices of the body with an invalid field (or an
	// invalid host, or a mat_id that occurs more than once), in body order
	// (hosts before their DPUs); nil when there are none. None of them is
	// in Machines, and no device in Machines has the MatID of one of them.
	Invalid []InvalidDevice
}

// InvalidDevice is a device of the status body that Decode left out of
// Status.Machines.
type InvalidDevice struct {
	// Path is the device's position in the body: "machines[3]" for a
	// top-level device, "machines[3].dpus[0]" for a DPU.
	Path string
	// MatID is the device's mat_id, "" when it has no non-empty string
	// mat_id.
	MatID string
	// Reason says what is wrong, starting with the field (relative to the
	// device) where there is one, e.g. `bmc.ip: "x" is not an IPv4
	// address`, "bmc.redfish.listen_port: 70000 is out of range 1..65535",
	// "mat_id: duplicate mat_id, also at machines[0]", "device must be a
	// JSON object, got null", or "host machines[3] is invalid" for a DPU
	// without a fault of its own.
	Reason string
}

// String returns "<path> (mat_id <id>): <reason>", without the mat_id part
// when MatID is "".
func (d InvalidDevice) String() string {
	if d.MatID == "" {
		return d.Path + ": " + d.Reason
	}
	return d.Path + " (mat_id " + d.MatID + "): " + d.Reason
}

// Nested reports whether the device sits under a host (Path has a
// ".dpus[" part): it would be a DPU.
func (d InvalidDevice) Nested() bool { return strings.Contains(d.Path, ".dpus[") }

// Device is one simulated device (host, DPU, switch or power shelf) with its
// mock BMC. Optional string fields are "" when MAT omitted them.
type Device struct {
	MatID           string
	Kind            DeviceKind
	DeviceID        string // v2 only; "" for legacy bodies
	MachineID       string
	HardwareType    string
	MatState        string
	APIState        string
	PowerState      string
	MachineIP       string
	NvosIP          string
	InfinibandPorts []IBPort
	BMC             BMC
	DPUs            []Device
}

// IBPort is one InfiniBand port of a host: a 16-hex-digit GUID and its state
// ("active" or "down").
type IBPort struct {
	GUID  string
	State string
}

// BMC is a device's mock BMC. IP is "" until the BMC has a DHCP lease.
// IPMI and SSH are nil when MAT does not advertise them.
type BMC struct {
	IP      string
	Redfish Endpoint
	IPMI    *Endpoint
	SSH     *Endpoint
}

// Endpoint is a BMC endpoint: ReachablePort is the port clients use (the
// Service port), ListenPort the port MAT listens on (the Service targetPort).
// Both are TCP/UDP port numbers in 1..65535.
type Endpoint struct {
	ReachablePort uint16
	ListenPort    uint16
}

// Walk calls fn for every device of s, hosts before their DPUs, in body
// order. parent is nil for top-level devices and the host for DPUs.
func (s *Status) Walk(fn func(d *Device, parent *Device)) {
	var walk func(ds []Device, parent *Device)
	walk = func(ds []Device, parent *Device) {
		for i := range ds {
			fn(&ds[i], parent)
			walk(ds[i].DPUs, &ds[i])
		}
	}
	walk(s.Machines, nil)
}
