package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/matbus/matbus/events"
)

// PublisherConfig tunes a Publisher.
type PublisherConfig struct {
	// SyncInterval is how often every present instance gets a full resync
	// and the source is compared with the instances stream; default 30 s.
	SyncInterval time.Duration
	// Scheduler tunes the per-instance sync jobs (poll interval, backoff);
	// its SyncInterval defaults to the one above.
	Scheduler SchedulerConfig
}

// Publisher turns a Source into events: it compares the source's current
// instances with the instances stream (level-triggered, like a reconcile
// loop) and publishes instance-appeared for each new or changed instance
// (and has the Scheduler give it a full sync at once), instance-gone plus a
// clean-up job for each instance of its scope that is no longer there. The
// Scheduler publishes the sync jobs of the present instances: polls every
// PollInterval, a full resync every SyncInterval. Event ids are derived
// from the instance's previous record, so a re-published event
// de-duplicates and appeared → gone → appeared within the duplicate window
// still ends with the instance present.
type Publisher struct {
	bus    *events.Bus
	src    Source
	cfg    PublisherConfig
	log    *slog.Logger
	report *events.Reporter
	sched  *Scheduler
	lastOK atomic.Int64 // unix nanoseconds of the last successful reconcile
}

// NewPublisher returns a Publisher of src on bus.
func NewPublisher(bus *events.Bus, src Source, cfg PublisherConfig, report *events.Reporter, log *slog.Logger) *Publisher {
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = 30 * time.Second
	}
	if cfg.Scheduler.SyncInterval <= 0 {
		cfg.Scheduler.SyncInterval = cfg.SyncInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{bus: bus, src: src, cfg: cfg, log: log, report: report,
		sched: NewScheduler(bus, cfg.Scheduler, report, log.With("part", "scheduler"))}
}

// LastSuccess returns when a reconcile last read the instances stream and
// published every event it had to (zero before the first): the liveness of
// the publishing loop that a health check compares with a staleness bound.
func (p *Publisher) LastSuccess() time.Time {
	if n := p.lastOK.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Scheduler returns the publisher's scheduler (for its stats).
func (p *Publisher) Scheduler() *Scheduler { return p.sched }

// Run starts the source (src.Run; give it a SharedSource to keep the
// source running beyond this term, as `matbus discovery` does for the
// sources API) and publishes until ctx ends; it returns nil then.
// It returns an error only if the source cannot start. Call it while
// leading: on start it republishes the current state, the appeared event
// and a sync job of every instance. Run publishes unfenced, as a single
// publisher without leader election; a leader calls Lead.
func (p *Publisher) Run(ctx context.Context) error { return p.Lead(ctx, nil) }

// Lead is Run for the holder of leader term term (the term RunLeaderElected
// gives its lead function; nil: unfenced). Every reconcile and every
// publish first checks the term and nothing is published once it fails;
// every event and job carries the term's epoch, and instance events are
// stored only while their subject's last sequence is the one this
// publisher read (a newer leader's write refuses them: ADR 17).
func (p *Publisher) Lead(ctx context.Context, term *Term) error {
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if err := p.src.Run(ctx, notify); err != nil {
		return err
	}
	// Wait for the source to sync before anything can be declared gone.
	if _, err := WaitSynced(ctx, p.src); err != nil {
		return nil
	}
	sc := p.sched.Config()
	p.log.Info("discovery publishing", "scope", p.src.Scope(), "sync_interval", sc.SyncInterval, "poll_interval", sc.PollInterval, "poll_max_interval", sc.PollMaxInterval)
	sub, err := p.bus.SubscribeResults(p.sched.Result, func(subject string, err error) {
		p.fail(ctx, "", fmt.Sprintf("unreadable sync result on %s: %v", subject, err))
	})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	schedDone := make(chan struct{})
	go func() { defer close(schedDone); p.sched.Run(ctx, term) }()
	defer func() { <-schedDone }()
	stateDone := make(chan struct{})
	go func() { defer close(stateDone); p.stateWriter().run(ctx) }()
	defer func() { <-stateDone }()
	p.reconcile(ctx, term, "start")
	tick := time.NewTicker(p.cfg.SyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			p.reconcile(ctx, term, "")
		case <-tick.C:
			p.reconcile(ctx, term, "tick")
		}
	}
}

// reconcile publishes the difference between the source and the stream
// and hands the present instances to the scheduler. syncReason "start"
// republishes every instance's appeared event and has each fully synced;
// otherwise only new or changed instances are. Nothing is done once term
// (nil: no leader election) fails its check.
func (p *Publisher) reconcile(ctx context.Context, term *Term, syncReason string) {
	if term.Check() != nil {
		return // stepping down: the term logged why
	}
	cur, ok := p.src.Instances()
	if !ok {
		return
	}
	present := make([]string, 0, len(cur))
	defer func() { p.sched.Set(present) }()
	if err := p.bus.EnsureStreams(ctx); err != nil {
		p.fail(ctx, "", fmt.Sprintf("ensure streams: %v", err))
		return
	}
	recs, bad, err := p.bus.Instances(ctx)
	if err != nil {
		p.fail(ctx, "", fmt.Sprintf("read instances stream: %v", err))
		return
	}
	published := true // every publish of this reconcile succeeded
	defer func() {
		if published {
			p.lastOK.Store(time.Now().UnixNano())
		}
	}()
	scope := p.src.Scope()
	fenced := term.PublishOptions()
	// expect fences an instance event: stored only while the subject's last
	// record is the one read above (an unreadable record: unfenced).
	expect := func(key string, seq uint64) []events.PublishOption {
		if _, had := recs[key]; !had && slices.Contains(bad, key) {
			return fenced
		}
		return append(slices.Clip(fenced), events.WithExpectedLastSubjectSeq(seq))
	}
	want := map[string]bool{}
	for _, inst := range cur {
		want[inst.Key] = true
	}
	if !p.dropUnreadable(ctx, term, bad, want) {
		return
	}
	for _, inst := range cur {
		rec, had := recs[inst.Key]
		if had && rec.Present() && rec.Instance.Scope != scope {
			p.fail(ctx, inst.Key, fmt.Sprintf("instance %s is also reported by source %q; ignored here", inst.Key, rec.Instance.Scope))
			continue
		}
		changed := !had || !rec.Present() || rec.Instance != inst
		if !changed {
			present = append(present, inst.Key)
		}
		// A publisher that starts (on taking the lead) republishes the
		// current state: the appeared event of every instance, under a new
		// id (the stored record's sequence), which workers handle
		// idempotently, and a sync job for each.
		if changed || syncReason == "start" {
			id := fmt.Sprintf("appeared:%s:%s:%d", inst.Key, inst.Version, rec.Seq)
			if err := p.bus.Publish(ctx, p.bus.Subjects().Instance(inst.Key), events.TypeInstanceAppeared, id, inst, expect(inst.Key, rec.Seq)...); err != nil {
				published = false
				p.publishFailed(ctx, inst.Key, "appeared", err)
				continue
			}
			reason := events.ReasonStart
			if changed {
				p.log.Info("instance appeared", "instance", inst.Key, "url", inst.URL)
				present = append(present, inst.Key)
				reason = events.ReasonAppeared
			} else {
				p.log.Debug("instance republished", "instance", inst.Key, "url", inst.URL)
			}
			// A full sync at once (after any job the instance has out).
			p.sched.Add(inst.Key)
			p.sched.Trigger(inst.Key, reason)
		}
	}
	for key, rec := range recs {
		if want[key] || !rec.Present() || rec.Instance.Scope != scope {
			continue
		}
		id := fmt.Sprintf("gone:%s:%d", key, rec.Seq)
		if err := p.bus.Publish(ctx, p.bus.Subjects().Instance(key), events.TypeInstanceGone, id, rec.Instance, expect(key, rec.Seq)...); err != nil {
			published = false
			p.publishFailed(ctx, key, "gone", err)
			continue
		}
		p.log.Info("instance gone", "instance", key, "url", rec.Instance.URL)
		job := events.CleanupJob{Key: key, Scope: scope}
		if err := p.bus.Publish(ctx, p.bus.Subjects().Cleanup(key), events.TypeCleanupJob, fmt.Sprintf("cleanup:%s:%d", key, rec.Seq), job, fenced...); err != nil {
			published = false
			p.publishFailed(ctx, key, "clean-up job", err)
		}
	}
}

// dropUnreadable purges the unreadable records bad whose keys no current
// instance has (want): such a record only makes every worker report it
// again; the others are republished from the source by reconcile. It
// returns false, having stopped, once term fails its check.
func (p *Publisher) dropUnreadable(ctx context.Context, term *Term, bad []string, want map[string]bool) bool {
	for _, key := range bad {
		if term.Check() != nil {
			return false
		}
		if want[key] {
			p.log.Warn("unreadable instance record; republishing it from the source", "instance", key)
			continue
		}
		p.purge(ctx, key)
	}
	return true
}

// publishFailed reports a failed publish of what for instance key. A
// publish the term fenced is not reported: the term logged why it ended.
// A refused expected sequence means another publisher wrote the
// instance's subject after this one read it.
func (p *Publisher) publishFailed(ctx context.Context, key, what string, err error) {
	switch {
	case errors.Is(err, events.ErrFenced):
		p.log.Debug("not published: not leading", "instance", key, "event", what)
	case errors.Is(err, events.ErrWrongLastSequence):
		p.fail(ctx, key, fmt.Sprintf("%s not published: another publisher (a newer leader?) wrote the instance after this one read it; it is read again at the next reconcile: %v", what, err))
	default:
		p.fail(ctx, key, fmt.Sprintf("publish %s: %v", what, err))
	}
}

func (p *Publisher) fail(ctx context.Context, key, msg string) {
	if ctx.Err() != nil {
		return
	}
	if p.report != nil {
		p.report.Report(ctx, events.Error{Kind: events.ErrorDiscovery, Instance: key, Message: msg})
		return
	}
	p.log.Error("discovery failure", "instance", key, "error", msg)
}

// purge removes the stored record of key from the instances stream.
func (p *Publisher) purge(ctx context.Context, key string) {
	if err := p.bus.PurgeInstance(ctx, key); err != nil {
		p.fail(ctx, key, fmt.Sprintf("purge unreadable instance record: %v", err))
		return
	}
	p.log.Warn("unreadable instance record purged", "instance", key)
}
