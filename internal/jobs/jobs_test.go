package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"

	"github.com/matbus/matbus/events"
)

// rig is a work-queue stream "J" (subjects j.<ns>.<name>) with a durable
// consumer, on an embedded JetStream, and what Run reported.
type rig struct {
	t    *testing.T
	js   jetstream.JetStream
	ctx  context.Context
	cons jetstream.Consumer
	opts Options

	mu       sync.Mutex
	outcomes map[Outcome]int
	reports  []events.Error
}

func newRig(t *testing.T, ackWait time.Duration, maxDeliver, slots int) *rig {
	t.Helper()
	js := testenv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "J", Subjects: []string{"j.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: maxDeliver})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, js: js, ctx: ctx, cons: cons, outcomes: map[Outcome]int{}}
	r.opts = Options{Name: "c", Slots: slots, AckWait: ackWait, MaxDeliver: maxDeliver,
		Attach: func(context.Context) (jetstream.Consumer, error) { return cons, nil },
		Report: func(_ context.Context, e events.Error) { r.mu.Lock(); r.reports = append(r.reports, e); r.mu.Unlock() },
		Log:    slog.New(slog.DiscardHandler)}
	return r
}

// publish publishes a job of type typ on subject (raw data when data is a []byte).
func (r *rig) publish(subject string, typ events.Type, data any) {
	r.t.Helper()
	body, ok := data.([]byte)
	if !ok {
		var err error
		if body, err = events.Encode(typ, subject, "test", time.Now(), data); err != nil {
			r.t.Fatal(err)
		}
	}
	if _, err := r.js.Publish(r.ctx, subject, body); err != nil {
		r.t.Fatal(err)
	}
}

// run runs Run with h under ctx and hard; the returned wait waits for
// Run to return.
func (r *rig) run(ctx, hard context.Context, h Handler) (wait func()) {
	o := r.opts
	o.Ended = func(_ events.Type, oc Outcome, _ time.Duration) {
		r.mu.Lock()
		r.outcomes[oc]++
		r.mu.Unlock()
	}
	done := make(chan struct{})
	go func() { defer close(done); Run(ctx, hard, h, o) }()
	return func() { <-done }
}

func (r *rig) count(oc Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcomes[oc]
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// pending returns the consumer's messages not yet delivered and those
// delivered and not acknowledged.
func (r *rig) pending() (int, int) {
	r.t.Helper()
	info, err := r.cons.Info(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	return int(info.NumPending), info.NumAckPending
}

// TestRunOutcomes: a handler's nil is acked; Retry is nak'ed and
// redelivered until MaxDeliver, then gives up with an error event; a
// Terminate is terminated with an error event, a Reported one without;
// an undecodable message is rejected with an event of kind "event". No
// message is left in the stream.
func TestRunOutcomes(t *testing.T) {
	r := newRig(t, 5*time.Second, 2, 4)
	var deliveries sync.Map // subject -> *atomic.Int32
	h := func(ctx context.Context, env events.Envelope, subject string) error {
		n, _ := deliveries.LoadOrStore(subject, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		switch subject {
		case "j.ns.retry":
			return Retry(errors.New("transient"))
		case "j.ns.term":
			return Terminate(errors.New("permanent"))
		case "j.ns.reported":
			return Reported(errors.New("published already"))
		}
		return nil
	}
	for _, s := range []string{"j.ns.ok", "j.ns.retry", "j.ns.term", "j.ns.reported"} {
		r.publish(s, events.TypeSyncJob, events.SyncJob{Key: "ns." + strings.TrimPrefix(s, "j.ns.")})
	}
	r.publish("j.ns.garbage", "", []byte("{not json"))
	ctx, cancel := context.WithCancel(r.ctx)
	wait := r.run(ctx, ctx, h)
	defer wait()
	defer cancel()
	waitFor(t, 15*time.Second, "every message settled", func() bool {
		p, a := r.pending()
		return p == 0 && a == 0 && r.count(Failed) == 1
	})
	want := map[Outcome]int{OK: 1, Retried: 1, Failed: 1, Terminated: 2, Undecodable: 1}
	for oc, n := range want {
		if got := r.count(oc); got != n {
			t.Errorf("outcome %d: %d messages, want %d", oc, got, n)
		}
	}
	if n, _ := deliveries.Load("j.ns.retry"); n.(*atomic.Int32).Load() != 2 {
		t.Errorf("the retried job ran %d times, want MaxDeliver (2)", n.(*atomic.Int32).Load())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := map[string]events.Error{}
	for _, e := range r.reports {
		kinds[e.Subject] = e
	}
	if len(r.reports) != 3 {
		t.Errorf("%d error events, want 3 (gave up, terminated, undecodable): %+v", len(r.reports), r.reports)
	}
	if e := kinds["j.ns.retry"]; e.Kind != events.ErrorUpdate || !strings.Contains(e.Message, "job gave up after 2 deliveries: transient") || e.Attempts != 2 {
		t.Errorf("gave-up event %+v", e)
	}
	if e := kinds["j.ns.term"]; !e.Permanent || e.Message != "permanent" || e.Instance != "ns.term" {
		t.Errorf("terminated event %+v", e)
	}
	if e := kinds["j.ns.garbage"]; e.Kind != events.ErrorEvent || !strings.HasPrefix(e.Message, "rejected message: ") {
		t.Errorf("undecodable event %+v", e)
	}
	if _, ok := kinds["j.ns.reported"]; ok {
		t.Error("a Reported failure was published again")
	}
}

// TestRunSlotsAndKeepAlive: with 2 slots at most 2 jobs run at once, and
// jobs that run three times AckWait are kept alive (InProgress), not
// redelivered.
func TestRunSlotsAndKeepAlive(t *testing.T) {
	r := newRig(t, time.Second, 5, 2)
	var running, most, runs atomic.Int32
	h := func(ctx context.Context, env events.Envelope, subject string) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		runs.Add(1)
		time.Sleep(3 * time.Second)
		return nil
	}
	for _, s := range []string{"j.ns.a", "j.ns.b", "j.ns.c"} {
		r.publish(s, events.TypeDeleteJob, events.SyncJob{Key: "ns.x"})
	}
	ctx, cancel := context.WithCancel(r.ctx)
	wait := r.run(ctx, ctx, h)
	defer wait()
	defer cancel()
	waitFor(t, 20*time.Second, "three jobs acked", func() bool { return r.count(OK) == 3 })
	if most.Load() != 2 {
		t.Errorf("%d jobs ran at once, want 2 (the slots)", most.Load())
	}
	if runs.Load() != 3 {
		t.Errorf("%d runs of 3 jobs: a job kept alive was redelivered", runs.Load())
	}
}

// TestRunWindow: with a Window, the jobs running (and messages delivered
// and not acknowledged) follow it within Slots: 3 while it says 3, 8 once
// it grows to 8 without any job ending, and back down to 2 as jobs end
// after it shrinks; every job runs once.
func TestRunWindow(t *testing.T) {
	r := newRig(t, 5*time.Second, 5, 16)
	var window atomic.Int32
	window.Store(3)
	r.opts.Window = func() int { return int(window.Load()) }
	var running, runs atomic.Int32
	release := make(chan struct{})
	h := func(ctx context.Context, env events.Envelope, subject string) error {
		running.Add(1)
		defer running.Add(-1)
		runs.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	const total = 30
	for i := range total {
		r.publish("j.ns.s"+strconv.Itoa(i), events.TypeDeleteJob, events.SyncJob{Key: "ns.x"})
	}
	ctx, cancel := context.WithCancel(r.ctx)
	wait := r.run(ctx, ctx, h)
	defer wait()
	defer cancel()
	steady := func(want int32) {
		t.Helper()
		waitFor(t, 10*time.Second, fmt.Sprintf("%d jobs running", want), func() bool { return running.Load() == want })
		time.Sleep(200 * time.Millisecond) // 10 window reads: nothing more is taken
		if n := running.Load(); n != want {
			t.Fatalf("%d jobs running, want %d (the window)", n, want)
		}
		if _, acks := r.pending(); acks != int(want) {
			t.Fatalf("%d messages delivered and not acknowledged, want %d (the window)", acks, want)
		}
	}
	steady(3)
	window.Store(8)
	steady(8)
	window.Store(2)
	for range 6 {
		release <- struct{}{}
	}
	steady(2)
	for range total - 6 {
		release <- struct{}{}
	}
	waitFor(t, 10*time.Second, "every job acked", func() bool { return r.count(OK) == total })
	if n := runs.Load(); n != total {
		t.Errorf("%d runs of %d jobs", n, total)
	}
}

// TestRunShutdown: when ctx ends, a job that finishes within the grace is
// acked, one that runs on until the hard context ends is nak'ed, and Run
// returns only after both handlers returned; the nak'ed job is delivered
// again (its second delivery) to the next Run.
func TestRunShutdown(t *testing.T) {
	r := newRig(t, 30*time.Second, 5, 4)
	started := make(chan string, 2)
	var returned atomic.Int32
	h := func(ctx context.Context, env events.Envelope, subject string) error {
		defer returned.Add(1)
		started <- subject
		if subject == "j.ns.quick" {
			time.Sleep(300 * time.Millisecond) // ends within the grace
			return nil
		}
		<-ctx.Done() // ends only with the hard context
		return ctx.Err()
	}
	r.publish("j.ns.quick", events.TypeSyncJob, events.SyncJob{Key: "ns.quick"})
	r.publish("j.ns.slow", events.TypeSyncJob, events.SyncJob{Key: "ns.slow"})
	ctx, cancel := context.WithCancel(r.ctx)
	hard, cancelHard := Grace(ctx, time.Second)
	defer cancelHard()
	wait := r.run(ctx, hard, h)
	<-started
	<-started
	cancel()
	t0 := time.Now()
	wait()
	if took := time.Since(t0); took < 900*time.Millisecond {
		t.Errorf("Run returned %v after ctx ended, before the grace (1 s) ended the slow job", took)
	}
	if returned.Load() != 2 {
		t.Fatalf("Run returned while %d handlers still ran", 2-returned.Load())
	}
	if r.count(OK) != 1 || r.count(Retried) != 1 {
		t.Fatalf("outcomes %v, want one acked (within the grace) and one nak'ed (hard end)", r.outcomes)
	}
	if len(r.reports) != 0 {
		t.Errorf("shutdown published error events: %+v", r.reports)
	}

	// The nak'ed job comes back to the next Run, as its second delivery.
	again := make(chan uint64, 1)
	ctx2, cancel2 := context.WithCancel(r.ctx)
	defer cancel2()
	wait2 := r.run(ctx2, ctx2, func(ctx context.Context, env events.Envelope, subject string) error {
		if subject == "j.ns.slow" {
			again <- 1
		}
		return nil
	})
	defer wait2()
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("the job cut short by shutdown was not redelivered")
	}
	waitFor(t, 5*time.Second, "stream empty", func() bool { p, a := r.pending(); return p == 0 && a == 0 })
}

// TestGrace: the hard context ends grace after ctx, or at once when
// cancelled, and carries ctx's values.
func TestGrace(t *testing.T) {
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	hard, cancelHard := Grace(ctx, 200*time.Millisecond)
	defer cancelHard()
	if hard.Value(key{}) != "v" {
		t.Error("the hard context lost ctx's values")
	}
	cancel()
	t0 := time.Now()
	select {
	case <-hard.Done():
		if d := time.Since(t0); d < 150*time.Millisecond {
			t.Errorf("hard ended %v after ctx, before the grace", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hard did not end after the grace")
	}
	_, cancelHard2 := Grace(context.Background(), time.Hour)
	cancelHard2() // ends its goroutine
}
