package worker

import (
	"context"
	"net/netip"
	"testing"
)

func TestClassifierOutsideRange(t *testing.T) {
	c := Classifier{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	for _, tc := range []struct {
		c    Classifier
		ip   string
		want bool
	}{
		{c, "10.96.64.10", false},
		{c, "10.111.255.254", false},
		{c, "10.112.0.1", true},
		{c, "192.0.2.21", true},
		{c, "", false},
		{c, "None", false},
		{Classifier{}, "192.0.2.21", false}, // range unknown: never claimed outside
	} {
		if got := tc.c.OutsideRange(context.Background(), tc.ip); got != tc.want {
			t.Errorf("OutsideRange(%q) with %v = %v, want %v", tc.ip, tc.c.ServiceCIDRs, got, tc.want)
		}
	}
}
