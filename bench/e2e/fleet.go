package main

import (
	"fmt"
	"math/bits"
	"net/netip"
	"sort"

	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// growBMCs is how many BMCs the grow and shrink rows add and remove.
const growBMCs = 101

// ipBlocks hands out aligned IPv4 blocks from 10.100.0.0 up to the end of
// kubelocal's service range 10.96.0.0/12, so that every fleet has its own
// BMC IPs inside the range (cluster IPs are cluster-wide).
type ipBlocks struct{ next uint32 }

const (
	blocksStart = 10<<24 | 100<<16 // 10.100.0.0
	blocksEnd   = 10<<24 | 112<<16 // first address after 10.111.255.255
)

// block returns the smallest aligned CIDR with room for n devices (network
// and broadcast addresses skipped).
func (b *ipBlocks) block(n int) (string, error) {
	if b.next == 0 {
		b.next = blocksStart
	}
	hostBits := bits.Len32(uint32(n + 1)) // 2^hostBits >= n+2
	hostBits = max(hostBits, 2)
	size := uint32(1) << hostBits
	start := (b.next + size - 1) &^ (size - 1)
	if start+size > blocksEnd || start < b.next {
		return "", fmt.Errorf("no room for %d more BMC IPs in 10.100.0.0-10.111.255.255", n)
	}
	b.next = start + size
	a := netip.AddrFrom4([4]byte{byte(start >> 24), byte(start >> 16), byte(start >> 8), byte(start)})
	return netip.PrefixFrom(a, 32-hostBits).String(), nil
}

// fleets are the devices of one run: a base fleet per simulator, the 101
// BMCs the grow row adds to simulator 0, and the single-BMC devices the
// reaction row adds.
type fleets struct {
	base         []*matsim.Fleet
	grow         []matclient.Device // top-level devices, 101 BMCs with their DPUs
	extraHosts   []matclient.Device // hosts without DPUs, one BMC each
	extraShelves []matclient.Device // power shelves, one BMC each
}

// splitSizes divides n BMCs over s simulators (the first get one more when
// s does not divide n).
func splitSizes(n, s int) []int {
	out := make([]int, s)
	for i := range out {
		out[i] = n / s
		if i < n%s {
			out[i]++
		}
	}
	return out
}

// specFor is a fleet of exactly bmcs BMCs shaped like a MAT deployment:
// hosts with one DPU each, and about 5 % switches and 5 % power shelves.
func specFor(bmcs int) matsim.FleetSpec {
	sw, sh := bmcs/20, bmcs/20
	r := bmcs - sw - sh
	if r%2 == 1 {
		sh++
	}
	return matsim.FleetSpec{Hosts: r / 2, DPUsPerHost: 1, Switches: sw, PowerShelves: sh, IPMI: true}
}

// makeFleets generates the fleets of a run for the given BMCs per
// simulator and reactions (each reaction may add one power shelf).
func makeFleets(sizes []int, reactions int, seed int64) (*fleets, error) {
	var ips ipBlocks
	f := &fleets{}
	for i, n := range sizes {
		spec := specFor(n)
		if spec.Hosts+spec.Switches+spec.PowerShelves+spec.Hosts*spec.DPUsPerHost != n {
			return nil, fmt.Errorf("fleet of %d BMCs: spec %+v does not add up", n, spec)
		}
		subnet, err := ips.block(n)
		if err != nil {
			return nil, err
		}
		spec.BMCSubnet, spec.Seed = subnet, seed+int64(i)
		fl, err := matsim.Generate(spec)
		if err != nil {
			return nil, err
		}
		// BMC Services only: a run's size is its BMCs.
		for j := range fl.Machines {
			fl.Machines[j].NvosIP = ""
		}
		f.base = append(f.base, fl)
	}
	subnet, err := ips.block(growBMCs)
	if err != nil {
		return nil, err
	}
	g, err := matsim.Generate(matsim.FleetSpec{Hosts: growBMCs / 2, DPUsPerHost: 1, PowerShelves: growBMCs % 2,
		IPMI: true, BMCSubnet: subnet, Seed: seed + 1000})
	if err != nil {
		return nil, err
	}
	f.grow = g.Machines
	adds := reactions/2 + 1
	subnet, err = ips.block(2 * adds)
	if err != nil {
		return nil, err
	}
	x, err := matsim.Generate(matsim.FleetSpec{Hosts: adds, PowerShelves: adds, IPMI: true, BMCSubnet: subnet, Seed: seed + 2000})
	if err != nil {
		return nil, err
	}
	f.extraHosts, f.extraShelves = x.Machines[:adds], x.Machines[adds:]
	return f, nil
}

// with returns a copy of fl with extra top-level devices appended.
func with(fl *matsim.Fleet, extra ...matclient.Device) *matsim.Fleet {
	c := fl.Clone()
	c.Machines = append(c.Machines, (&matsim.Fleet{Machines: extra}).Clone().Machines...)
	return c
}

// serviceNames are the names of the Services the devices ask for (every
// device with a BMC IP, DPUs included), sorted.
func serviceNames(devs []matclient.Device) []string {
	var out []string
	var walk func(ds []matclient.Device)
	walk = func(ds []matclient.Device) {
		for i := range ds {
			if ds[i].BMC.IP != "" {
				out = append(out, serviceName(&ds[i]))
			}
			walk(ds[i].DPUs)
		}
	}
	walk(devs)
	sort.Strings(out)
	return out
}

func serviceName(d *matclient.Device) string {
	return plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)
}

// leaves returns the devices of fl that can be removed one BMC at a time
// (DPUs, and top-level devices without DPUs), sorted by mat_id.
func leaves(fl *matsim.Fleet) []matclient.Device {
	var out []matclient.Device
	for i := range fl.Machines {
		m := &fl.Machines[i]
		if len(m.DPUs) == 0 && m.BMC.IP != "" {
			out = append(out, *m)
		}
		for j := range m.DPUs {
			if m.DPUs[j].BMC.IP != "" {
				out = append(out, m.DPUs[j])
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MatID < out[j].MatID })
	return out
}
