package main

import (
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// pinAllThreads moves every thread of a running process to the CPUs given,
// and newPinPlan splits the allowed CPUs into two non-empty halves.
func TestPinAllThreads(t *testing.T) {
	pp, err := newPinPlan()
	if err != nil {
		t.Skipf("no split on this machine: %v", err)
	}
	if len(pp.Control) == 0 || len(pp.Rest) == 0 || pp.Control[len(pp.Control)-1] >= pp.Rest[0] {
		t.Fatalf("split %+v: want two non-empty, ordered halves", pp)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := pinAllThreads(cmd.Process.Pid, pp.Rest); err != nil {
		t.Fatal(err)
	}
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(cmd.Process.Pid, &got); err != nil {
		t.Fatal(err)
	}
	if got.Count() != len(pp.Rest) {
		t.Fatalf("affinity has %d CPUs, want %v", got.Count(), pp.Rest)
	}
	for _, c := range pp.Rest {
		if !got.IsSet(c) {
			t.Errorf("CPU %d not in the affinity", c)
		}
	}
}

// Pinning is the default; --pin-control-plane=false, or fewer than 2
// CPUs, runs unpinned, and the first line of the table says which and why.
func TestPinChoice(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--pin-control-plane=false"}, false}} {
		cfg, err := parseFlags(tc.args, &strings.Builder{})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.PinControl != tc.want {
			t.Errorf("%q: PinControl = %v, want %v", tc.args, cfg.PinControl, tc.want)
		}
	}
	pp, why, err := choosePin(false)
	if pp != nil || why != "--pin-control-plane=false" || err != nil {
		t.Errorf("choosePin(false) = %v, %q, %v; want unpinned by the flag", pp, why, err)
	}
	pp, why, err = choosePin(true)
	switch {
	case err != nil:
		t.Skipf("no affinity mask: %v", err)
	case pp == nil && !strings.Contains(why, "at least 2 CPUs"):
		t.Errorf("choosePin(true) unpinned for %q, want the CPU count as the reason", why)
	case pp != nil && why != "":
		t.Errorf("choosePin(true) pinned with a reason not to: %q", why)
	}

	cfg, err := parseFlags([]string{"--services", "10", "--workers", "1"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pin                *pinPlan
		unpinned           string
		heading, firstItem string
	}{
		{&pinPlan{Control: []int{0}, Rest: []int{1}}, "",
			"## matbus end to end: 10 Services, 5 simulators × 2 BMCs, control plane pinned\n",
			"- CPUs: control plane pinned: kube-apiserver and etcd on CPU [0], the harness, nats-server, matbus and the simulators on CPU [1]\n"},
		{nil, "pinning needs at least 2 CPUs, this process may use 1",
			"## matbus end to end: 10 Services, 5 simulators × 2 BMCs, control plane unpinned\n",
			"- CPUs: control plane unpinned (pinning needs at least 2 CPUs, this process may use 1): every process may run on any CPU\n"},
	} {
		r := &result{Config: cfg, Pinned: tc.pin, Unpinned: tc.unpinned}
		lines := strings.SplitAfter(r.table(), "\n")
		if lines[0] != tc.heading || lines[2] != tc.firstItem {
			t.Errorf("table begins\n%s%s%s, want\n%s\n%s", lines[0], lines[1], lines[2], tc.heading, tc.firstItem)
		}
	}
}
