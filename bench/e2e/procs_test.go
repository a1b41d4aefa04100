package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for a matbus process: with
// E2E_TEST_BURN set to a duration it burns that much CPU (by its own
// count), prints "burnt" and waits to be stopped (a minute at most).
func TestMain(m *testing.M) {
	if d, err := time.ParseDuration(os.Getenv("E2E_TEST_BURN")); err == nil {
		for x := 0; ownCPU() < d; x++ {
			for range 10000 {
				_ = x * x
			}
		}
		fmt.Println("burnt")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return time.Hour
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A matbus process counts as matbus in the CPU rows whatever its binary
// is called (--matbus /tmp/matbus-now runs as "matbus-now"), and only
// while it runs.
func TestCPUOfMatbusByRole(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "matbus-now")
	if err := os.Symlink(exe, bin); err != nil {
		t.Skip(err)
	}
	t.Setenv("E2E_TEST_BURN", "300ms")
	b := &bench{cfg: &config{Matbus: bin}}
	s0, err := b.sampleCPU()
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	p, err := b.startMatbus(ctx, dir, "worker-0", "worker")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	pid := p.cmd.Process.Pid
	for p.CountLines("burnt") == 0 {
		if p.Exited() || ctx.Err() != nil {
			t.Fatalf("the stand-in did not burn its CPU: %v\n%s", p.waitErr, p.Tail(10))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := b.roles.name(pid); got != roleMatbus {
		t.Fatalf("role of the running process = %q, want %q", got, roleMatbus)
	}
	u := s0.Since(time.Since(start).Seconds())
	if u == nil || u.ByProg[roleMatbus] < 0.2 {
		t.Fatalf("300 ms of CPU of %s not counted as matbus's: %v", bin, u)
	}
	if v, ok := u.ByProg["matbus-now"]; ok {
		t.Errorf("%.2f s counted under the binary's file name as well: %v", v, u)
	}
	p.Stop()
	for deadline := time.Now().Add(5 * time.Second); b.roles.name(pid) != ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still named %q after its process ended", pid, b.roles.name(pid))
		}
	}
}
