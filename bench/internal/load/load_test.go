package load

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestSampleCPUCountsTheHarness(t *testing.T) {
	s, err := SampleCPU()
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	// Busy until this process used 300 ms of CPU by its own count (not 300
	// ms of wall time: on a loaded machine that may be far less CPU), at
	// most 10 s.
	cpu0, start := ownCPU(t), time.Now()
	for x := 0; ownCPU(t)-cpu0 < 300*time.Millisecond && time.Since(start) < 10*time.Second; x++ {
		for range 10000 {
			_ = x * x
		}
	}
	used := (ownCPU(t) - cpu0).Seconds()
	u := s.Since(time.Since(start).Seconds())
	if u == nil || u.ByProg["harness"] < 0.8*used {
		t.Fatalf("CPU of a busy loop (%.2f s by getrusage) not counted as the harness's: %v", used, u)
	}
	if u.Busy < u.ByProg["harness"]-0.05 {
		t.Fatalf("machine busy %.2f s below the harness's own %.2f s", u.Busy, u.ByProg["harness"])
	}
}

// ownCPU is this process's user and system CPU time so far.
func ownCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestInParallel(t *testing.T) {
	var inFlight, peak atomic.Int64
	seen := make([]atomic.Bool, 20)
	r := InParallel(context.Background(), 3, 20, func(_ context.Context, i int) error {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		inFlight.Add(-1)
		seen[i].Store(true)
		if i%5 == 0 {
			return errors.New("odd one")
		}
		return nil
	})
	if r.Calls != 20 || r.Failed != 4 || r.TimedOut {
		t.Errorf("got %+v, want 20 calls, 4 failed", r)
	}
	if peak.Load() > 3 {
		t.Errorf("%d calls in flight, limit 3", peak.Load())
	}
	for i := range seen {
		if !seen[i].Load() {
			t.Errorf("call %d not made", i)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := InParallel(ctx, 2, 5, func(context.Context, int) error { return nil }); r.Failed != 5 || !r.TimedOut {
		t.Errorf("ended context: got %+v, want all 5 failed", r)
	}
}
