package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// PublisherConfig tunes a Publisher.
type PublisherConfig struct {
	// SyncInterval is how often every present instance gets a sync job; default 30 s.
	SyncInterval time.Duration
}

// Publisher turns a Source into events: it compares the source's current
// instances with the instances stream (level-triggered, like a reconcile
// loop) and publishes instance-appeared plus a sync job for each new or
// changed instance, instance-gone plus a clean-up job for each instance of
// its scope that is no longer there, and a sync job per instance every
// SyncInterval. Event ids are derived from the instance's previous record,
// so a re-published event de-duplicates and appeared → gone → appeared
// within the duplicate window still ends with the instance present.
type Publisher struct {
	bus    *events.Bus
	src    Source
	cfg    PublisherConfig
	log    *slog.Logger
	report *events.Reporter
}

// NewPublisher returns a Publisher of src on bus.
func NewPublisher(bus *events.Bus, src Source, cfg PublisherConfig, report *events.Reporter, log *slog.Logger) *Publisher {
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = 30 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{bus: bus, src: src, cfg: cfg, log: log, report: report}
}

// Run starts the source and publishes until ctx ends; it returns nil then.
// It returns an error only if the source cannot start. Call it while
// leading (see RunLeaderElected): on start it republishes the current state,
// the appeared event and a sync job of every instance.
func (p *Publisher) Run(ctx context.Context) error {
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
	for {
		if _, ok := p.src.Instances(); ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.log.Info("discovery publishing", "scope", p.src.Scope(), "sync_interval", p.cfg.SyncInterval)
	p.reconcile(ctx, "start")
	tick := time.NewTicker(p.cfg.SyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			p.reconcile(ctx, "")
		case <-tick.C:
			p.reconcile(ctx, "tick")
		}
	}
}

// reconcile publishes the difference between the source and the stream.
// syncReason "" publishes sync jobs only for appeared instances; "start" and
// "tick" publish one for every present instance.
func (p *Publisher) reconcile(ctx context.Context, syncReason string) {
	cur, ok := p.src.Instances()
	if !ok {
		return
	}
	if err := p.bus.EnsureStreams(ctx); err != nil {
		p.fail(ctx, "", fmt.Sprintf("ensure streams: %v", err))
		return
	}
	recs, bad, err := p.bus.Instances(ctx)
	if err != nil {
		p.fail(ctx, "", fmt.Sprintf("read instances stream: %v", err))
		return
	}
	scope := p.src.Scope()
	want := map[string]bool{}
	for _, inst := range cur {
		want[inst.Key] = true
	}
	for _, key := range bad {
		if want[key] {
			p.log.Warn("unreadable instance record; republishing it from the source", "instance", key)
			continue
		}
		// Nobody's current instance: an unreadable record only makes every
		// worker report it again. Remove it.
		p.purge(ctx, key)
	}
	bucket := strconv.FormatInt(time.Now().UnixNano()/int64(p.cfg.SyncInterval), 10)
	for _, inst := range cur {
		rec, had := recs[inst.Key]
		if had && rec.Present() && rec.Instance.Scope != scope {
			p.fail(ctx, inst.Key, fmt.Sprintf("instance %s is also reported by source %q; ignored here", inst.Key, rec.Instance.Scope))
			continue
		}
		changed := !had || !rec.Present() || rec.Instance != inst
		// A publisher that starts (on taking the lead) republishes the
		// current state: the appeared event of every instance, under a new
		// id (the stored record's sequence), which workers handle
		// idempotently, and a sync job for each.
		if changed || syncReason == "start" {
			id := fmt.Sprintf("appeared:%s:%s:%d", inst.Key, inst.Version, rec.Seq)
			if err := p.bus.Publish(ctx, p.bus.Subjects.Instance(inst.Key), events.TypeInstanceAppeared, id, inst); err != nil {
				p.fail(ctx, inst.Key, fmt.Sprintf("publish appeared: %v", err))
				continue
			}
			if changed {
				p.log.Info("instance appeared", "instance", inst.Key, "url", inst.URL)
			} else {
				p.log.Debug("instance republished", "instance", inst.Key, "url", inst.URL)
			}
			p.sync(ctx, inst.Key, "appeared", fmt.Sprintf("sync:%s:appeared:%d", inst.Key, rec.Seq))
			continue
		}
		if syncReason != "" {
			p.sync(ctx, inst.Key, syncReason, fmt.Sprintf("sync:%s:%s", inst.Key, bucket))
		}
	}
	for key, rec := range recs {
		if want[key] || !rec.Present() || rec.Instance.Scope != scope {
			continue
		}
		id := fmt.Sprintf("gone:%s:%d", key, rec.Seq)
		if err := p.bus.Publish(ctx, p.bus.Subjects.Instance(key), events.TypeInstanceGone, id, rec.Instance); err != nil {
			p.fail(ctx, key, fmt.Sprintf("publish gone: %v", err))
			continue
		}
		p.log.Info("instance gone", "instance", key, "url", rec.Instance.URL)
		job := events.CleanupJob{Key: key, Scope: scope}
		if err := p.bus.Publish(ctx, p.bus.Subjects.Cleanup(key), events.TypeCleanupJob, fmt.Sprintf("cleanup:%s:%d", key, rec.Seq), job); err != nil {
			p.fail(ctx, key, fmt.Sprintf("publish clean-up job: %v", err))
		}
	}
}

func (p *Publisher) sync(ctx context.Context, key, reason, id string) {
	if err := p.bus.Publish(ctx, p.bus.Subjects.Sync(key), events.TypeSyncJob, id, events.SyncJob{Key: key, Reason: reason}); err != nil {
		p.fail(ctx, key, fmt.Sprintf("publish sync job: %v", err))
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
	s, err := p.bus.JS.Stream(ctx, p.bus.StreamName("INSTANCES"))
	if err == nil {
		err = s.Purge(ctx, jetstream.WithPurgeSubject(p.bus.Subjects.Instance(key)))
	}
	if err != nil {
		p.fail(ctx, key, fmt.Sprintf("purge unreadable instance record: %v", err))
		return
	}
	p.log.Warn("unreadable instance record purged", "instance", key)
}
