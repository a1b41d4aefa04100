package discovery

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

// TestPublisherRunLeavesNoGoroutine: once Publisher.Run returns, every
// goroutine it started has ended — the scheduler's, the state writer's
// and those that publish error events (here: a failing instance taken out
// of rotation, reported while the run ends).
func TestPublisherRunLeavesNoGoroutine(t *testing.T) {
	b := newBus(t)
	// The server's goroutines of the streams and the bucket are not the
	// publisher's: make them first.
	ctx, cancel := context.WithCancel(context.Background())
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsureState(ctx); err != nil {
		t.Fatal(err)
	}
	leak := append(testenv.LeakOptions(), goleak.IgnoreCurrent())
	src, _ := NewStatic("t", []StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a:1266"}})
	rep := events.NewReporter(b, nil, "test", time.Millisecond)
	p := NewPublisher(b, src, PublisherConfig{SyncInterval: time.Hour,
		Scheduler: SchedulerConfig{PollInterval: 20 * time.Millisecond, FailuresBeforeBackoff: 1}}, rep, nil)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	eventually(t, "present", present(b, "ns.mat-0"))
	// A failed fetch takes the instance out of rotation: the scheduler
	// reports it on a goroutine of its own.
	var job string
	eventually(t, "a sync job out", func() bool {
		p.sched.mu.Lock()
		defer p.sched.mu.Unlock()
		e := p.sched.inst["ns.mat-0"]
		if e != nil && e.inflight {
			job = e.jobID
		}
		return job != ""
	})
	p.sched.Result(events.SyncResult{Key: "ns.mat-0", JobID: job, Outcome: events.OutcomeFetchFailed, Transient: true, Error: "HTTP 500"})
	if st := p.sched.Stats(); st.OutOfRotation != 1 {
		t.Fatalf("out of rotation: %d, want 1", st.OutOfRotation)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, leak...)
}
