package matsim

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/matbus/matbus/matclient"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func mustGenerate(t testing.TB, spec FleetSpec) *Fleet {
	t.Helper()
	f, err := Generate(spec)
	if err != nil {
		t.Fatalf("Generate(%+v): %v", spec, err)
	}
	return f
}

func TestGenerateCounts(t *testing.T) {
	tests := []struct {
		name string
		spec FleetSpec
		want matclient.Counts
	}{
		{"empty", FleetSpec{}, matclient.Counts{}},
		{"hosts only", FleetSpec{Hosts: 3}, matclient.Counts{Machines: 3, WithBMCIP: 3}},
		{"mixed", FleetSpec{Hosts: 4, DPUsPerHost: 2, Switches: 3, PowerShelves: 2},
			matclient.Counts{Machines: 4, DPUs: 8, Switches: 3, PowerShelves: 2, WithBMCIP: 17}},
		{"no hosts", FleetSpec{Switches: 1, PowerShelves: 1, DPUsPerHost: 4},
			matclient.Counts{Switches: 1, PowerShelves: 1, WithBMCIP: 2}},
		{"max dpus", FleetSpec{Hosts: 1, DPUsPerHost: MaxDPUsPerHost}, matclient.Counts{Machines: 1, DPUs: 16, WithBMCIP: 17}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustGenerate(t, tt.spec)
			if err := f.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			st := f.Status("e", 1)
			if got := st.Counts(); got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
			if f.Devices() != tt.want.Total() || f.BMCs() != tt.want.WithBMCIP {
				t.Errorf("Devices %d BMCs %d, want %d %d", f.Devices(), f.BMCs(), tt.want.Total(), tt.want.WithBMCIP)
			}
			if len(f.MatIDs()) != f.Devices() {
				t.Errorf("MatIDs %d", len(f.MatIDs()))
			}
			// Registry order: hosts, then switches, then power shelves.
			rank := map[matclient.DeviceKind]int{matclient.KindMachine: 0, matclient.KindSwitch: 1, matclient.KindPowerShelf: 2}
			for i := 1; i < len(f.Machines); i++ {
				if rank[f.Machines[i-1].Kind] > rank[f.Machines[i].Kind] {
					t.Errorf("machines[%d] %s after %s", i, f.Machines[i].Kind, f.Machines[i-1].Kind)
				}
			}
		})
	}
}

func TestGenerateDeterministic(t *testing.T) {
	spec := FleetSpec{Hosts: 20, DPUsPerHost: 2, Switches: 4, PowerShelves: 2, IPMI: true, SSH: true, Seed: 42}
	a, b := mustGenerate(t, spec), mustGenerate(t, spec)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same spec gave different fleets")
	}
	ja, err := a.Encode("e", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	jb, _ := b.Encode("e", 1, false)
	if !bytes.Equal(ja, jb) {
		t.Error("same fleet encoded differently")
	}
	// A clone is deep: changing it leaves the original alone.
	c := a.Clone()
	c.Machines[0].BMC.IPMI.ListenPort = 1
	c.Machines[0].DPUs[0].MatID = "x"
	c.Machines[0].InfinibandPorts[0].State = "down"
	if !reflect.DeepEqual(a, b) {
		t.Error("Clone shares memory with the original")
	}
}

func TestGenerateFleetsDoNotCollide(t *testing.T) {
	base := FleetSpec{Hosts: 50, DPUsPerHost: 2, Switches: 5, PowerShelves: 5, Seed: 1}
	otherSeed := base
	otherSeed.Seed = 2
	otherSubnet := base
	otherSubnet.BMCSubnet = "10.96.128.0/18"
	otherBoth := base
	otherBoth.Seed, otherBoth.BMCSubnet = 3, "10.97.0.0/18"

	fleets := map[string]*Fleet{}
	for name, spec := range map[string]FleetSpec{"base": base, "seed": otherSeed, "subnet": otherSubnet, "both": otherBoth} {
		fleets[name] = mustGenerate(t, spec)
	}
	ids := map[string]string{}
	inv := map[string]string{}
	for name, f := range fleets {
		for _, id := range f.MatIDs() {
			if prev, dup := ids[id]; dup {
				t.Errorf("mat_id %s in fleets %s and %s", id, prev, name)
			}
			ids[id] = name
		}
		if prev, dup := inv[f.InventoryID]; dup {
			t.Logf("inventory id %s shared by %s and %s", f.InventoryID, prev, name) // 16 bits: may collide
		}
		inv[f.InventoryID] = name
	}
	// Different subnets never share BMC IPs.
	ips := map[string]string{}
	for _, name := range []string{"base", "subnet", "both"} {
		walk(fleets[name].Machines, func(d *matclient.Device) {
			if prev, dup := ips[d.BMC.IP]; dup {
				t.Errorf("BMC IP %s in fleets %s and %s", d.BMC.IP, prev, name)
			}
			ips[d.BMC.IP] = name
		})
	}
}

// Fleets side by side with BMC subnets that do not overlap get NVOS IPs that
// collide neither with each other's nor with any BMC IP, whatever the low
// bits of their subnets (10.96.64.0/20 and 10.104.64.0/20 share them).
func TestGenerateNVOSIPsFollowTheBMCSubnet(t *testing.T) {
	specs := []FleetSpec{
		{Switches: 20, Hosts: 3, BMCSubnet: "10.96.64.0/20", Seed: 1},
		{Switches: 20, Hosts: 3, BMCSubnet: "10.104.64.0/20", Seed: 1},
		{Switches: 20, Hosts: 3, BMCSubnet: "10.96.80.0/20", Seed: 1},
		{Switches: 20, Hosts: 3, BMCSubnet: "10.97.64.0/20", Seed: 9},
	}
	owner := map[string]string{}
	claim := func(ip, who string) {
		if prev, dup := owner[ip]; dup {
			t.Errorf("IP %s is %s and %s", ip, prev, who)
		}
		owner[ip] = who
	}
	for _, spec := range specs {
		f := mustGenerate(t, spec)
		walk(f.Machines, func(d *matclient.Device) {
			claim(d.BMC.IP, spec.BMCSubnet+" BMC of "+d.MatID)
			if d.NvosIP != "" {
				claim(d.NvosIP, spec.BMCSubnet+" NVOS of "+d.MatID)
			}
		})
	}
	// The default subnet keeps its NVOS IPs where they always were.
	f := mustGenerate(t, FleetSpec{Switches: 1})
	if sw := f.Machines[0]; sw.BMC.IP != "10.96.64.1" || sw.NvosIP != "10.98.64.1" {
		t.Errorf("default fleet: switch BMC %s NVOS %s, want 10.96.64.1 and 10.98.64.1", sw.BMC.IP, sw.NvosIP)
	}
}

func TestGenerateNVOSSubnet(t *testing.T) {
	tests := []struct {
		name     string
		spec     FleetSpec
		nvos     string // the first switch's NVOS IP
		wantErr  string
		switches int
	}{
		{name: "default", spec: FleetSpec{BMCSubnet: "10.104.0.0/20"}, nvos: "10.106.0.1"},
		{name: "set", spec: FleetSpec{BMCSubnet: "10.104.0.0/20", NVOSSubnet: "172.20.16.0/20"}, nvos: "172.20.16.1"},
		{name: "set larger", spec: FleetSpec{BMCSubnet: "10.104.0.0/24", NVOSSubnet: "172.20.0.0/16"}, nvos: "172.20.0.1"},
		{name: "host bits masked", spec: FleetSpec{BMCSubnet: "10.104.0.0/24", NVOSSubnet: "172.20.0.7/24"}, nvos: "172.20.0.1"},
		{name: "smaller", spec: FleetSpec{BMCSubnet: "10.104.0.0/20", NVOSSubnet: "172.20.0.0/24"}, wantErr: "smaller than BMC subnet"},
		{name: "overlaps", spec: FleetSpec{BMCSubnet: "10.104.0.0/20", NVOSSubnet: "10.104.0.0/16"}, wantErr: "overlaps BMC subnet"},
		{name: "garbage", spec: FleetSpec{NVOSSubnet: "nvos"}, wantErr: "NVOS subnet \"nvos\" is not an IPv4 CIDR"},
		{name: "ipv6", spec: FleetSpec{NVOSSubnet: "fd00::/64"}, wantErr: "not an IPv4 CIDR"},
		{name: "default too large", spec: FleetSpec{BMCSubnet: "10.0.0.0/8"}, wantErr: "too large for the default NVOS subnet"},
		{name: "default past 255", spec: FleetSpec{BMCSubnet: "10.254.0.0/24"}, wantErr: "set the NVOS subnet"},
		{name: "no switches, no NVOS subnet needed", spec: FleetSpec{BMCSubnet: "10.0.0.0/8"}, switches: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Switches = 1
			if tt.switches < 0 {
				tt.spec.Switches, tt.spec.Hosts = 0, 1
			}
			f, err := Generate(tt.spec)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Generate = %v, want ErrInvalidSpec containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.switches < 0 {
				return
			}
			if got := f.Machines[0].NvosIP; got != tt.nvos {
				t.Errorf("NVOS IP %s, want %s", got, tt.nvos)
			}
		})
	}
}

func TestGenerateShapes(t *testing.T) {
	spec := FleetSpec{Hosts: 300, DPUsPerHost: 3, Switches: 10, PowerShelves: 10, IPMI: true, SSH: true, Seed: 7, BMCSubnet: "10.96.64.0/18"}
	f := mustGenerate(t, spec)
	prefix := netip.MustParsePrefix(spec.BMCSubnet)
	seenIDs, seenBMC, seenMachineIP, seenIPMI, seenDPUSSH := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[uint16]bool{}, map[uint16]bool{}
	wantNext := prefix.Addr().Next() // sequential from network+1
	walk(f.Machines, func(d *matclient.Device) {
		if !uuidV4.MatchString(d.MatID) {
			t.Errorf("mat_id %q is not a lower-case UUID v4", d.MatID)
		}
		if seenIDs[d.MatID] {
			t.Errorf("duplicate mat_id %s", d.MatID)
		}
		seenIDs[d.MatID] = true

		ip := netip.MustParseAddr(d.BMC.IP)
		if ip != wantNext {
			t.Errorf("%s BMC IP %s, want %s (sequential)", d.MatID, ip, wantNext)
		}
		wantNext = ip.Next()
		if !prefix.Contains(ip) || ip == prefix.Addr() || seenBMC[d.BMC.IP] {
			t.Errorf("BMC IP %s outside %s, network address or duplicate", ip, prefix)
		}
		seenBMC[d.BMC.IP] = true
		if d.BMC.Redfish != (matclient.Endpoint{ReachablePort: 443, ListenPort: 1266}) {
			t.Errorf("redfish %+v", d.BMC.Redfish)
		}
		switch d.Kind {
		case matclient.KindMachine, matclient.KindDPU:
			prefix := map[matclient.DeviceKind]string{matclient.KindMachine: "fm100ht", matclient.KindDPU: "fm100ds"}[d.Kind]
			if len(d.MachineID) != 59 || !strings.HasPrefix(d.MachineID, prefix) || d.DeviceID != d.MachineID {
				t.Errorf("%s machine_id %q device_id %q", d.Kind, d.MachineID, d.DeviceID)
			}
			if seenMachineIP[d.MachineIP] || !netip.MustParsePrefix("10.100.0.0/16").Contains(netip.MustParseAddr(d.MachineIP)) {
				t.Errorf("machine IP %s duplicate or outside 10.100/16", d.MachineIP)
			}
			seenMachineIP[d.MachineIP] = true
		default:
			if d.MachineID != "" || d.DeviceID != d.MatID || d.MachineIP != "" {
				t.Errorf("%s has machine fields: %+v", d.Kind, d)
			}
			if d.Kind != matclient.KindForHardwareType(d.HardwareType) {
				t.Errorf("%s hardware %s", d.Kind, d.HardwareType)
			}
		}
		switch d.Kind {
		case matclient.KindMachine:
			if d.BMC.IPMI == nil || d.BMC.IPMI.ReachablePort != d.BMC.IPMI.ListenPort || d.BMC.IPMI.ListenPort < 16000 || seenIPMI[d.BMC.IPMI.ListenPort] {
				t.Errorf("host IPMI %+v: want unique dynamic port", d.BMC.IPMI)
			} else {
				seenIPMI[d.BMC.IPMI.ListenPort] = true
			}
			if d.BMC.SSH == nil || *d.BMC.SSH != (matclient.Endpoint{ReachablePort: 2222, ListenPort: 2222}) {
				t.Errorf("host SSH %+v", d.BMC.SSH)
			}
			if d.HardwareType == "" || matclient.KindForHardwareType(d.HardwareType) != matclient.KindMachine {
				t.Errorf("host hardware %q", d.HardwareType)
			}
		case matclient.KindDPU:
			if d.BMC.IPMI != nil || d.HardwareType != "" {
				t.Errorf("DPU with IPMI %+v or hardware %q", d.BMC.IPMI, d.HardwareType)
			}
			if d.BMC.SSH == nil || d.BMC.SSH.ListenPort < 34000 || seenDPUSSH[d.BMC.SSH.ListenPort] {
				t.Errorf("DPU SSH %+v: want unique own port", d.BMC.SSH)
			} else {
				seenDPUSSH[d.BMC.SSH.ListenPort] = true
			}
		case matclient.KindSwitch:
			if !netip.MustParsePrefix("10.98.0.0/16").Contains(netip.MustParseAddr(d.NvosIP)) {
				t.Errorf("switch NVOS IP %q", d.NvosIP)
			}
		}
	})
	if len(seenIDs) != 300*4+20 {
		t.Errorf("%d devices", len(seenIDs))
	}

	// Without IPMI and SSH there are no such endpoints.
	plain := mustGenerate(t, FleetSpec{Hosts: 2, DPUsPerHost: 1, Seed: 7})
	walk(plain.Machines, func(d *matclient.Device) {
		if d.BMC.IPMI != nil || d.BMC.SSH != nil {
			t.Errorf("%s has IPMI/SSH without the spec asking", d.MatID)
		}
	})
}

func TestGenerateSubnets(t *testing.T) {
	tests := []struct {
		name    string
		spec    FleetSpec
		first   string // first BMC IP; "" = error
		wantErr string
	}{
		{name: "default subnet", spec: FleetSpec{Hosts: 1}, first: "10.96.64.1"},
		{name: "exactly full /29", spec: FleetSpec{Hosts: 2, DPUsPerHost: 2, BMCSubnet: "192.0.2.8/29"}, first: "192.0.2.9"},
		{name: "over full /29", spec: FleetSpec{Hosts: 7, BMCSubnet: "192.0.2.8/29"}, wantErr: "do not fit"},
		{name: "host bits masked", spec: FleetSpec{Hosts: 1, BMCSubnet: "10.1.2.3/24"}, first: "10.1.2.1"},
		{name: "/31", spec: FleetSpec{Hosts: 1, BMCSubnet: "10.0.0.0/31"}, first: "10.0.0.1"},
		{name: "/31 too small", spec: FleetSpec{Hosts: 2, BMCSubnet: "10.0.0.0/31"}, wantErr: "do not fit"},
		{name: "/32", spec: FleetSpec{Hosts: 1, BMCSubnet: "10.0.0.1/32"}, wantErr: "do not fit"},
		{name: "/32 empty fleet", spec: FleetSpec{BMCSubnet: "10.0.0.1/32"}},
		{name: "ipv6", spec: FleetSpec{Hosts: 1, BMCSubnet: "fd00::/64"}, wantErr: "not an IPv4 CIDR"},
		{name: "garbage", spec: FleetSpec{Hosts: 1, BMCSubnet: "10.0.0.0"}, wantErr: "not an IPv4 CIDR"},
		{name: "negative", spec: FleetSpec{Hosts: -1}, wantErr: "-1 hosts: a device count must be 0 or more"},
		{name: "too many dpus", spec: FleetSpec{Hosts: 1, DPUsPerHost: 17}, wantErr: "DPUs per host"},
		{name: "ipmi ports overflow", spec: FleetSpec{Hosts: 50000, IPMI: true, BMCSubnet: "10.0.0.0/8"}, wantErr: "IPMI port range"},
		{name: "ssh ports overflow", spec: FleetSpec{Hosts: 2100, DPUsPerHost: 16, SSH: true, BMCSubnet: "10.0.0.0/8"}, wantErr: "SSH port range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Generate(tt.spec)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Generate = %v, want ErrInvalidSpec containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.first == "" {
				if f.Devices() != 0 {
					t.Errorf("devices %d", f.Devices())
				}
				return
			}
			if got := f.Machines[0].BMC.IP; got != tt.first {
				t.Errorf("first BMC IP %s, want %s", got, tt.first)
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 3, DPUsPerHost: 1, Switches: 1, PowerShelves: 1, Seed: 5})
	fp := fingerprint(f.Machines)
	same := []func(g *Fleet){
		func(g *Fleet) { g.Machines[0].BMC.IP = "10.9.9.9" },
		func(g *Fleet) { g.Machines[0].APIState = "Failed/x"; g.Machines[1].MachineIP = "" },
		func(g *Fleet) { g.Machines[0].DPUs = nil },
		func(g *Fleet) { g.Machines = g.Machines[:4] }, // drop the power shelf
		func(g *Fleet) { g.Machines[0], g.Machines[1] = g.Machines[1], g.Machines[0] },
	}
	for i, mut := range same {
		g := f.Clone()
		mut(g)
		if fingerprint(g.Machines) != fp {
			t.Errorf("change %d altered the fingerprint", i)
		}
	}
	differ := []func(g *Fleet){
		func(g *Fleet) { g.Machines = g.Machines[1:] },
		func(g *Fleet) { g.Machines[0].MachineID = "fm100hx" },
		func(g *Fleet) { g.Machines[1].HardwareType = "generic_ami" },
		func(g *Fleet) { g.Machines[0].InfinibandPorts[0].State = "down" },
		func(g *Fleet) { g.Machines[0].MatID = "new" },
	}
	for i, mut := range differ {
		g := f.Clone()
		mut(g)
		if fingerprint(g.Machines) == fp {
			t.Errorf("change %d left the fingerprint alone", i)
		}
	}
}

func TestEncodeShapes(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 2, PowerShelves: 1, IPMI: true, SSH: true, Seed: 9})
	v2, err := f.Encode("2026-08-21T19:04:05.417203981Z", 4, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"inventory_id":"mat-02:`, `"epoch_id":"2026-08-21T19:04:05.417203981Z","generation":4,"machines":[{"mat_id":"`,
		`"device_kind":"switch"`, `"device_kind":"power_shelf"`, `"nvos_ip":"10.98.`, `"infiniband_ports":[{"guid":"0002c903`, `"ssh":{"reachable_port":2222,"listen_port":2222}`, `"dpus":[]`} {
		if !strings.Contains(string(v2), want) {
			t.Errorf("v2 body lacks %s", want)
		}
	}
	legacy, err := f.Encode("ignored", 4, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(legacy), `{"machines":[{"mat_id":"`) {
		t.Errorf("legacy body starts %.40s", legacy)
	}
	for _, absent := range []string{"inventory_id", "epoch_id", "generation", "device_kind", "device_id", "nvos_ip", "infiniband_ports", `"ssh"`} {
		if strings.Contains(string(legacy), absent) {
			t.Errorf("legacy body has %s", absent)
		}
	}
	empty, _ := (&Fleet{InventoryID: "mat-x"}).Encode("e", 1, false)
	if !strings.Contains(string(empty), `"machines":[]`) {
		t.Errorf("empty fleet body %s", empty)
	}
}

// TestFleetNVOSIPs counts the switches with an NVOS IP.
func TestFleetNVOSIPs(t *testing.T) {
	f, err := Generate(FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 3, PowerShelves: 1, BMCSubnet: "10.96.64.0/24", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.NVOSIPs(); n != 3 {
		t.Errorf("NVOSIPs = %d, want 3", n)
	}
	f.Machines[len(f.Machines)-2].NvosIP = "" // a switch (power shelf is last)
	f.Machines[0].NvosIP = "10.98.0.9"        // a host's does not count
	if n := f.NVOSIPs(); n != 2 {
		t.Errorf("NVOSIPs = %d, want 2", n)
	}
}
