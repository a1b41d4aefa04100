package devenv

import (
	"fmt"
	"net/netip"

	"github.com/matbus/matbus/matsim"
)

// Fleet is one simulator's generated fleet and the BMC subnet it was
// given.
type Fleet struct {
	Fleet     *matsim.Fleet
	BMCSubnet string
}

// Fleets generates n fleets of spec, before anything starts (so a bad
// fleet flag is a usage error, not a failure after the API server is up):
// fleet i has seed spec.Seed+i and the i-th block of spec.BMCSubnet's
// size after it (and of spec.NVOSSubnet's, when set). The errors name the
// flags to change.
func Fleets(spec matsim.FleetSpec, n int) ([]Fleet, error) {
	base, err := netip.ParsePrefix(spec.BMCSubnet)
	if err != nil || !base.Addr().Is4() {
		return nil, fmt.Errorf("--bmc-subnet %q: want an IPv4 CIDR such as 10.96.64.0/20", spec.BMCSubnet)
	}
	var nvosBase netip.Prefix
	if spec.NVOSSubnet != "" {
		if nvosBase, err = netip.ParsePrefix(spec.NVOSSubnet); err != nil || !nvosBase.Addr().Is4() {
			return nil, fmt.Errorf("--nvos-subnet %q: want an IPv4 CIDR such as 10.98.64.0/20", spec.NVOSSubnet)
		}
	}
	var fleets []Fleet
	for i := 0; i < n; i++ {
		s := spec
		s.Seed = spec.Seed + int64(i)
		s.BMCSubnet = nthSubnet(base, i).String()
		if spec.NVOSSubnet != "" {
			s.NVOSSubnet = nthSubnet(nvosBase, i).String()
		}
		fleet, err := matsim.Generate(s)
		if err != nil {
			return nil, fmt.Errorf("fleet %d (--hosts, --dpus-per-host, --switches, --power-shelves, --bmc-subnet, --nvos-subnet): %v", i, err)
		}
		fleets = append(fleets, Fleet{Fleet: fleet, BMCSubnet: s.BMCSubnet})
	}
	return fleets, nil
}

// nthSubnet returns the i-th block of base's size after base (a /20 base
// gives 10.96.64.0/20, 10.96.80.0/20, ...).
func nthSubnet(base netip.Prefix, i int) netip.Prefix {
	a := base.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i) << (32 - base.Bits())
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), base.Bits())
}
