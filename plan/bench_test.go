package plan

import (
	"fmt"
	"testing"

	"github.com/matbus/matbus/matclient"
)

// fleet builds a status of n devices by hand: hosts with two DPUs each
// (three quarters of the devices), switches and power shelves; shift moves
// the BMC IP of every tenth host and changes its power state.
func fleet(n int, shift bool) *matclient.Status {
	st := &matclient.Status{Schema: matclient.SchemaV2, InventoryID: "mat-02:01:00:00:00:00", Generation: 1}
	ip := 0
	nextIP := func() string { ip++; return fmt.Sprintf("10.96.%d.%d", 64+ip/250, ip%250+1) }
	dev := func(kind matclient.DeviceKind, id string) matclient.Device {
		return matclient.Device{
			MatID: id, Kind: kind, DeviceID: id, APIState: "Ready", PowerState: "On",
			BMC: matclient.BMC{IP: nextIP(), Redfish: matclient.Endpoint{ReachablePort: 443, ListenPort: 1266},
				SSH: &matclient.Endpoint{ReachablePort: 2222, ListenPort: 2222}},
		}
	}
	hosts := n * 3 / 4 / 3
	for h := range hosts {
		d := dev(matclient.KindMachine, fmt.Sprintf("%08x-0000-4000-8000-%012x", h, h))
		d.MachineID = fmt.Sprintf("fm100h%053d", h)
		d.HardwareType = "wiwynn_gb200_nvl"
		d.BMC.IPMI = &matclient.Endpoint{ReachablePort: uint16(16000 + h%1000), ListenPort: uint16(16000 + h%1000)}
		if shift && h%10 == 0 {
			d.BMC.IP = fmt.Sprintf("10.96.120.%d", h/10%250+1)
			d.PowerState = "Off"
		}
		for k := range 2 {
			d.DPUs = append(d.DPUs, dev(matclient.KindDPU, fmt.Sprintf("%08x-0000-4000-9000-%012x", h, k)))
		}
		st.Machines = append(st.Machines, d)
	}
	for i := 0; len(st.Machines)+2*hosts < n; i++ {
		kind := matclient.KindSwitch
		if i%2 == 1 {
			kind = matclient.KindPowerShelf
		}
		st.Machines = append(st.Machines, dev(kind, fmt.Sprintf("%08x-0000-4000-a000-%012x", i, i)))
	}
	return st
}

// BenchmarkBuildDiff: one sync of a 2,000-device instance against its
// existing Services, with a tenth of the hosts changed (Recreate in
// cluster-ip mode, Update in external-ip mode).
func BenchmarkBuildDiff(b *testing.B) {
	for _, mode := range []IPMode{IPModeClusterIP, IPModeExternalIP} {
		b.Run(string(mode), func(b *testing.B) {
			opts := testOptions(mode)
			inst := testInstance()
			old := fleet(2000, false)
			n := 0
			old.Walk(func(*matclient.Device, *matclient.Device) { n++ })
			if n != 2000 {
				b.Fatalf("fleet has %d devices", n)
			}
			api := newFakeAPI(b)
			api.apply(Diff(Build(inst, old, opts), nil, opts))
			existing := api.list()
			st := fleet(2000, true)
			b.ReportAllocs()
			b.ResetTimer()
			var p Plan
			for b.Loop() {
				p = Diff(Build(inst, st, opts), existing, opts)
			}
			b.StopTimer()
			if len(p.Update)+len(p.Recreate) != 50 || len(p.Create)+len(p.Delete) != 0 {
				b.Fatalf("unexpected plan: %d updates, %d recreates, %d creates, %d deletes",
					len(p.Update), len(p.Recreate), len(p.Create), len(p.Delete))
			}
		})
	}
}
