package main

import (
	"os/exec"
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
