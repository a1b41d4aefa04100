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
	go func() { defer close(done); s.Run(ctx, nil) }()
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
	b, js := newBusJS(t)
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
	errs := collectErrors(t, js.Conn(), b)
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

func collectErrors(t *testing.T, nc *nats.Conn, b *events.Bus) *errorLog {
	t.Helper()
	l := &errorLog{}
	sub, err := nc.Subscribe(b.Subjects().Errors(), func(m *nats.Msg) {
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

// timeline runs instance key of s on a clock of its own: each job is
// taken when the instance falls due and answered at once with answer's
// result. It returns the jobs of n rounds (at: when taken) and the poll
// interval the state bucket showed after each.
func timeline(t *testing.T, s *Scheduler, key string, n int, answer func(i int, reason string) events.SyncResult) ([]seenJob, []int64) {
	t.Helper()
	s.Set([]string{key})
	s.mu.Lock()
	e := s.inst[key]
	e.due = time.Now().Add(time.Hour) // ahead of the wall clock Result compares with
	s.mu.Unlock()
	var jobs []seenJob
	var shown []int64
	for i := range n {
		s.mu.Lock()
		now := e.due
		it := s.take(e, now)
		s.mu.Unlock()
		jobs = append(jobs, seenJob{key: key, id: it.id, reason: it.reason, at: now})
		r := answer(i, it.reason)
		r.Key, r.JobID = key, it.id
		s.Result(r)
		shown = append(shown, s.States()[key].PollIntervalMS)
	}
	return jobs, shown
}

func gapsOf(jobs []seenJob) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(jobs); i++ {
		out = append(out, jobs[i].at.Sub(jobs[i-1].at))
	}
	return out
}

// medianGap is the median time between consecutive jobs (0 for fewer
// than two).
func medianGap(jobs []seenJob) time.Duration {
	g := gapsOf(jobs)
	if len(g) == 0 {
		return 0
	}
	slices.Sort(g)
	return g[len(g)/2]
}

// notModified answers polls as a MAT with ETags whose status does not
// change: 304 and nothing to do; full syncs vouched unchanged.
func notModified(_ int, reason string) events.SyncResult {
	if reason == events.ReasonPoll {
		return events.SyncResult{Outcome: events.OutcomeUnchanged, NotModified: true}
	}
	return events.SyncResult{Outcome: events.OutcomeSynced, NotModified: true}
}

// plainUnchanged answers as a MAT without ETags whose status does not change.
func plainUnchanged(_ int, reason string) events.SyncResult {
	if reason == events.ReasonPoll {
		return events.SyncResult{Outcome: events.OutcomeUnchanged}
	}
	return events.SyncResult{Outcome: events.OutcomeSynced}
}

// An instance whose polls are answered 304 is polled at an interval that
// grows by a quarter per poll up to PollMaxInterval and never beyond,
// and its full resync still comes every SyncInterval to the nanosecond.
func TestSchedulerStretchesNotModifiedPolls(t *testing.T) {
	s := NewScheduler(nil, SchedulerConfig{PollInterval: time.Second, PollMaxInterval: 1500 * time.Millisecond, SyncInterval: 30 * time.Second}, nil, nil)
	jobs, shown := timeline(t, s, "ns.etag", 400, notModified)
	gaps := gapsOf(jobs)
	want := []time.Duration{time.Second, 1250 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond}
	if !slices.Equal(gaps[:4], want) {
		t.Errorf("first gaps %v, want %v", gaps[:4], want)
	}
	var lastFull time.Time
	for i, j := range jobs {
		if i > 0 && gaps[i-1] > 1500*time.Millisecond {
			t.Errorf("job %d (%s) %v after the one before, beyond the 1.5s bound", i, j.reason, gaps[i-1])
		}
		if shown[i] > 1500 {
			t.Errorf("state shows a poll interval of %d ms after job %d, beyond the bound", shown[i], i)
		}
		if j.reason == events.ReasonPoll {
			continue
		}
		if !lastFull.IsZero() && j.at.Sub(lastFull) != 30*time.Second {
			t.Errorf("full sync %d (%s) %v after the one before, want 30s", i, j.reason, j.at.Sub(lastFull))
		}
		lastFull = j.at
	}
	if shown[len(shown)-1] != 1500 {
		t.Errorf("state shows %d ms, want the stretched 1500", shown[len(shown)-1])
	}
	polls := 0
	for _, j := range jobs {
		if j.at.Sub(jobs[0].at) < time.Minute && j.reason == events.ReasonPoll {
			polls++
		}
	}
	if polls > 40 {
		t.Errorf("%d polls in the first minute, want at most 40 (1.5s apart)", polls)
	}
	if st := s.Stats(); st.Stretched != 1 {
		t.Errorf("stretched = %d, want 1", st.Stretched)
	}
}

// An instance that never answers 304 (a MAT without ETags) is scheduled
// exactly as without the stretch: same jobs, same reasons, same times.
func TestSchedulerNoETagPolledEveryInterval(t *testing.T) {
	cfg := SchedulerConfig{PollInterval: time.Second, SyncInterval: 30 * time.Second}
	off, offShown := timeline(t, NewScheduler(nil, cfg, nil, nil), "ns.plain", 200, plainUnchanged)
	cfg.PollMaxInterval = 1500 * time.Millisecond
	on, onShown := timeline(t, NewScheduler(nil, cfg, nil, nil), "ns.plain", 200, plainUnchanged)
	for i, g := range gapsOf(on) {
		if g != time.Second {
			t.Fatalf("job %d (%s) %v after the one before, want exactly 1s", i+1, on[i+1].reason, g)
		}
	}
	for i := range on {
		if on[i].reason != off[i].reason || on[i].at.Sub(on[0].at) != off[i].at.Sub(off[0].at) || onShown[i] != offShown[i] || onShown[i] != 1000 {
			t.Fatalf("job %d: %s at +%v showing %d ms; without the stretch %s at +%v showing %d ms", i,
				on[i].reason, on[i].at.Sub(on[0].at), onShown[i], off[i].reason, off[i].at.Sub(off[0].at), offShown[i])
		}
	}
	resyncs := 0
	for _, j := range on {
		if j.reason == events.ReasonResync {
			resyncs++
		}
	}
	if resyncs != 6 { // 199 s after the first (appeared) sync
		t.Errorf("%d resyncs in 200 polls, want 6", resyncs)
	}
}

// A change, a Service event (a poll that plans), a failed fetch, a
// failed apply, a status without a strong ETag and a trigger each set a
// stretched interval back to PollInterval at once; a full sync that
// MAT vouched unchanged keeps it, one that found a change resets it.
func TestSchedulerStretchResets(t *testing.T) {
	cases := []struct {
		name   string
		reason string // of the job answered with r ("" any)
		r      events.SyncResult
		want   time.Duration
		// wall: the next job's time is the wall clock's (the apply
		// backoff), not comparable with the timeline's own.
		wall bool
	}{
		// A poll that planned: a new status, or a 304 after a Service event.
		{"change", events.ReasonPoll, events.SyncResult{Outcome: events.OutcomeSynced}, time.Second, false},
		{"fetch failed", events.ReasonPoll, events.SyncResult{Outcome: events.OutcomeFetchFailed, Transient: true, Error: "timeout"}, time.Second, false},
		{"apply failed", events.ReasonPoll, events.SyncResult{Outcome: events.OutcomeApplyFailed, Transient: true, Error: "429"}, time.Second, true},
		{"permanent apply failure", events.ReasonPoll, events.SyncResult{Outcome: events.OutcomeApplyFailed, Error: "422", NotModified: true}, time.Second, false},
		{"200 without ETag", events.ReasonPoll, events.SyncResult{Outcome: events.OutcomeUnchanged}, time.Second, false},
		{"skipped", events.ReasonPoll, events.SyncResult{Outcome: events.OutcomeSkipped}, time.Second, false},
		{"resync with a change", events.ReasonResync, events.SyncResult{Outcome: events.OutcomeSynced}, time.Second, false},
		{"resync vouched unchanged", events.ReasonResync, events.SyncResult{Outcome: events.OutcomeSynced, NotModified: true}, 1500 * time.Millisecond, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewScheduler(nil, SchedulerConfig{PollInterval: time.Second, PollMaxInterval: 1500 * time.Millisecond, SyncInterval: 30 * time.Second}, nil, nil)
			hit := -1
			jobs, shown := timeline(t, s, "ns.a", 60, func(i int, reason string) events.SyncResult {
				if i >= 10 && hit < 0 && reason == c.reason {
					hit = i
					return c.r
				}
				return notModified(i, reason)
			})
			if hit < 0 {
				t.Fatal("no job of reason " + c.reason)
			}
			if shown[hit-1] != 1500 {
				t.Fatalf("not stretched before: %d ms", shown[hit-1])
			}
			if got := jobs[hit+1].at.Sub(jobs[hit].at); !c.wall && got != c.want {
				t.Errorf("next job %v after, want %v", got, c.want)
			}
			if shown[hit] != c.want.Milliseconds() {
				t.Errorf("state shows %d ms, want %d", shown[hit], c.want.Milliseconds())
			}
			// And it stretches again with the next 304s.
			if shown[hit+5] != 1500 {
				t.Errorf("state shows %d ms five 304s later, want 1500", shown[hit+5])
			}
		})
	}
	t.Run("trigger", func(t *testing.T) {
		s := NewScheduler(nil, SchedulerConfig{PollInterval: time.Second, PollMaxInterval: 1500 * time.Millisecond, SyncInterval: 30 * time.Second}, nil, nil)
		timeline(t, s, "ns.a", 10, notModified)
		if ms := s.States()["ns.a"].PollIntervalMS; ms != 1500 {
			t.Fatalf("not stretched: %d ms", ms)
		}
		s.Trigger("ns.a", events.ReasonAppeared)
		if ms := s.States()["ns.a"].PollIntervalMS; ms != 1000 {
			t.Errorf("after a trigger the state shows %d ms, want 1000", ms)
		}
	})
}

// Off, and bounds: PollMaxInterval at or below PollInterval stretches
// nothing; above SyncInterval it is cut to SyncInterval.
func TestSchedulerPollMaxIntervalBounds(t *testing.T) {
	for _, c := range []struct {
		max, want time.Duration
	}{{0, time.Second}, {time.Second, time.Second}, {500 * time.Millisecond, time.Second}, {time.Minute, 30 * time.Second}} {
		s := NewScheduler(nil, SchedulerConfig{PollInterval: time.Second, PollMaxInterval: c.max, SyncInterval: 30 * time.Second}, nil, nil)
		if got := s.Config().PollMaxInterval; got != c.want {
			t.Errorf("PollMaxInterval %v: effective %v, want %v", c.max, got, c.want)
		}
		if c.want == time.Second {
			jobs, shown := timeline(t, s, "ns.a", 20, notModified)
			for i, g := range gapsOf(jobs) {
				if g != time.Second || shown[i] != 1000 {
					t.Fatalf("PollMaxInterval %v: job %d %v after the one before (state %d ms), want 1s", c.max, i+1, g, shown[i])
				}
			}
		}
	}
}

// Through the sync stream: with 304 answers the jobs of one instance
// come at the stretched interval, those of an instance without ETags at
// PollInterval, and both get their resyncs.
func TestSchedulerStretchOnTheBus(t *testing.T) {
	b := newBus(t)
	f := runFakeWorkers(t, b, func(job events.SyncJob, _ string) *events.SyncResult {
		if job.Key == "ns.etag" {
			r := notModified(0, job.Reason)
			return &r
		}
		r := plainUnchanged(0, job.Reason)
		return &r
	})
	s := runScheduler(t, b, SchedulerConfig{PollInterval: 40 * time.Millisecond, PollMaxInterval: 120 * time.Millisecond,
		SyncInterval: 600 * time.Millisecond}, nil)
	s.Set([]string{"ns.etag", "ns.plain"})
	var maxShown int64
	eventually(t, "two resyncs of the stretched instance", func() bool {
		if ms := s.States()["ns.etag"].PollIntervalMS; ms > maxShown {
			maxShown = ms
		}
		n := 0
		for _, j := range f.keysOf("ns.etag") {
			if j.reason == events.ReasonResync {
				n++
			}
		}
		return n >= 2
	})
	if maxShown != 120 {
		t.Errorf("stretched instance's state showed at most %d ms, want 120", maxShown)
	}
	if ms := s.States()["ns.plain"].PollIntervalMS; ms != 40 {
		t.Errorf("instance without 304s shows %d ms, want 40", ms)
	}
	etag, plain := f.keysOf("ns.etag"), f.keysOf("ns.plain")
	if len(plain) < 2*len(etag) {
		t.Errorf("%d jobs of the instance without ETags, %d of the stretched one; want at least twice as many", len(plain), len(etag))
	}
	// Polls keep a fixed cadence, so one job seen late (a busy machine)
	// makes the gap to the next one short: the median gap is the
	// interval the instance is polled at.
	if g := medianGap(plain); g < 35*time.Millisecond {
		t.Errorf("the jobs of the instance without ETags are a median %v apart; the poll interval is 40ms", g)
	}
	late := etag[len(etag)/2:]
	var polls []time.Duration
	for i, g := range gapsOf(late) {
		if late[i+1].reason == events.ReasonPoll {
			polls = append(polls, g)
		}
	}
	if len(polls) > 0 {
		slices.Sort(polls)
		if g := polls[len(polls)/2]; g < 100*time.Millisecond {
			t.Errorf("stretched polls a median %v apart (%v), want about 120ms", g, polls)
		}
	}
}

// A retry hint (a worker's trust in MAT changed) probes a failing
// instance at once instead of at its backoff (here a minute away); a hint
// for a healthy instance, or one whose job is out, changes nothing.
func TestSchedulerRetryHintProbesAtOnce(t *testing.T) {
	b := newBus(t)
	var mu sync.Mutex
	failing := true
	f := runFakeWorkers(t, b, func(job events.SyncJob, _ string) *events.SyncResult {
		mu.Lock()
		defer mu.Unlock()
		if failing && job.Key == "ns.bad" {
			return &events.SyncResult{Outcome: events.OutcomeFetchFailed, Error: "x509: certificate signed by unknown authority"}
		}
		return &events.SyncResult{Outcome: events.OutcomeSynced}
	})
	s := runScheduler(t, b, SchedulerConfig{PollInterval: 30 * time.Second, SyncInterval: time.Hour,
		FailuresBeforeBackoff: 1, ProbeMaxInterval: time.Hour}, nil)
	s.Set([]string{"ns.bad", "ns.good"})
	eventually(t, "out of rotation", func() bool { return s.Stats().OutOfRotation == 1 })
	eventually(t, "both first jobs", func() bool { return len(f.keysOf("ns.good")) == 1 })
	mu.Lock()
	failing = false
	mu.Unlock()
	for _, key := range []string{"ns.bad", "ns.good", "ns.unknown"} {
		if err := b.PublishResult("hint-"+key, events.SyncResult{Key: key, Outcome: events.OutcomeRetry, Worker: "w"}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "an early probe and recovery", func() bool { return s.Stats().OutOfRotation == 0 })
	if jobs := f.keysOf("ns.bad"); len(jobs) != 2 || jobs[1].reason != events.ReasonProbe {
		t.Errorf("jobs of the failing instance %+v, want its first and one probe", jobs)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(f.keysOf("ns.good")); n != 1 {
		t.Errorf("the healthy instance got %d jobs, want 1: a hint does not poll it early", n)
	}
}
