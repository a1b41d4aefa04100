package matclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	return b
}

func findDevice(st *Status, matID string) (dev, parent *Device) {
	st.Walk(func(d, p *Device) {
		if d.MatID == matID {
			dev, parent = d, p
		}
	})
	return dev, parent
}

func mustDevice(t *testing.T, st *Status, matID string) *Device {
	t.Helper()
	d, _ := findDevice(st, matID)
	if d == nil {
		t.Fatalf("device %s not found", matID)
	}
	return d
}

func TestDecodeFixtures(t *testing.T) {
	tests := []struct {
		file   string
		schema Schema
		counts Counts
		check  func(t *testing.T, st *Status)
	}{
		{
			file:   "legacy-small.json",
			schema: SchemaLegacy,
			counts: Counts{Machines: 2, DPUs: 3, WithBMCIP: 4},
			check: func(t *testing.T, st *Status) {
				if st.InventoryID != "" || st.EpochID != "" || st.Generation != 0 {
					t.Errorf("legacy identity = %q %q %d, want empty", st.InventoryID, st.EpochID, st.Generation)
				}
				h := mustDevice(t, st, "9f48758c-53ae-4d68-a454-d9c10767104e")
				if h.Kind != KindMachine || h.HardwareType != "nvidia_dgx_gb300" || h.DeviceID != "" {
					t.Errorf("host 1 = kind %q hw %q device_id %q", h.Kind, h.HardwareType, h.DeviceID)
				}
				if h.BMC.IPMI == nil || *h.BMC.IPMI != (Endpoint{ReachablePort: 623, ListenPort: 16020}) {
					t.Errorf("host 1 IPMI = %+v, want 623->16020", h.BMC.IPMI)
				}
				if h.BMC.SSH != nil {
					t.Errorf("legacy host has SSH %+v", h.BMC.SSH)
				}
				if h.BMC.IP != "192.0.2.21" || h.MachineIP != "10.100.0.21" {
					t.Errorf("host 1 IPs = %q %q", h.BMC.IP, h.MachineIP)
				}
				h2 := mustDevice(t, st, "db3205fc-c11b-431e-950e-573c5bcb4013")
				if h2.BMC.IP != "" || h2.MachineID != "" || len(h2.DPUs) != 2 {
					t.Errorf("host 2 = bmc ip %q machine_id %q dpus %d", h2.BMC.IP, h2.MachineID, len(h2.DPUs))
				}
				d, p := findDevice(st, "e87c7e19-87dd-4a7b-96b4-a45783ff2e5a")
				if d == nil || d.Kind != KindDPU || p != h2 || d.BMC.IP != "192.0.2.25" || d.MatState != "DhcpComplete" {
					t.Errorf("dpu = %+v parent %v", d, p)
				}
			},
		},
		{
			file:   "v2-mixed.json",
			schema: SchemaV2,
			counts: Counts{Machines: 3, DPUs: 4, Switches: 2, PowerShelves: 1, WithBMCIP: 8},
			check: func(t *testing.T, st *Status) {
				if st.InventoryID != "mat-02:01:00:00:00:00" || st.EpochID != "2026-08-21T19:04:05.417203981Z" || st.Generation != 7 {
					t.Errorf("identity = %q %q %d", st.InventoryID, st.EpochID, st.Generation)
				}
				wantOrder := []string{"922f3d9b", "7ec7b7c3", "d171a368", "1a530254", "d5bb3746", "624423f1"}
				for i, w := range wantOrder {
					if !strings.HasPrefix(st.Machines[i].MatID, w) {
						t.Errorf("machines[%d] = %s, want %s…", i, st.Machines[i].MatID, w)
					}
				}
				gb200 := mustDevice(t, st, "922f3d9b-20be-461f-9b69-90928701ce93")
				if len(gb200.DPUs) != 2 || len(gb200.InfinibandPorts) != 2 ||
					gb200.InfinibandPorts[1] != (IBPort{GUID: "0002c90300a1b2c5", State: "down"}) {
					t.Errorf("gb200 dpus %d ib %+v", len(gb200.DPUs), gb200.InfinibandPorts)
				}
				if gb200.BMC.SSH == nil || gb200.BMC.SSH.ListenPort != 2222 || gb200.BMC.IPMI != nil {
					t.Errorf("gb200 bmc = %+v", gb200.BMC)
				}
				if gb200.DeviceID != gb200.MachineID || !strings.HasPrefix(gb200.DeviceID, "fm100ht") {
					t.Errorf("gb200 device_id %q machine_id %q", gb200.DeviceID, gb200.MachineID)
				}
				dgx := mustDevice(t, st, "7ec7b7c3-126b-412a-babf-fd79d002e921")
				if dgx.BMC.IPMI == nil || *dgx.BMC.IPMI != (Endpoint{16021, 16021}) || dgx.BMC.IP != "10.96.64.13" {
					t.Errorf("dgx bmc = %+v ipmi %+v", dgx.BMC, dgx.BMC.IPMI)
				}
				sm := mustDevice(t, st, "d171a368-ea6a-45f5-9b66-6767052fe916")
				if sm.HardwareType != "supermicro_gb300_nvl" || sm.BMC.IP != "" ||
					sm.BMC.IPMI == nil || *sm.BMC.IPMI != (Endpoint{ReachablePort: 623, ListenPort: 16022}) {
					t.Errorf("supermicro = hw %q ip %q ipmi %+v, want IPMI 623->16022 and no IP", sm.HardwareType, sm.BMC.IP, sm.BMC.IPMI)
				}
				smDPU, parent := findDevice(st, "923c3a06-0b09-4573-a4da-142c606ae61e")
				if smDPU.MatState != "" || smDPU.BMC.IP != "" || smDPU.PowerState != "Off" || parent != sm || smDPU.Kind != KindDPU {
					t.Errorf("supermicro dpu = %+v", smDPU)
				}
				nd := mustDevice(t, st, "1a530254-57f0-4a8d-adb9-7d5520153f50")
				if nd.Kind != KindSwitch || nd.NvosIP != "10.98.0.20" || nd.MachineID != "" {
					t.Errorf("nd5200 = %+v", nd)
				}
				n57 := mustDevice(t, st, "d5bb3746-fdf8-424d-ba9d-3d7d407756a9")
				if n57.Kind != KindSwitch || n57.NvosIP != "" || n57.MatState != "NvosInit" {
					t.Errorf("n5700 = %+v", n57)
				}
				ps := mustDevice(t, st, "624423f1-04b4-404c-8d55-d1cb82fa8ae4")
				if ps.Kind != KindPowerShelf || ps.HardwareType != "liteon_power_shelf" || ps.BMC.IP != "10.96.64.40" {
					t.Errorf("power shelf = %+v", ps)
				}
				st.Walk(func(d, _ *Device) {
					if d.BMC.Redfish != (Endpoint{ReachablePort: 443, ListenPort: 1266}) {
						t.Errorf("%s redfish = %+v", d.MatID, d.BMC.Redfish)
					}
				})
			},
		},
		{
			file:   "v2-generation-bumped.json",
			schema: SchemaV2,
			counts: Counts{Machines: 3, DPUs: 3, Switches: 2, PowerShelves: 1, WithBMCIP: 7},
			check: func(t *testing.T, st *Status) {
				if st.Generation != 8 {
					t.Errorf("generation = %d, want 8", st.Generation)
				}
				h := mustDevice(t, st, "922f3d9b-20be-461f-9b69-90928701ce93")
				if len(h.DPUs) != 1 || h.BMC.IPMI == nil || *h.BMC.IPMI != (Endpoint{16030, 16030}) {
					t.Errorf("host = dpus %d ipmi %+v", len(h.DPUs), h.BMC.IPMI)
				}
				if d, _ := findDevice(st, "a15919aa-5727-4fb9-84e9-2980007cfc58"); d != nil {
					t.Errorf("dpu a15919aa still present")
				}
				if ip := mustDevice(t, st, "7ec7b7c3-126b-412a-babf-fd79d002e921").BMC.IP; ip != "10.96.64.50" {
					t.Errorf("7ec7b7c3 BMC IP = %q, want 10.96.64.50", ip)
				}
			},
		},
		{
			file:   "v2-empty.json",
			schema: SchemaV2,
			check: func(t *testing.T, st *Status) {
				if st.Machines == nil || len(st.Machines) != 0 || st.Generation != 1 {
					t.Errorf("machines = %#v generation %d, want empty non-nil, 1", st.Machines, st.Generation)
				}
			},
		},
		{
			file:   "long-ids.json",
			schema: SchemaV2,
			counts: Counts{Machines: 9, DPUs: 1, Switches: 1, PowerShelves: 1, WithBMCIP: 12},
			check: func(t *testing.T, st *Status) {
				long := "mat-switch-rack-0001-tray-09-nvlink-nd5200-ld-serial-sn000000000000001"
				if len(long) != 70 {
					t.Fatalf("test bug: len %d", len(long))
				}
				if d := mustDevice(t, st, long); d.Kind != KindSwitch {
					t.Errorf("70-char id kind = %q", d.Kind)
				}
				if d := mustDevice(t, st, "hôte-ümlaüt-0001"); d.Kind != KindPowerShelf || d.DeviceID != "hôte-ümlaüt-0001" {
					t.Errorf("non-ASCII id = %+v", d)
				}
				for _, id := range []string{"3F2B6C1E-8A4D-4C2B-9E7F-0A1B2C3D4E5F", "Rack1_Host.01", "trailing-", "host-abcd-12", "host-abcd-123"} {
					mustDevice(t, st, id)
				}
			},
		},
		{
			// Not a decode error: the planner decides who gets the IP.
			file:   "malformed/duplicate-bmc-ip.json",
			schema: SchemaV2,
			counts: Counts{Machines: 2, WithBMCIP: 2},
			check: func(t *testing.T, st *Status) {
				if st.Machines[0].BMC.IP != "10.96.66.10" || st.Machines[1].BMC.IP != "10.96.66.10" {
					t.Errorf("BMC IPs = %q %q", st.Machines[0].BMC.IP, st.Machines[1].BMC.IP)
				}
			},
		},
	}
	top, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(top) != len(tests)-1 { // the table also holds malformed/duplicate-bmc-ip
		t.Errorf("testdata has %d fixtures, table covers %d", len(top), len(tests)-1)
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			st, err := Decode(readFixture(t, tt.file))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if err := st.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if st.Schema != tt.schema {
				t.Errorf("schema = %v, want %v", st.Schema, tt.schema)
			}
			if got := st.Counts(); got != tt.counts {
				t.Errorf("counts = %+v, want %+v", got, tt.counts)
			}
			tt.check(t, st)
		})
	}
}

// TestDecodeMalformedFixtures says, for every file of testdata/malformed,
// whether it is a document-level error (Decode fails, nothing is known
// about any device) or a per-device one (the status decodes, the device is
// listed in Invalid), or no decode matter at all (duplicate BMC IPs are
// the planner's).
func TestDecodeMalformedFixtures(t *testing.T) {
	const id = "0c6f3a52-91d4-4b7e-8f20-5a6b7c8d9e01"
	type level int
	const (
		document level = iota // Decode returns an error
		device                // Decode returns a status; the device is in Invalid
		planning              // Decode returns a status without Invalid
	)
	tests := []struct {
		file        string
		level       level
		wantErr     []string        // document: substrings of the error
		wantInvalid []InvalidDevice // device: exactly these
		wantKept    int             // device, planning: top-level devices kept
	}{
		{file: "truncated.json", level: document, wantErr: []string{"invalid JSON", "unexpected end of JSON input"}},
		{file: "trailing-data.json", level: document, wantErr: []string{"invalid JSON", "after top-level value"}},
		{file: "null-machines.json", level: document, wantErr: []string{"machines: is null"}},
		{file: "generation-as-string.json", level: document, wantErr: []string{"generation: cannot unmarshal string into uint64"}},
		{file: "port-as-string.json", level: device, wantInvalid: []InvalidDevice{
			{Path: "machines[0]", MatID: id, Reason: "bmc.redfish.listen_port: cannot unmarshal string into uint16"}}},
		{file: "port-out-of-range.json", level: device, wantInvalid: []InvalidDevice{
			{Path: "machines[0]", MatID: id, Reason: "bmc.redfish.listen_port: 70000 is out of range 1..65535"}}},
		{file: "missing-bmc.json", level: device, wantInvalid: []InvalidDevice{
			{Path: "machines[0]", MatID: id, Reason: "bmc: missing (every device has a bmc object)"}}},
		{file: "duplicate-mat-ids.json", level: device, wantInvalid: []InvalidDevice{
			{Path: "machines[0]", MatID: id, Reason: "mat_id: duplicate mat_id, also at machines[1]"},
			{Path: "machines[1]", MatID: id, Reason: "mat_id: duplicate mat_id, also at machines[0]"}}},
		{file: "duplicate-bmc-ip.json", level: planning, wantKept: 2},
	}
	files, err := filepath.Glob(filepath.Join("testdata", "malformed", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(tests) {
		t.Errorf("testdata/malformed has %d files, table covers %d", len(files), len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			st, err := Decode(readFixture(t, filepath.Join("malformed", tt.file)))
			if tt.level == document {
				if err == nil {
					t.Fatalf("Decode = %+v, want a document-level error", st)
				}
				if st != nil {
					t.Errorf("Decode returned a status with an error")
				}
				if !errors.Is(err, ErrInvalidStatus) {
					t.Errorf("error %v does not wrap ErrInvalidStatus", err)
				}
				if !strings.HasPrefix(err.Error(), "matclient: invalid status: ") {
					t.Errorf("error %q lacks the prefix", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v, want a status", err)
			}
			if err := st.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if !reflect.DeepEqual(st.Invalid, tt.wantInvalid) {
				t.Errorf("invalid %+v\nwant %+v", st.Invalid, tt.wantInvalid)
			}
			if len(st.Machines) != tt.wantKept || st.Machines == nil {
				t.Errorf("%d machines kept (nil %v), want %d", len(st.Machines), st.Machines == nil, tt.wantKept)
			}
		})
	}
}

// TestDecodePartialFixture: a v2-mixed-like body with a DPU with a bad BMC
// IP, a switch with a port out of range, a power shelf without mat_id and
// a power shelf listed twice decodes; every other device is kept as in
// v2-mixed (including an SSH on the Redfish port, which is the planner's
// business), the invalid ones are listed in body order.
func TestDecodePartialFixture(t *testing.T) {
	const ps = "624423f1-04b4-404c-8d55-d1cb82fa8ae4"
	st, err := Decode(readFixture(t, filepath.Join("partial", "v2-mixed-partial.json")))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if err := st.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if st.Schema != SchemaV2 || st.Generation != 9 {
		t.Errorf("schema %v generation %d", st.Schema, st.Generation)
	}
	wantInvalid := []InvalidDevice{
		{Path: "machines[0].dpus[1]", MatID: "a15919aa-5727-4fb9-84e9-2980007cfc58", Reason: `bmc.ip: "10.96.64.300" is not an IPv4 address`},
		{Path: "machines[4]", MatID: "d5bb3746-fdf8-424d-ba9d-3d7d407756a9", Reason: "bmc.redfish.listen_port: 70000 is out of range 1..65535"},
		{Path: "machines[5]", MatID: ps, Reason: "mat_id: duplicate mat_id, also at machines[7]"},
		{Path: "machines[6]", Reason: "mat_id: empty"},
		{Path: "machines[7]", MatID: ps, Reason: "mat_id: duplicate mat_id, also at machines[5]"},
	}
	if !reflect.DeepEqual(st.Invalid, wantInvalid) {
		t.Errorf("invalid:\n%+v\nwant\n%+v", st.Invalid, wantInvalid)
	}
	full, err := Decode(readFixture(t, "v2-mixed.json"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	st.Walk(func(d, _ *Device) {
		kept = append(kept, d.MatID)
		want, _ := findDevice(full, d.MatID)
		if d.MatID == "7ec7b7c3-126b-412a-babf-fd79d002e921" {
			if d.BMC.SSH == nil || *d.BMC.SSH != (Endpoint{ReachablePort: 443, ListenPort: 2222}) {
				t.Errorf("dgx ssh %+v, want 443->2222", d.BMC.SSH)
			}
			return
		}
		if want == nil || !reflect.DeepEqual(*d, *want) && d.MatID != "922f3d9b-20be-461f-9b69-90928701ce93" {
			t.Errorf("%s differs from v2-mixed:\n%+v\n%+v", d.MatID, d, want)
		}
	})
	wantKept := []string{
		"922f3d9b-20be-461f-9b69-90928701ce93", "2458e540-24e4-46e5-b2cf-6caac4b9c637",
		"7ec7b7c3-126b-412a-babf-fd79d002e921", "9b8d41e8-ad45-4b7d-a541-38d781be09da",
		"d171a368-ea6a-45f5-9b66-6767052fe916", "923c3a06-0b09-4573-a4da-142c606ae61e",
		"1a530254-57f0-4a8d-adb9-7d5520153f50",
	}
	if !slices.Equal(kept, wantKept) {
		t.Errorf("kept %q\nwant %q", kept, wantKept)
	}
	if h := mustDevice(t, st, "922f3d9b-20be-461f-9b69-90928701ce93"); len(h.DPUs) != 1 || len(h.InfinibandPorts) != 2 {
		t.Errorf("gb200 host: %d dpus (want the valid one), %d ib ports", len(h.DPUs), len(h.InfinibandPorts))
	}
}

// TestFixturesMatchShared guards the testdata copies against drifting from
// the shared fixtures they were copied from (skipped where shared/ is not
// beside the repository).
func TestFixturesMatchShared(t *testing.T) {
	if _, err := os.Stat(sharedFixtures); err != nil {
		t.Skipf("shared fixtures not found: %v", err)
	}
	for _, pattern := range []string{"*.json", filepath.Join("malformed", "*.json")} {
		shared, err := filepath.Glob(filepath.Join(sharedFixtures, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range shared {
			rel, _ := filepath.Rel(sharedFixtures, f)
			want, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join("testdata", rel))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("testdata/%s differs from the shared fixture (%v)", rel, err)
			}
		}
	}
}

func TestDecodeErrorUnwrapsJSON(t *testing.T) {
	_, err := Decode(readFixture(t, "malformed/truncated.json"))
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("error %v does not unwrap to *json.SyntaxError", err)
	}
	var de *DecodeError
	if !errors.As(err, &de) || de.Path != "" {
		t.Errorf("DecodeError = %+v", de)
	}
}

// obj is a JSON object under construction for inline cases.
type obj = map[string]any

func ep(reach, listen any) obj { return obj{"reachable_port": reach, "listen_port": listen} }

// dev returns a valid v2 device of the given kind; muts edit it.
func dev(id string, kind DeviceKind, muts ...func(obj)) obj {
	d := obj{
		"mat_id":      id,
		"device_kind": string(kind),
		"device_id":   id,
		"api_state":   "Unknown",
		"power_state": "On",
		"bmc":         obj{"ip": "10.96.64.1", "redfish": ep(443, 1266)},
		"dpus":        []any{},
	}
	for _, m := range muts {
		m(d)
	}
	return d
}

func legacyDev(id, hw string, muts ...func(obj)) obj {
	d := obj{
		"mat_id":      id,
		"api_state":   "Unknown",
		"power_state": "On",
		"bmc":         obj{"redfish": ep(443, 1266)},
		"dpus":        []any{},
	}
	if hw != "" {
		d["hardware_type"] = hw
	}
	for _, m := range muts {
		m(d)
	}
	return d
}

func set(k string, v any) func(obj) { return func(o obj) { o[k] = v } }
func del(k string) func(obj)        { return func(o obj) { delete(o, k) } }
func setBMC(k string, v any) func(obj) {
	return func(o obj) { o["bmc"].(obj)[k] = v }
}
func dpus(ds ...obj) func(obj) {
	return func(o obj) {
		l := make([]any, len(ds))
		for i, d := range ds {
			l[i] = d
		}
		o["dpus"] = l
	}
}

func v2(devs ...obj) obj {
	l := make([]any, len(devs))
	for i, d := range devs {
		l[i] = d
	}
	return obj{"inventory_id": "mat-06:00:00:00:00:00", "epoch_id": "2026-08-21T19:04:05.417203981Z", "generation": 1, "machines": l}
}

func legacy(devs ...obj) obj {
	l := make([]any, len(devs))
	for i, d := range devs {
		l[i] = d
	}
	return obj{"machines": l}
}

func with(o obj, k string, v any) obj {
	o[k] = v
	return o
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeInline(t *testing.T) {
	const (
		h1 = "11111111-1111-4111-8111-111111111111"
		h2 = "22222222-2222-4222-8222-222222222222"
		d1 = "dddddddd-1111-4111-8111-111111111111"
		d2 = "dddddddd-2222-4222-8222-222222222222"
	)
	type tc struct {
		name    string
		body    any    // obj, or string for raw bodies
		wantErr string // substring of a document-level error; "" = must decode
		// wantInvalid are substrings of Status.Invalid[i].String(), one per
		// invalid device in body order. For obj bodies a valid neighbour
		// device is appended, which must be kept.
		wantInvalid []string
		// wantKept are the mat_ids of Machines in Walk order (neighbour
		// excluded); checked when wantInvalid is set.
		wantKept []string
		check    func(t *testing.T, st *Status)
	}
	tests := []tc{
		// Schema detection and legacy kinds.
		{name: "legacy kinds from hardware_type", body: legacy(
			legacyDev(h1, "dell_poweredge_r750", dpus(legacyDev(d1, ""))),
			legacyDev("sw1", "nvidia_switch_nd5200_ld"),
			legacyDev("sw2", "nvidia_switch_n5700_ld"),
			legacyDev("ps1", "liteon_power_shelf"),
			legacyDev("ps2", "delta_power_shelf"),
			legacyDev("x1", "some_future_box"),
			legacyDev("x2", ""),
		), check: func(t *testing.T, st *Status) {
			want := map[string]DeviceKind{h1: KindMachine, d1: KindDPU, "sw1": KindSwitch, "sw2": KindSwitch,
				"ps1": KindPowerShelf, "ps2": KindPowerShelf, "x1": KindMachine, "x2": KindMachine}
			if st.Schema != SchemaLegacy {
				t.Errorf("schema = %v", st.Schema)
			}
			for id, k := range want {
				if got := mustDevice(t, st, id).Kind; got != k {
					t.Errorf("%s kind = %q, want %q", id, got, k)
				}
			}
		}},
		{name: "device_kind alone makes v2", body: obj{"machines": []any{dev(h1, KindMachine)}},
			check: func(t *testing.T, st *Status) {
				if st.Schema != SchemaV2 || st.Generation != 0 {
					t.Errorf("schema %v generation %d", st.Schema, st.Generation)
				}
			}},
		{name: "generation alone makes v2", body: obj{"generation": 3, "machines": []any{}},
			check: func(t *testing.T, st *Status) {
				if st.Schema != SchemaV2 || st.Generation != 3 {
					t.Errorf("schema %v generation %d", st.Schema, st.Generation)
				}
			}},
		{name: "inventory_id alone makes v2", body: obj{"inventory_id": "mat-x", "machines": []any{}},
			check: func(t *testing.T, st *Status) {
				if st.Schema != SchemaV2 || st.InventoryID != "mat-x" {
					t.Errorf("schema %v inventory %q", st.Schema, st.InventoryID)
				}
			}},
		{name: "v2 dpu without device_kind is a dpu", body: v2(dev(h1, KindMachine, dpus(dev(d1, KindDPU, del("device_kind"))))),
			check: func(t *testing.T, st *Status) {
				if k := mustDevice(t, st, d1).Kind; k != KindDPU {
					t.Errorf("kind %q", k)
				}
			}},
		{name: "explicit device_kind wins over hardware_type", body: v2(dev("sw", KindMachine, set("hardware_type", "nvidia_switch_nd5200_ld"))),
			check: func(t *testing.T, st *Status) {
				if k := mustDevice(t, st, "sw").Kind; k != KindMachine {
					t.Errorf("kind %q", k)
				}
			}},
		{name: "unknown fields everywhere are ignored", body: with(v2(dev(h1, KindMachine,
			set("future_field", obj{"x": []any{1, 2}}),
			setBMC("vnc", ep(5900, 5900)),
			setBMC("redfish", obj{"reachable_port": 443, "listen_port": 1266, "tls": true}),
		)), "racks", []any{obj{"id": "r1"}}),
			check: func(t *testing.T, st *Status) {
				if d := mustDevice(t, st, h1); d.BMC.Redfish.ListenPort != 1266 {
					t.Errorf("redfish %+v", d.BMC.Redfish)
				}
			}},
		{name: "optional nulls are absent", body: v2(dev(h1, KindMachine,
			set("machine_ip", nil), set("machine_id", nil), set("mat_state", nil), set("infiniband_ports", nil),
			setBMC("ip", nil), setBMC("ipmi", nil), setBMC("ssh", nil), set("dpus", nil))),
			check: func(t *testing.T, st *Status) {
				d := mustDevice(t, st, h1)
				if d.MachineIP != "" || d.BMC.IP != "" || d.BMC.IPMI != nil || d.BMC.SSH != nil || d.DPUs != nil {
					t.Errorf("device %+v", d)
				}
			}},
		{name: "dpus missing is no dpus", body: legacy(legacyDev(h1, "", del("dpus")))},
		{name: "port bounds ok", body: v2(dev(h1, KindMachine, setBMC("redfish", ep(1, 65535)), setBMC("ssh", ep(22, 22)))),
			check: func(t *testing.T, st *Status) {
				d := mustDevice(t, st, h1)
				if d.BMC.Redfish != (Endpoint{1, 65535}) || *d.BMC.SSH != (Endpoint{22, 22}) {
					t.Errorf("bmc %+v", d.BMC)
				}
			}},
		{name: "max generation", body: `{"generation": 18446744073709551615, "machines": []}`,
			check: func(t *testing.T, st *Status) {
				if st.Generation != 1<<64-1 {
					t.Errorf("generation %d", st.Generation)
				}
			}},
		{name: "surrounding whitespace", body: "\n\t {\"machines\": []} \r\n"},
		{name: "same BMC IP twice decodes", body: v2(dev(h1, KindMachine), dev(h2, KindMachine))},

		// Document-level errors.
		{name: "empty body", body: "", wantErr: "invalid JSON"},
		{name: "json null", body: "null", wantErr: "top level must be a JSON object, got null"},
		{name: "top-level array", body: "[]", wantErr: "cannot unmarshal array"},
		{name: "top-level string", body: `"machines"`, wantErr: "cannot unmarshal string"},
		{name: "trailing garbage", body: `{"machines": []}x`, wantErr: "invalid JSON"},
		{name: "machines missing", body: obj{"generation": 1}, wantErr: "machines: missing"},
		{name: "machines object", body: obj{"machines": obj{}}, wantErr: "machines: cannot unmarshal object into array"},
		{name: "machines string", body: obj{"machines": "[]"}, wantErr: "machines: cannot unmarshal string into array"},
		{name: "generation negative", body: `{"generation": -1, "machines": []}`, wantErr: "generation: -1 is not an unsigned 64-bit integer"},
		{name: "generation fraction", body: `{"generation": 1.5, "machines": []}`, wantErr: "generation: 1.5 is not"},
		{name: "generation exponent", body: `{"generation": 1e3, "machines": []}`, wantErr: "generation: 1e3 is not"},
		{name: "generation overflow", body: `{"generation": 18446744073709551616, "machines": []}`, wantErr: "generation:"},
		{name: "generation zero", body: `{"generation": 0, "machines": []}`, wantErr: "generation: 0 is not a generation"},
		{name: "generation null", body: `{"generation": null, "machines": []}`, wantErr: "generation: cannot unmarshal null"},
		{name: "inventory_id number", body: with(v2(), "inventory_id", 7), wantErr: "inventory_id: cannot unmarshal number into string"},
		{name: "epoch_id object", body: with(v2(), "epoch_id", obj{}), wantErr: "epoch_id: cannot unmarshal object into string"},

		// Invalid devices: each is listed, the others are kept.
		{name: "device null", body: obj{"machines": []any{nil}},
			wantInvalid: []string{"machines[0]: device must be a JSON object, got null"}, wantKept: []string{}},
		{name: "device number", body: obj{"machines": []any{1}},
			wantInvalid: []string{"machines[0]: device must be a JSON object, got number"}, wantKept: []string{}},
		{name: "mat_id missing", body: v2(dev(h1, KindMachine), dev("", KindMachine, del("mat_id"))),
			wantInvalid: []string{"machines[1]: mat_id: missing"}, wantKept: []string{h1}},
		{name: "mat_id empty", body: v2(dev("", KindMachine)),
			wantInvalid: []string{"machines[0]: mat_id: empty"}, wantKept: []string{}},
		{name: "mat_id number", body: v2(dev(h1, KindMachine, set("mat_id", 42))),
			wantInvalid: []string{"machines[0]: mat_id: cannot unmarshal number into string"}, wantKept: []string{}},
		{name: "unknown device_kind", body: v2(dev(h1, "gpu"), dev(h2, KindMachine)),
			wantInvalid: []string{`machines[0] (mat_id ` + h1 + `): device_kind: unknown device kind "gpu"`}, wantKept: []string{h2}},
		{name: "device_kind wrong case", body: v2(dev(h1, "Machine")),
			wantInvalid: []string{`device_kind: unknown device kind "Machine"`}, wantKept: []string{}},
		{name: "device_kind number", body: v2(dev(h1, KindMachine, set("device_kind", 1))),
			wantInvalid: []string{"device_kind: cannot unmarshal number into string"}, wantKept: []string{}},
		{name: "top-level dpu", body: v2(dev(d1, KindDPU)),
			wantInvalid: []string{"machines[0] (mat_id " + d1 + "): device_kind: a dpu must be nested"}, wantKept: []string{}},
		{name: "nested machine: the host stays", body: v2(dev(h1, KindMachine, dpus(dev(h2, KindMachine)))),
			wantInvalid: []string{"machines[0].dpus[0] (mat_id " + h2 + `): device_kind: "machine" is not valid for a device nested`},
			wantKept:    []string{h1}},
		{name: "nested switch: the host stays", body: v2(dev(h1, KindMachine, dpus(dev("sw", KindSwitch), dev(d1, KindDPU)))),
			wantInvalid: []string{`machines[0].dpus[0] (mat_id sw): device_kind: "switch" is not valid for a device nested`},
			wantKept:    []string{h1, d1}},
		{name: "dpus under switch: switch and its dpus", body: v2(dev("sw", KindSwitch, dpus(dev(d1, KindDPU)))),
			wantInvalid: []string{"machines[0] (mat_id sw): dpus: a switch cannot have dpus (1 given)",
				"machines[0].dpus[0] (mat_id " + d1 + "): host machines[0] is invalid"},
			wantKept: []string{}},
		{name: "dpus under legacy power shelf", body: legacy(legacyDev("ps", "delta_power_shelf", dpus(legacyDev(d1, "")))),
			wantInvalid: []string{"machines[0] (mat_id ps): dpus: a power_shelf cannot have dpus",
				"machines[0].dpus[0] (mat_id " + d1 + "): host machines[0] is invalid"},
			wantKept: []string{}},
		{name: "dpus under dpu: the dpu, not its dpus", body: v2(dev(h1, KindMachine, dpus(dev(d1, KindDPU, dpus(dev(d2, KindDPU)))))),
			wantInvalid: []string{"machines[0].dpus[0] (mat_id " + d1 + "): dpus: a dpu cannot have dpus (1 given)"},
			wantKept:    []string{h1}},
		{name: "dpus object", body: v2(dev(h1, KindMachine, set("dpus", obj{}))),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + "): dpus: cannot unmarshal object into array"}, wantKept: []string{}},
		{name: "invalid dpu: host and sibling stay", body: v2(dev(h1, KindMachine, dpus(dev(d1, KindDPU), dev(d2, KindDPU, setBMC("ip", "x"))))),
			wantInvalid: []string{"machines[0].dpus[1] (mat_id " + d2 + `): bmc.ip: "x" is not an IPv4 address`},
			wantKept:    []string{h1, d1}},
		{name: "invalid host: its dpus are listed, with their own faults", body: v2(
			dev(h1, KindMachine, setBMC("ip", "x"), dpus(dev(d1, KindDPU), dev(d2, KindDPU, setBMC("redfish", ep(0, 1266))))),
			dev(h2, KindMachine)),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + `): bmc.ip: "x" is not an IPv4 address`,
				"machines[0].dpus[0] (mat_id " + d1 + "): host machines[0] is invalid",
				"machines[0].dpus[1] (mat_id " + d2 + "): bmc.redfish.reachable_port: 0 is out of range"},
			wantKept: []string{h2}},
		{name: "host without mat_id: its dpus are listed", body: v2(dev("", KindMachine, dpus(dev(d1, KindDPU)))),
			wantInvalid: []string{"machines[0]: mat_id: empty", "machines[0].dpus[0] (mat_id " + d1 + "): host machines[0] is invalid"},
			wantKept:    []string{}},
		{name: "dpu null", body: v2(dev(h1, KindMachine, dpus(dev(d1, KindDPU))), dev(h2, KindMachine, set("dpus", []any{nil}))),
			wantInvalid: []string{"machines[1].dpus[0]: device must be a JSON object, got null"}, wantKept: []string{h1, d1, h2}},
		{name: "string field as number", body: v2(dev(h1, KindMachine, set("api_state", 3))),
			wantInvalid: []string{"): api_state: cannot unmarshal number into string"}, wantKept: []string{}},

		// BMC and ports.
		{name: "bmc missing", body: legacy(legacyDev(h1, "", del("bmc"))), wantInvalid: []string{"): bmc: missing"}, wantKept: []string{}},
		{name: "bmc null", body: v2(dev(h1, KindMachine, set("bmc", nil))), wantInvalid: []string{"): bmc: missing"}, wantKept: []string{}},
		{name: "bmc string", body: v2(dev(h1, KindMachine, set("bmc", "10.0.0.1"))), wantInvalid: []string{"): bmc: cannot unmarshal string into object"}, wantKept: []string{}},
		{name: "redfish missing", body: v2(dev(h1, KindMachine, set("bmc", obj{"ip": "10.0.0.1"}))), wantInvalid: []string{"): bmc.redfish: missing"}, wantKept: []string{}},
		{name: "redfish array", body: v2(dev(h1, KindMachine, setBMC("redfish", []any{443, 1266}))), wantInvalid: []string{"): bmc.redfish: cannot unmarshal array into object"}, wantKept: []string{}},
		{name: "port zero", body: v2(dev(h1, KindMachine, setBMC("redfish", ep(0, 1266)))), wantInvalid: []string{"): bmc.redfish.reachable_port: 0 is out of range"}, wantKept: []string{}},
		{name: "port negative", body: v2(dev(h1, KindMachine, setBMC("redfish", ep(443, -1)))), wantInvalid: []string{"): bmc.redfish.listen_port: -1 is out of range"}, wantKept: []string{}},
		{name: "port 65536", body: v2(dev(h1, KindMachine, setBMC("redfish", ep(443, 65536)))), wantInvalid: []string{"): bmc.redfish.listen_port: 65536 is out of range"}, wantKept: []string{}},
		{name: "port huge", body: `{"machines":[{"mat_id":"a","bmc":{"redfish":{"reachable_port":443,"listen_port":99999999999999999999999}}}]}`,
			wantInvalid: []string{"machines[0] (mat_id a): bmc.redfish.listen_port: 99999999999999999999999 is out of range"}, wantKept: []string{}},
		{name: "port fraction", body: v2(dev(h1, KindMachine, setBMC("redfish", ep(443, 1266.5)))), wantInvalid: []string{"): bmc.redfish.listen_port: 1266.5 is not an integer"}, wantKept: []string{}},
		{name: "port missing", body: v2(dev(h1, KindMachine, setBMC("redfish", obj{"reachable_port": 443}))), wantInvalid: []string{"): bmc.redfish.listen_port: missing"}, wantKept: []string{}},
		{name: "port bool", body: v2(dev(h1, KindMachine, setBMC("redfish", ep(true, 1266)))), wantInvalid: []string{"reachable_port: cannot unmarshal bool into uint16"}, wantKept: []string{}},
		{name: "ipmi port out of range", body: v2(dev(h1, KindMachine, setBMC("ipmi", ep(623, 70000)))), wantInvalid: []string{"): bmc.ipmi.listen_port: 70000 is out of range"}, wantKept: []string{}},
		{name: "ssh port as string", body: v2(dev(h1, KindMachine, setBMC("ssh", ep("22", 22)))), wantInvalid: []string{"): bmc.ssh.reachable_port: cannot unmarshal string into uint16"}, wantKept: []string{}},
		{name: "ipmi not object", body: v2(dev(h1, KindMachine, setBMC("ipmi", 623))), wantInvalid: []string{"): bmc.ipmi: cannot unmarshal number into object"}, wantKept: []string{}},

		// Addresses.
		{name: "bmc ip v6", body: v2(dev(h1, KindMachine, setBMC("ip", "fd00::1"))), wantInvalid: []string{`): bmc.ip: "fd00::1" is not an IPv4 address`}, wantKept: []string{}},
		{name: "bmc ip v4-mapped", body: v2(dev(h1, KindMachine, setBMC("ip", "::ffff:10.0.0.1"))), wantInvalid: []string{"is not an IPv4 address"}, wantKept: []string{}},
		{name: "bmc ip hostname", body: v2(dev(h1, KindMachine, setBMC("ip", "bmc.local"))), wantInvalid: []string{"is not an IPv4 address"}, wantKept: []string{}},
		{name: "bmc ip with space", body: v2(dev(h1, KindMachine, setBMC("ip", "10.0.0.1 "))), wantInvalid: []string{"is not an IPv4 address"}, wantKept: []string{}},
		{name: "bmc ip leading zeros", body: v2(dev(h1, KindMachine, setBMC("ip", "010.0.0.1"))), wantInvalid: []string{"is not an IPv4 address"}, wantKept: []string{}},
		{name: "bmc ip cidr", body: v2(dev(h1, KindMachine, setBMC("ip", "10.0.0.1/24"))), wantInvalid: []string{"is not an IPv4 address"}, wantKept: []string{}},
		{name: "bmc ip number", body: v2(dev(h1, KindMachine, setBMC("ip", 167772161))), wantInvalid: []string{"): bmc.ip: cannot unmarshal number into string"}, wantKept: []string{}},
		{name: "machine_ip invalid", body: v2(dev(h1, KindMachine, set("machine_ip", "10.100.0.300"))), wantInvalid: []string{`): machine_ip: "10.100.0.300" is not an IPv4 address`}, wantKept: []string{}},
		{name: "nvos_ip invalid", body: v2(dev("sw", KindSwitch, set("nvos_ip", "fe80::1%eth0"))), wantInvalid: []string{"): nvos_ip:"}, wantKept: []string{}},

		// Duplicates: every device carrying the mat_id is invalid.
		{name: "duplicate host and dpu", body: v2(dev(h1, KindMachine), dev(h2, KindMachine, dpus(dev(h1, KindDPU)))),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[1].dpus[0]",
				"machines[1].dpus[0] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[0]"},
			wantKept: []string{h2}},
		{name: "duplicate across hosts' dpus", body: v2(dev(h1, KindMachine, dpus(dev(d1, KindDPU))), dev(h2, KindMachine, dpus(dev(d1, KindDPU)))),
			wantInvalid: []string{"machines[0].dpus[0] (mat_id " + d1 + "): mat_id: duplicate mat_id, also at machines[1].dpus[0]",
				"machines[1].dpus[0] (mat_id " + d1 + "): mat_id: duplicate mat_id, also at machines[0].dpus[0]"},
			wantKept: []string{h1, h2}},
		{name: "duplicate within legacy", body: legacy(legacyDev(h1, ""), legacyDev(h1, "")),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[1]",
				"machines[1] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[0]"},
			wantKept: []string{}},
		{name: "three times", body: v2(dev(h1, KindMachine), dev(h1, KindMachine), dev(h2, KindMachine), dev(h1, KindMachine)),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[1], machines[3]",
				"machines[1] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[0], machines[3]",
				"machines[3] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[0], machines[1]"},
			wantKept: []string{h2}},
		{name: "duplicate of a device with its own fault", body: v2(dev(h1, KindMachine, setBMC("ip", "x")), dev(h1, KindMachine)),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + `): bmc.ip: "x" is not an IPv4 address`,
				"machines[1] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[0]"},
			wantKept: []string{}},
		{name: "duplicate host keeps its dpus out", body: v2(dev(h1, KindMachine, dpus(dev(d1, KindDPU))), dev(h1, KindSwitch)),
			wantInvalid: []string{"machines[0] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[1]",
				"machines[0].dpus[0] (mat_id " + d1 + "): host machines[0] is invalid",
				"machines[1] (mat_id " + h1 + "): mat_id: duplicate mat_id, also at machines[0]"},
			wantKept: []string{}},

		// InfiniBand.
		{name: "ib ports object", body: v2(dev(h1, KindMachine, set("infiniband_ports", obj{}))), wantInvalid: []string{"): infiniband_ports: cannot unmarshal object into array"}, wantKept: []string{}},
		{name: "ib port without guid", body: v2(dev(h1, KindMachine, set("infiniband_ports", []any{obj{"state": "active"}}))), wantInvalid: []string{"): infiniband_ports[0].guid: missing"}, wantKept: []string{}},
		{name: "ib port guid number", body: v2(dev(h1, KindMachine, set("infiniband_ports", []any{obj{"guid": 5}}))), wantInvalid: []string{"): infiniband_ports[0].guid: cannot unmarshal number"}, wantKept: []string{}},
	}
	// neighbour is the valid device appended to every obj body with
	// wantInvalid: it must survive its neighbours' faults.
	const neighbour = "ffffffff-0000-4000-8000-00000000000f"
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body []byte
			switch b := tt.body.(type) {
			case string:
				body = []byte(b)
			case obj:
				if tt.wantInvalid != nil {
					b["machines"] = append(b["machines"].([]any), legacyDev(neighbour, ""))
				}
				body = marshal(t, b)
			}
			st, err := Decode(body)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Decode(%s) succeeded, want error containing %q", body, tt.wantErr)
				}
				if st != nil {
					t.Errorf("status returned with error")
				}
				if !errors.Is(err, ErrInvalidStatus) {
					t.Errorf("error %v does not wrap ErrInvalidStatus", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error = %q\nwant it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode(%s): %v", body, err)
			}
			if err := st.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if len(st.Invalid) != len(tt.wantInvalid) {
				t.Errorf("invalid %v, want %d entries %q", st.Invalid, len(tt.wantInvalid), tt.wantInvalid)
			} else {
				for i, w := range tt.wantInvalid {
					if got := st.Invalid[i].String(); !strings.Contains(got, w) {
						t.Errorf("invalid[%d] = %q\nwant it to contain %q", i, got, w)
					}
				}
			}
			if tt.wantInvalid != nil {
				var kept []string
				st.Walk(func(d, _ *Device) { kept = append(kept, d.MatID) })
				want := tt.wantKept
				if _, isObj := tt.body.(obj); isObj {
					want = append(slices.Clone(want), neighbour)
				}
				if !slices.Equal(kept, want) {
					t.Errorf("kept %q, want %q", kept, want)
				}
			}
			if tt.check != nil {
				tt.check(t, st)
			}
		})
	}
}

func TestKindForHardwareType(t *testing.T) {
	for hw, want := range map[string]DeviceKind{
		"nvidia_switch_nd5200_ld": KindSwitch, "nvidia_switch_n5700_ld": KindSwitch,
		"liteon_power_shelf": KindPowerShelf, "delta_power_shelf": KindPowerShelf,
		"dell_poweredge_r750": KindMachine, "generic_ami": KindMachine, "": KindMachine,
		"NVIDIA_SWITCH_ND5200_LD": KindMachine,
	} {
		if got := KindForHardwareType(hw); got != want {
			t.Errorf("KindForHardwareType(%q) = %q, want %q", hw, got, want)
		}
	}
}

func TestValidateCatchesBrokenStatus(t *testing.T) {
	good := func() *Status {
		st, err := Decode(readFixture(t, "v2-mixed.json"))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	tests := []struct {
		name string
		mut  func(st *Status)
		want string
	}{
		{"nil machines", func(st *Status) { st.Machines = nil }, "machines: nil"},
		{"bad schema", func(st *Status) { st.Schema = 9 }, "unknown schema"},
		{"legacy with generation", func(st *Status) { st.Schema = SchemaLegacy }, "legacy status with inventory identity"},
		{"empty id", func(st *Status) { st.Machines[2].DPUs[0].MatID = "" }, "machines[2] (mat_id d171a368-ea6a-45f5-9b66-6767052fe916).dpus[0].mat_id: empty"},
		{"duplicate", func(st *Status) { st.Machines[1].MatID = st.Machines[0].DPUs[1].MatID }, "duplicate mat_id, also at machines[0] (mat_id 922f3d9b"},
		{"top-level dpu", func(st *Status) { st.Machines[3].Kind = KindDPU }, "device_kind"},
		{"nested machine", func(st *Status) { st.Machines[0].DPUs[0].Kind = KindMachine }, "device_kind"},
		{"dpus under switch", func(st *Status) {
			st.Machines[3].DPUs = st.Machines[0].DPUs[:1]
			st.Machines[0].DPUs = st.Machines[0].DPUs[1:]
		}, "cannot have dpus"},
		{"zero port", func(st *Status) { st.Machines[1].BMC.IPMI.ListenPort = 0 }, "bmc.ipmi.listen_port"},
		{"bad ip", func(st *Status) { st.Machines[4].BMC.IP = "10.0.0.01" }, "bmc.ip"},
		{"v6 nvos", func(st *Status) { st.Machines[3].NvosIP = "::1" }, "nvos_ip"},
		{"invalid entry with a bad path", func(st *Status) {
			st.Invalid = []InvalidDevice{{Path: "hosts[0]", Reason: "x"}}
		}, `invalid[0].path: "hosts[0]" is not`},
		{"invalid entry nested twice", func(st *Status) {
			st.Invalid = []InvalidDevice{{Path: "machines[0].dpus[0].dpus[0]", Reason: "x"}}
		}, "invalid[0].path"},
		{"invalid entry with a leading zero", func(st *Status) {
			st.Invalid = []InvalidDevice{{Path: "machines[01]", Reason: "x"}}
		}, "invalid[0].path"},
		{"invalid entry without reason", func(st *Status) {
			st.Invalid = []InvalidDevice{{Path: "machines[9]"}}
		}, "invalid[0].reason: empty"},
		{"invalid entries out of body order", func(st *Status) {
			st.Invalid = []InvalidDevice{{Path: "machines[9].dpus[0]", Reason: "x"}, {Path: "machines[9]", Reason: "y"}}
		}, "invalid[1].path: machines[9] is not after machines[9].dpus[0]"},
		{"invalid entry with a valid device's mat_id", func(st *Status) {
			st.Invalid = []InvalidDevice{{Path: "machines[9]", MatID: st.Machines[0].MatID, Reason: "x"}}
		}, "is also the mat_id of the valid device at machines[0]"},
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("good status: %v", err)
	}
	ok := good()
	ok.Invalid = []InvalidDevice{{Path: "machines[9]", Reason: "x"}, {Path: "machines[9].dpus[0]", MatID: "m", Reason: "y"},
		{Path: "machines[10]", MatID: "m", Reason: "z"}}
	if err := ok.Validate(); err != nil {
		t.Errorf("status with well-formed Invalid entries: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := good()
			tt.mut(st)
			err := st.Validate()
			if err == nil || !errors.Is(err, ErrInvalidStatus) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want ErrInvalidStatus containing %q", err, tt.want)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	body := readFixture(b, "v2-mixed.json")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}
