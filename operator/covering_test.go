package operator

import (
	"net/netip"
	"slices"
	"testing"
)

func TestCoveringPrefixes(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []netip.Addr
		want []string
	}{
		{"none", nil, nil},
		{"one address", addrs("10.200.0.7"), []string{"10.200.0.7/32"}},
		{"a BMC and an NVOS network", addrs("10.200.0.1", "10.202.0.1", "10.200.0.128", "10.202.0.64", "10.200.0.1"),
			[]string{"10.200.0.0/24", "10.202.0.0/25"}},
		{"spread over a /20", addrs("10.104.0.1", "10.104.15.250", "10.104.7.7"), []string{"10.104.0.0/20"}},
		{"a group is at most a /16", addrs("10.1.0.1", "10.2.0.1"), []string{"10.1.0.1/32", "10.2.0.1/32"}},
		{"IPv6 and a mapped IPv4", addrs("fd00:1::10", "fd00:1::1:5", "::ffff:10.9.0.1"), []string{"10.9.0.1/32", "fd00:1::/111"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range CoveringPrefixes(tc.in) {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("CoveringPrefixes = %v, want %v", got, tc.want)
			}
			for _, a := range tc.in {
				n := 0
				for _, p := range CoveringPrefixes(tc.in) {
					if p.Contains(a.Unmap()) {
						n++
					}
				}
				if n != 1 {
					t.Errorf("%s lies in %d returned prefixes, want 1", a, n)
				}
			}
		})
	}
}
