package matclient

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
// Machines holds the top-level devices in MAT's registry order; DPUs are
// nested under their host. For SchemaLegacy, InventoryID, EpochID and
// Generation are empty/zero.
type Status struct {
	Schema      Schema
	InventoryID string
	EpochID     string
	Generation  uint64
	Machines    []Device
}

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
