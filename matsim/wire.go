package matsim

import (
	"encoding/json"

	"github.com/matbus/matbus/matclient"
)

// Wire types of the MAT `GET /machines/status` body, fields in MAT's order.
// They are written here, independently of matclient's decoder, so that
// decoding what the simulator serves tests the decoder against the schema.

type wireStatus struct {
	InventoryID string       `json:"inventory_id"`
	EpochID     string       `json:"epoch_id"`
	Generation  uint64       `json:"generation"`
	Machines    []wireDevice `json:"machines"`
}

type wireDevice struct {
	MatID           string       `json:"mat_id"`
	DeviceKind      string       `json:"device_kind"`
	DeviceID        string       `json:"device_id"`
	MachineID       string       `json:"machine_id,omitempty"`
	HardwareType    string       `json:"hardware_type,omitempty"`
	MatState        string       `json:"mat_state,omitempty"`
	APIState        string       `json:"api_state"`
	PowerState      string       `json:"power_state"`
	MachineIP       string       `json:"machine_ip,omitempty"`
	NvosIP          string       `json:"nvos_ip,omitempty"`
	InfinibandPorts []wireIBPort `json:"infiniband_ports,omitempty"`
	BMC             wireBMC      `json:"bmc"`
	DPUs            []wireDevice `json:"dpus"`
}

type wireIBPort struct {
	GUID  string `json:"guid"`
	State string `json:"state"`
}

type wireBMC struct {
	IP      string        `json:"ip,omitempty"`
	Redfish wireEndpoint  `json:"redfish"`
	IPMI    *wireEndpoint `json:"ipmi,omitempty"`
	SSH     *wireEndpoint `json:"ssh,omitempty"`
}

type wireEndpoint struct {
	ReachablePort uint16 `json:"reachable_port"`
	ListenPort    uint16 `json:"listen_port"`
}

// Legacy (July 2026) shape: only machines[], no device_kind, device_id,
// nvos_ip, infiniband_ports or bmc.ssh.

type legacyStatus struct {
	Machines []legacyDevice `json:"machines"`
}

type legacyDevice struct {
	MatID        string         `json:"mat_id"`
	MachineID    string         `json:"machine_id,omitempty"`
	HardwareType string         `json:"hardware_type,omitempty"`
	MatState     string         `json:"mat_state,omitempty"`
	APIState     string         `json:"api_state"`
	PowerState   string         `json:"power_state"`
	MachineIP    string         `json:"machine_ip,omitempty"`
	BMC          legacyBMC      `json:"bmc"`
	DPUs         []legacyDevice `json:"dpus"`
}

type legacyBMC struct {
	IP      string        `json:"ip,omitempty"`
	Redfish wireEndpoint  `json:"redfish"`
	IPMI    *wireEndpoint `json:"ipmi,omitempty"`
}

func wireEP(ep *matclient.Endpoint) *wireEndpoint {
	if ep == nil {
		return nil
	}
	return &wireEndpoint{ReachablePort: ep.ReachablePort, ListenPort: ep.ListenPort}
}

func toWire(ds []matclient.Device) []wireDevice {
	out := make([]wireDevice, len(ds)) // never nil: MAT always sends []
	for i, d := range ds {
		w := wireDevice{
			MatID:        d.MatID,
			DeviceKind:   string(d.Kind),
			DeviceID:     d.DeviceID,
			MachineID:    d.MachineID,
			HardwareType: d.HardwareType,
			MatState:     d.MatState,
			APIState:     d.APIState,
			PowerState:   d.PowerState,
			MachineIP:    d.MachineIP,
			NvosIP:       d.NvosIP,
			BMC: wireBMC{
				IP:      d.BMC.IP,
				Redfish: *wireEP(&d.BMC.Redfish),
				IPMI:    wireEP(d.BMC.IPMI),
				SSH:     wireEP(d.BMC.SSH),
			},
			DPUs: toWire(d.DPUs),
		}
		if w.DeviceID == "" {
			w.DeviceID = d.MatID // MAT: the mat_id until NICo assigned an ID
		}
		if w.APIState == "" {
			w.APIState = "Unknown"
		}
		for _, p := range d.InfinibandPorts {
			w.InfinibandPorts = append(w.InfinibandPorts, wireIBPort(p))
		}
		out[i] = w
	}
	return out
}

func toLegacy(ds []matclient.Device) []legacyDevice {
	out := make([]legacyDevice, len(ds))
	for i, d := range ds {
		out[i] = legacyDevice{
			MatID:        d.MatID,
			MachineID:    d.MachineID,
			HardwareType: d.HardwareType,
			MatState:     d.MatState,
			APIState:     d.APIState,
			PowerState:   d.PowerState,
			MachineIP:    d.MachineIP,
			BMC: legacyBMC{
				IP:      d.BMC.IP,
				Redfish: *wireEP(&d.BMC.Redfish),
				IPMI:    wireEP(d.BMC.IPMI),
			},
			DPUs: toLegacy(d.DPUs),
		}
		if out[i].APIState == "" {
			out[i].APIState = "Unknown"
		}
	}
	return out
}

// Encode renders f as the MAT `GET /machines/status` body: the v2 shape
// with the given epoch and generation, or with legacy set the July 2026
// shape (only machines[]; switches and power shelves then look like hosts
// except for their hardware_type).
func (f *Fleet) Encode(epochID string, generation uint64, legacy bool) ([]byte, error) {
	if legacy {
		return json.Marshal(legacyStatus{Machines: toLegacy(f.Machines)})
	}
	return json.Marshal(wireStatus{
		InventoryID: f.InventoryID,
		EpochID:     epochID,
		Generation:  generation,
		Machines:    toWire(f.Machines),
	})
}
