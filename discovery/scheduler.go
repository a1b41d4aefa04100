package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubeevents"
)

// DefaultPollMaxInterval is the default bound of a stretched poll
// interval (the CLI's --poll-max-interval): a change after a quiet spell
// waits at most this long for its poll, which keeps the reaction p99 (this
// plus a sync's own time) under 2 s (ADR 23).
const DefaultPollMaxInterval = 1500 * time.Millisecond

// PollMaxInterval settles a configured PollMaxInterval v: v when it was
// given (then it must lie in [poll, sync], else the error says so), else
// the default v raised to poll and cut to sync, so an older configuration
// with a longer poll interval stretches nothing and is no error.
func PollMaxInterval(poll, v time.Duration, given bool, sync time.Duration) (time.Duration, error) {
	if !given {
		return min(max(v, poll), sync), nil
	}
	if v < poll || v > sync {
		return 0, fmt.Errorf("--poll-max-interval %v must be at least --poll-interval (%v) and at most --sync-interval (%v); equal to --poll-interval turns the stretch off", v, poll, sync)
	}
	return v, nil
}

// SchedulerConfig tunes a Scheduler. Zero values mean the defaults.
type SchedulerConfig struct {
	// PollInterval is how often each instance's status is polled; an
	// unchanged status costs one GET and no Kubernetes request. Default 1 s.
	PollInterval time.Duration
	// PollMaxInterval bounds the stretched interval of an instance whose
	// polls MAT keeps answering 304 Not Modified (SyncResult.NotModified):
	// each such poll stretches its interval by a quarter, up to this bound,
	// and any other result, or a trigger, sets it back to PollInterval.
	// A MAT that sends no ETag is never answered 304 and is polled every
	// PollInterval. Zero (or PollInterval) stretches nothing; at most
	// SyncInterval.
	PollMaxInterval time.Duration
	// SyncInterval is how often each instance gets a full resync (plan and
	// apply even when the status looks unchanged). Default 30 s.
	SyncInterval time.Duration
	// FailuresBeforeBackoff is how many consecutive failed fetches take an
	// instance out of rotation; default 3.
	FailuresBeforeBackoff int
	// ProbeMaxInterval caps the growing interval at which an instance out of
	// rotation is probed; default 2 min.
	ProbeMaxInterval time.Duration
	// InflightTimeout is how long a job may go without a result before the
	// instance is released for another job (a lost result, a worker that
	// died on the job's last delivery); default 3 min.
	InflightTimeout time.Duration
	// Events records the OutOfRotation and Recovered Kubernetes Events on
	// the instances' MAT Services; nil records none.
	Events *kubeevents.Recorder
}

func (c SchedulerConfig) withDefaults() SchedulerConfig {
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.SyncInterval <= 0 {
		c.SyncInterval = 30 * time.Second
	}
	if c.PollInterval > c.SyncInterval {
		c.PollInterval = c.SyncInterval
	}
	c.PollMaxInterval = min(max(c.PollMaxInterval, c.PollInterval), c.SyncInterval)
	if c.FailuresBeforeBackoff <= 0 {
		c.FailuresBeforeBackoff = 3
	}
	if c.ProbeMaxInterval <= 0 {
		c.ProbeMaxInterval = 2 * time.Minute
	}
	if c.InflightTimeout <= 0 {
		c.InflightTimeout = 3 * time.Minute
	}
	return c
}

// SchedulerStats is a snapshot of a Scheduler.
type SchedulerStats struct {
	Instances     int // instances scheduled
	InFlight      int // instances with a job out
	OutOfRotation int // instances probed at a backoff interval after failed fetches
	Overdue       int // instances whose last good sync is older than SyncInterval + PollInterval
	Stretched     int // instances polled at more than PollInterval (their polls answered 304)
	// Dispatched counts sync jobs published, by reason (poll, resync, appeared, start, probe).
	Dispatched map[string]int64
	// Results counts sync results received, by outcome.
	Results map[string]int64
	// Missed counts instances that fell behind their interval, by cause:
	// "backoff" (its fetches failed: out of rotation or about to be),
	// "capacity" (its job did not finish in time: busy workers, or a MAT
	// that is slow or hangs before its first failure is known).
	Missed map[string]int64
	// LastDispatch is when a job was last published.
	LastDispatch time.Time
}

// Scheduler hands out sync jobs, one instance at a time: it is a work
// queue of instance keys with the semantics of client-go's (a key is
// never out twice, and a key that becomes due while its job runs waits
// for the job's result), spread over the sync stream. Each instance is
// polled every PollInterval (stretched up to PollMaxInterval while MAT
// answers its polls 304 Not Modified) and fully resynced every
// SyncInterval; due instances are published in order of due time, ties
// broken at random, never by name. Results come back from workers on
// <prefix>.results.<key>. Repeated fetch failures take an instance out
// of rotation (an error event), after which it is probed at a growing,
// capped interval until a fetch succeeds (another error event says it
// recovered), or at once when a worker hints that the cause may be gone
// (events.OutcomeRetry: its MAT CA bundle changed). An instance whose last good sync is older than
// SyncInterval + PollInterval is counted and logged as overdue.
//
// It is safe for concurrent use; Run drives it.
type Scheduler struct {
	bus    *events.Bus
	cfg    SchedulerConfig
	log    *slog.Logger
	report *events.Reporter
	epoch  string
	wake   chan struct{}

	mu    sync.Mutex
	inst  map[string]*schedEntry
	seq   uint64
	stats SchedulerStats

	// Error events are published on goroutines owned by Run (see report).
	runMu   sync.Mutex
	runCtx  context.Context // Run's context; nil before the first Run
	runOver bool            // Run has returned: reports are dropped
	pending []events.Error  // reports made before the first Run, sent when it starts
	reports sync.WaitGroup  // report goroutines; Run waits for them
}

type schedEntry struct {
	key       string
	due       time.Time
	reason    string // reason of the next job when it must be a full sync ("" = decide by time)
	lastFull  time.Time
	inflight  bool
	sentAt    time.Time
	jobID     string
	jobReason string
	fails     int // consecutive failed fetches
	applyFail int // consecutive transient apply failures
	out       bool
	lastGood  time.Time
	since     time.Time // when the instance was added
	overdue   bool
	tie       uint64
	every     time.Duration // current poll interval (0: PollInterval); see pollEvery
	lastErr   string
	last      lastResult // for the state bucket (state.go)
}

// NewScheduler returns a Scheduler publishing on bus. report (may be nil)
// receives the out-of-rotation and recovery events.
func NewScheduler(bus *events.Bus, cfg SchedulerConfig, report *events.Reporter, log *slog.Logger) *Scheduler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Scheduler{bus: bus, cfg: cfg.withDefaults(), log: log, report: report, epoch: nuid.Next(),
		wake: make(chan struct{}, 1), inst: map[string]*schedEntry{},
		stats: SchedulerStats{Dispatched: map[string]int64{}, Results: map[string]int64{}, Missed: map[string]int64{}}}
}

// Config returns the effective configuration.
func (s *Scheduler) Config() SchedulerConfig { return s.cfg }

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Set makes keys the scheduled instances: new keys are due at once with a
// full sync (reason appeared), keys not in the list are dropped.
func (s *Scheduler) Set(keys []string) {
	now := time.Now()
	s.mu.Lock()
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
		if _, ok := s.inst[k]; !ok {
			s.inst[k] = &schedEntry{key: k, due: now, reason: events.ReasonAppeared, since: now, tie: rand.Uint64()}
		}
	}
	for k := range s.inst {
		if !want[k] {
			delete(s.inst, k)
		}
	}
	s.mu.Unlock()
	s.poke()
}

// Add schedules key (due at once with a full sync) unless it is scheduled.
func (s *Scheduler) Add(key string) {
	s.mu.Lock()
	if _, ok := s.inst[key]; !ok {
		now := time.Now()
		s.inst[key] = &schedEntry{key: key, due: now, reason: events.ReasonAppeared, since: now, tie: rand.Uint64()}
	}
	s.mu.Unlock()
	s.poke()
}

// Trigger makes key due at once with a full sync for reason (the instance
// appeared or changed, or a publisher took the lead). It does nothing for
// an unscheduled key. A key whose job is out gets the full sync right
// after that job's result.
func (s *Scheduler) Trigger(key, reason string) {
	s.mu.Lock()
	if e, ok := s.inst[key]; ok {
		e.reason = reason
		e.due = time.Now()
		e.every = 0
	}
	s.mu.Unlock()
	s.poke()
}

// Result takes a worker's result for an instance's job.
func (s *Scheduler) Result(r events.SyncResult) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Results[r.Outcome]++
	e, ok := s.inst[r.Key]
	if ok && r.Outcome == events.OutcomeRetry {
		// A worker's hint that the failures' cause may be gone: a failing
		// instance (out of rotation or on its way) is probed now rather
		// than at its backoff. A job out already is that probe.
		if e.fails > 0 && !e.inflight && e.due.After(now) {
			s.log.Info("probing a failing instance at once: a worker's trust in MAT changed", "instance", e.key, "worker", r.Worker, "failures", e.fails)
			e.due = now
			s.poke()
		}
		return
	}
	if !ok || !e.inflight || r.JobID != e.jobID {
		return // an instance no longer scheduled, or a result of an older job
	}
	e.inflight = false
	e.last = e.last.next(r)
	e.every = s.pollEvery(e, r)
	next := e.sentAt.Add(s.interval(e))
	switch {
	case r.Outcome == events.OutcomeFetchFailed:
		e.fails++
		e.lastErr = r.Error
		if e.fails >= s.cfg.FailuresBeforeBackoff {
			wait := s.probeInterval(e.fails)
			if !e.out {
				e.out = true
				s.log.Warn("instance taken out of rotation", "instance", e.key, "failures", e.fails, "probe_in", wait, "error", r.Error)
				msg := fmt.Sprintf("instance taken out of rotation after %d consecutive failed status fetches; probed at a growing interval (now %v, at most %v); last error: %s",
					e.fails, wait, s.cfg.ProbeMaxInterval, r.Error)
				s.emit(events.Error{Kind: events.ErrorFetch, Instance: e.key, Message: msg, Permanent: !r.Transient})
				s.record(e.key, kubeevents.OutOfRotation, msg)
			}
			next = now.Add(wait)
		}
	case r.Outcome == events.OutcomeApplyFailed && r.Transient:
		e.applyFail++
		wait := s.cfg.PollInterval << min(e.applyFail-1, 16)
		next = now.Add(min(wait, s.cfg.SyncInterval))
		s.recovered(e, now)
	default: // synced, unchanged, skipped, or a permanent apply failure
		e.applyFail = 0
		s.recovered(e, now)
		if e.jobReason != events.ReasonPoll {
			e.lastFull = e.sentAt
		}
		if e.every > s.cfg.PollInterval && !e.lastFull.IsZero() {
			// A stretched poll never delays the full resync.
			next = minTime(next, e.lastFull.Add(s.cfg.SyncInterval))
		}
	}
	if e.reason != "" {
		next = now // a trigger came while the job ran
		e.every = 0
	}
	e.due = maxTime(next, now)
	s.poke()
}

// pollEvery is e's poll interval after result r of its job (0:
// PollInterval): a poll that MAT answered 304 Not Modified, with nothing
// to do, stretches it by a quarter up to PollMaxInterval; a full sync
// whose status MAT vouched unchanged keeps it; every other result (a
// change, a Service event, a failure, a status without a strong ETag)
// sets it back. Caller holds s.mu.
func (s *Scheduler) pollEvery(e *schedEntry, r events.SyncResult) time.Duration {
	switch {
	case !r.NotModified:
		return 0
	case r.Outcome == events.OutcomeUnchanged && e.jobReason == events.ReasonPoll:
		cur := s.interval(e)
		return min(cur+cur/4, s.cfg.PollMaxInterval)
	case r.Outcome == events.OutcomeSynced && e.jobReason != events.ReasonPoll:
		return e.every
	default:
		return 0
	}
}

// interval is e's current poll interval (caller holds s.mu).
func (s *Scheduler) interval(e *schedEntry) time.Duration {
	if e.every <= 0 {
		return s.cfg.PollInterval
	}
	return e.every
}

// recovered notes a good fetch of e (caller holds s.mu).
func (s *Scheduler) recovered(e *schedEntry, now time.Time) {
	if e.out {
		s.log.Info("instance back in rotation", "instance", e.key, "failed_fetches", e.fails)
		msg := fmt.Sprintf("instance recovered: status fetched again after %d failed fetches; back in rotation", e.fails)
		s.emit(events.Error{Kind: events.ErrorFetch, Instance: e.key, Message: msg, Resolved: true})
		s.record(e.key, kubeevents.Recovered, msg)
	}
	e.out, e.fails, e.lastErr = false, 0, ""
	e.lastGood = now
	if e.overdue {
		e.overdue = false
		s.log.Info("instance back on schedule", "instance", e.key)
	}
}

// record records a Kubernetes Event on the MAT Service of instance key
// (it never waits on the API server).
func (s *Scheduler) record(key string, reason kubeevents.Reason, note string) {
	s.cfg.Events.Instance(key, reason, note)
}

// emit reports e: an instance taken out of rotation, or (Resolved) back in
// rotation.
func (s *Scheduler) emit(e events.Error) {
	if s.report == nil {
		return
	}
	s.reportAsync(e)
}

// reportAsync publishes e on a goroutine of its own (reporting publishes
// with retries: never under the lock), owned by Run: it runs under Run's
// context and Run waits for it before returning. A report made before the
// first Run is sent once Run starts; one made after Run's context ended is
// dropped (the run is over: this process is no longer leading).
func (s *Scheduler) reportAsync(e events.Error) {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	switch {
	case s.runCtx == nil:
		s.pending = append(s.pending, e)
	case !s.runOver && s.runCtx.Err() == nil:
		ctx := s.runCtx
		s.reports.Add(1)
		go func() {
			defer s.reports.Done()
			s.report.Report(ctx, e)
		}()
	}
}

// own makes ctx (Run's) the owner of report goroutines and starts those of
// the reports made before; the returned function, called when Run ends,
// waits for every report goroutine, which ctx's end has cut short.
func (s *Scheduler) own(ctx context.Context) (wait func()) {
	s.runMu.Lock()
	s.runCtx, s.runOver = ctx, false
	pending := s.pending
	s.pending = nil
	s.runMu.Unlock()
	for _, e := range pending {
		s.reportAsync(e)
	}
	return func() {
		s.runMu.Lock()
		s.runOver = true
		s.runMu.Unlock()
		s.reports.Wait()
	}
}

// probeInterval is the wait before probing an instance with fails
// consecutive failed fetches: PollInterval doubled per failure beyond
// FailuresBeforeBackoff-1, capped at ProbeMaxInterval.
func (s *Scheduler) probeInterval(fails int) time.Duration {
	n := fails - s.cfg.FailuresBeforeBackoff + 1
	d := s.cfg.PollInterval << min(n, 20)
	return min(d, s.cfg.ProbeMaxInterval)
}

// Stats returns a snapshot.
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.stats
	out.Dispatched = clone(s.stats.Dispatched)
	out.Results = clone(s.stats.Results)
	out.Missed = clone(s.stats.Missed)
	out.Instances = len(s.inst)
	for _, e := range s.inst {
		if e.inflight {
			out.InFlight++
		}
		if e.out {
			out.OutOfRotation++
		}
		if e.overdue {
			out.Overdue++
		}
		if e.every > s.cfg.PollInterval {
			out.Stretched++
		}
	}
	return out
}

func clone(m map[string]int64) map[string]int64 {
	c := make(map[string]int64, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Run publishes sync jobs as instances fall due until ctx ends. Failures
// to publish are reported and retried at the next poll. With a leader term
// (nil: unfenced), each dispatch and each publish first checks it (nothing
// is published once it fails) and every job carries its epoch.
func (s *Scheduler) Run(ctx context.Context, term *Term) {
	defer s.own(ctx)()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
		wait := s.dispatch(ctx, term)
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

type dispatchItem struct {
	key, id, reason string
	due             time.Time
	tie             uint64
}

// dispatch publishes every due job and returns how long to sleep.
func (s *Scheduler) dispatch(ctx context.Context, term *Term) time.Duration {
	if term.Check() != nil {
		return s.cfg.PollInterval // stepping down: the term logged why
	}
	fenced := term.PublishOptions()
	now := time.Now()
	var items []dispatchItem
	s.mu.Lock()
	next := now.Add(s.cfg.PollInterval)
	for _, e := range s.inst {
		s.checkOverdue(e, now)
		if e.inflight {
			if now.Sub(e.sentAt) > s.cfg.InflightTimeout {
				s.log.Warn("no result for a sync job; releasing the instance", "instance", e.key, "job", e.jobID, "sent", e.sentAt)
				e.inflight = false
				e.due = now
			} else {
				continue
			}
		}
		if e.due.After(now) {
			next = minTime(next, e.due)
			continue
		}
		items = append(items, s.take(e, now))
	}
	s.mu.Unlock()

	// Oldest due first; ties at random (fixed per instance), never by name.
	slices.SortFunc(items, func(a, b dispatchItem) int {
		return cmp.Or(a.due.Compare(b.due), cmp.Compare(a.tie, b.tie))
	})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := s.bus.Publish(ctx, s.bus.Subjects().Sync(it.key), events.TypeSyncJob, it.id, events.SyncJob{Key: it.key, Reason: it.reason}, fenced...)
			s.mu.Lock()
			defer s.mu.Unlock()
			if err != nil {
				if e, ok := s.inst[it.key]; ok && e.jobID == it.id {
					e.inflight = false
					e.due = time.Now().Add(s.cfg.PollInterval)
					if it.reason != events.ReasonPoll && it.reason != events.ReasonResync && it.reason != events.ReasonProbe {
						e.reason = it.reason
					}
				}
				if ctx.Err() == nil && s.report != nil && !errors.Is(err, events.ErrFenced) {
					s.reportAsync(events.Error{Kind: events.ErrorDiscovery, Instance: it.key, Message: fmt.Sprintf("publish sync job: %v", err)})
				}
				return
			}
			s.stats.Dispatched[it.reason]++
			s.stats.LastDispatch = time.Now()
		}()
	}
	wg.Wait()
	return max(time.Until(next), 10*time.Millisecond)
}

// take marks due instance e's job out at now and returns it: a full sync
// of the reason a trigger set, a probe when e is out of rotation, a resync
// once SyncInterval has passed since its last full sync, else a poll
// (caller holds s.mu).
func (s *Scheduler) take(e *schedEntry, now time.Time) dispatchItem {
	reason := e.reason
	switch {
	case reason != "":
	case e.out:
		reason = events.ReasonProbe
	case e.lastFull.IsZero() || now.Sub(e.lastFull) >= s.cfg.SyncInterval:
		reason = events.ReasonResync
	default:
		reason = events.ReasonPoll
	}
	s.seq++
	id := fmt.Sprintf("sync:%s:%s:%d", e.key, s.epoch, s.seq)
	it := dispatchItem{key: e.key, id: id, reason: reason, due: e.due, tie: e.tie}
	e.inflight, e.sentAt, e.jobID, e.jobReason, e.reason = true, now, id, reason, ""
	return it
}

// checkOverdue marks e overdue when its last good sync (or its start) is
// older than SyncInterval + PollInterval (caller holds s.mu).
func (s *Scheduler) checkOverdue(e *schedEntry, now time.Time) {
	ref := e.lastGood
	if ref.IsZero() {
		ref = e.since
	}
	if e.overdue || now.Sub(ref) <= s.cfg.SyncInterval+s.cfg.PollInterval {
		return
	}
	e.overdue = true
	cause := "capacity"
	if e.out || e.fails > 0 {
		cause = "backoff"
	}
	s.stats.Missed[cause]++
	s.log.Warn("instance missed its sync interval", "instance", e.key, "cause", cause,
		"last_good_sync", ref, "interval", s.cfg.SyncInterval, "in_flight", e.inflight, "error", e.lastErr)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
