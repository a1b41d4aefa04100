package main

import (
	"strings"
	"testing"
)

func TestParseVariants(t *testing.T) {
	vs, err := parseVariants("floor, clients3,paced:330,watchers:4", 50)
	if err != nil {
		t.Fatal(err)
	}
	want := []variant{
		{Name: "floor", Clients: 1, InFlight: 50},
		{Name: "clients3", Clients: 3, InFlight: 96, Protobuf: true},
		{Name: "paced:330", Clients: 3, InFlight: 96, Protobuf: true, Rate: 330},
		{Name: "watchers:4", Clients: 1, InFlight: 50, Watchers: 4},
	}
	if len(vs) != len(want) {
		t.Fatalf("got %+v", vs)
	}
	for i := range want {
		if vs[i] != want[i] {
			t.Errorf("variant %d = %+v, want %+v", i, vs[i], want[i])
		}
	}
	for _, bad := range []string{"", "paced", "paced:0", "paced:x", "watchers:-1", "floor:3", "fast", "floor,,clients3"} {
		if _, err := parseVariants(bad, 50); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--services", "0"}, &strings.Builder{}); err == nil {
		t.Error("--services 0 accepted")
	}
	if _, err := parseFlags([]string{"--repeat", "0"}, &strings.Builder{}); err == nil {
		t.Error("--repeat 0 accepted")
	}
	if _, err := parseFlags([]string{"x"}, &strings.Builder{}); err == nil {
		t.Error("positional argument accepted")
	}
	c, err := parseFlags(nil, &strings.Builder{})
	if err != nil || c.services != 2000 || len(c.variants) != 4 {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}

func TestServicesHaveDistinctIPs(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range services("ns", 60000) {
		ip := s.Spec.ClusterIP
		if seen[ip] {
			t.Fatalf("IP %s twice", ip)
		}
		seen[ip] = true
	}
}
