package discovery

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// fakeWorkers pulls sync jobs from the real sync stream and answers each
// with the result answer returns (nil: no answer). It records the jobs in
// order of delivery.
type fakeWorkers struct {
	mu   sync.Mutex
	jobs []seenJob
}

type seenJob struct {
	key, id, reason string
	at              time.Time
}

func (f *fakeWorkers) seen() []seenJob {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.jobs)
}

func (f *fakeWorkers) keysOf(key string) []seenJob {
	var out []seenJob
	for _, j := range f.seen() {
		if j.key == key {
			out = append(out, j)
		}
	}
	return out
}

func runFakeWorkers(t *testing.T, b *events.Bus, answer func(job events.SyncJob, id string) *events.SyncResult) *fakeWorkers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := b.EnsureConsumer(ctx, events.SyncConsumer)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeWorkers{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		env, err := events.Decode(m.Data())
		if err != nil {
			t.Errorf("undecodable job: %v", err)
			return
		}
		job, err := events.Into[events.SyncJob](env, events.TypeSyncJob)
		if err != nil {
			t.Errorf("bad job: %v", err)
			return
		}
		f.mu.Lock()
		f.jobs = append(f.jobs, seenJob{key: job.Key, id: env.ID, reason: job.Reason, at: time.Now()})
		f.mu.Unlock()
		if r := answer(job, env.ID); r != nil {
			r.Key, r.JobID = job.Key, env.ID
			if err := b.PublishResult(env.ID+":r", *r); err != nil && ctx.Err() == nil {
				t.Errorf("publish result: %v", err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// A callback can still be running when the test ends: it must not
	// outlive the test or report the bus closing under it as a failure.
	t.Cleanup(func() {
		cancel()
		closed := cc.Closed() // taken before Stop, it closes once the last callback has returned
		cc.Stop()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Error("a fake worker's callback did not return within 10s of the test's end")
		}
	})
	return f
}

func runScheduler(t *testing.T, b *events.Bus, cfg SchedulerConfig, report *events.Reporter) *Scheduler {
	t.Helper()
	s := NewScheduler(b, cfg, report, nil)
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := b.SubscribeResults(s.Result, func(subject string, err error) { t.Errorf("bad result on %s: %v", subject, err) })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = sub.Unsubscribe() })
	return s
}

func total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// Without a result no second job is published for an instance; each result
// releases it for the next poll, and a full resync comes every SyncInterval.
func TestSchedulerOneJobOutPerInstance(t *testing.T) {
	b := newBus(t)
	gate := make(chan struct{})
	f := runFakeWorkers(t, b, func(events.SyncJob, string) *events.SyncResult {
		<-gate
		return &events.SyncResult{Outcome: events.OutcomeUnchanged}
	})
	s := runScheduler(t, b, SchedulerConfig{PollInterval: 50 * time.Millisecond, SyncInterval: 400 * time.Millisecond}, nil)
	s.Set([]string{"ns.a"})
	eventually(t, "first job", func() bool { return len(f.seen()) == 1 })
	time.Sleep(300 * time.Millisecond) // six poll intervals without a result
	if n := len(f.seen()); n != 1 {
		t.Fatalf("%d jobs out for one instance without a result, want 1", n)
	}
	if st := s.Stats(); st.InFlight != 1 {
		t.Fatalf("in flight = %d, want 1", st.InFlight)
	}
	close(gate)
	eventually(t, "polls after results", func() bool { return len(f.keysOf("ns.a")) >= 12 })
	jobs := f.keysOf("ns.a")
	if jobs[0].reason != events.ReasonAppeared {
		t.Errorf("first job reason %q, want %q", jobs[0].reason, events.ReasonAppeared)
	}
	var polls, resyncs int
	for _, j := range jobs[1:] {
		switch j.reason {
		case events.ReasonPoll:
			polls++
		case events.ReasonResync:
			resyncs++
		default:
			t.Errorf("job reason %q", j.reason)
		}
	}
	if polls == 0 || resyncs == 0 || polls < 2*resyncs {
		t.Errorf("%d polls and %d resyncs; want mostly polls and a resync every sync interval", polls, resyncs)
	}
	for i := 1; i < len(jobs); i++ {
		if gap := jobs[i].at.Sub(jobs[i-1].at); gap < 40*time.Millisecond {
			t.Errorf("jobs %d and %d only %v apart; the poll interval is 50ms", i-1, i, gap)
		}
	}
}

// Failed fetches take an instance out of rotation (an error event), probes
// follow at growing intervals, and a good fetch brings it back (another event).
func TestSchedulerBacksOffFailingInstance(t *testing.T) {
	b := newBus(t)
	var mu sync.Mutex
	failing := true
	f := runFakeWorkers(t, b, func(job events.SyncJob, _ string) *events.SyncResult {
		mu.Lock()
		defer mu.Unlock()
		if failing && job.Key == "ns.bad" {
			return &events.SyncResult{Outcome: events.OutcomeFetchFailed, Transient: true, Error: "HTTP 500"}
		}
		return &events.SyncResult{Outcome: events.OutcomeUnchanged}
	})
	errs := collectErrors(t, b)
	rep := events.NewReporter(b, nil, "test", time.Millisecond)
	s := runScheduler(t, b, SchedulerConfig{PollInterval: 20 * time.Millisecond, SyncInterval: time.Hour,
		FailuresBeforeBackoff: 3, ProbeMaxInterval: 400 * time.Millisecond}, rep)
	s.Set([]string{"ns.bad", "ns.good"})
	eventually(t, "out of rotation", func() bool { return s.Stats().OutOfRotation == 1 })
	eventually(t, "out-of-rotation event", func() bool { return errs.has("ns.bad", "out of rotation") })
	eventually(t, "several probes", func() bool { return len(f.keysOf("ns.bad")) >= 7 })
	bad := f.keysOf("ns.bad")
	var gaps []time.Duration
	for i := 3; i < len(bad); i++ {
		gaps = append(gaps, bad[i].at.Sub(bad[i-1].at))
	}
	if gaps[len(gaps)-1] < 2*gaps[0] {
		t.Errorf("probe gaps %v do not grow", gaps)
	}
	for _, g := range gaps {
		if g > 800*time.Millisecond {
			t.Errorf("probe gap %v beyond the 400ms cap", g)
		}
	}
	// The healthy instance kept its cadence meanwhile.
	if n := len(f.keysOf("ns.good")); n < len(bad) {
		t.Errorf("healthy instance got %d jobs, the failing one %d", n, len(bad))
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	eventually(t, "back in rotation", func() bool { return s.Stats().OutOfRotation == 0 })
	eventually(t, "recovery event", func() bool { return errs.has("ns.bad", "recovered") })
	errs.mu.Lock()
	defer errs.mu.Unlock()
	for _, e := range errs.errs {
		if e.Instance == "ns.bad" && e.Resolved != strings.Contains(e.Message, "recovered") {
			t.Errorf("event %q has resolved=%v; only the recovery is resolved", e.Message, e.Resolved)
		}
	}
}

// Instances due at once are served in an order that does not follow
// their names.
func TestSchedulerOrderIsNotByName(t *testing.T) {
	b := newBus(t)
	f := runFakeWorkers(t, b, func(events.SyncJob, string) *events.SyncResult { return nil })
	s := runScheduler(t, b, SchedulerConfig{PollInterval: time.Hour, SyncInterval: time.Hour}, nil)
	var keys []string
	for i := range 40 {
		keys = append(keys, "ns.i-"+string(rune('a'+i/26))+string(rune('a'+i%26)))
	}
	s.Set(keys)
	eventually(t, "40 jobs", func() bool { return len(f.seen()) == 40 })
	var order []string
	for _, j := range f.seen() {
		order = append(order, j.key)
	}
	if slices.IsSorted(order) {
		t.Fatalf("jobs published in name order: %v", order)
	}
	rev := slices.Clone(order)
	slices.Reverse(rev)
	if slices.IsSorted(rev) {
		t.Fatalf("jobs published in reverse name order: %v", order)
	}
}

// An instance that gets no result within its interval is counted as
// overdue for capacity; one in backoff, for backoff.
func TestSchedulerCountsMissedIntervals(t *testing.T) {
	b := newBus(t)
	runFakeWorkers(t, b, func(job events.SyncJob, _ string) *events.SyncResult {
		if job.Key == "ns.bad" {
			return &events.SyncResult{Outcome: events.OutcomeFetchFailed, Error: "hang"}
		}
		return nil // ns.slow: never answered
	})
	s := runScheduler(t, b, SchedulerConfig{PollInterval: 20 * time.Millisecond, SyncInterval: 200 * time.Millisecond,
		FailuresBeforeBackoff: 1}, nil)
	s.Set([]string{"ns.slow", "ns.bad"})
	eventually(t, "both overdue", func() bool {
		st := s.Stats()
		return st.Overdue == 2 && st.Missed["capacity"] == 1 && st.Missed["backoff"] == 1
	})
	if st := s.Stats(); total(st.Missed) != 2 {
		t.Errorf("missed = %v, want one per instance (counted once per episode)", st.Missed)
	}
}

type errorLog struct {
	mu   sync.Mutex
	errs []events.Error
}

func (l *errorLog) has(instance, text string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		if e.Instance == instance && strings.Contains(e.Message, text) {
			return true
		}
	}
	return false
}

func collectErrors(t *testing.T, b *events.Bus) *errorLog {
	t.Helper()
	l := &errorLog{}
	sub, err := b.JS.Conn().Subscribe(b.Subjects.Errors(), func(m *nats.Msg) {
		env, err := events.Decode(m.Data)
		if err != nil {
			return
		}
		e, err := events.Into[events.Error](env, events.TypeError)
		if err != nil {
			return
		}
		l.mu.Lock()
		l.errs = append(l.errs, e)
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}
