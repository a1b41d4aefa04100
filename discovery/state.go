package discovery

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// lastResult is the latest result the scheduler took for an instance,
// and the worker of the latest good one.
type lastResult struct {
	outcome, err, worker string
}

// next is l after result r.
func (l lastResult) next(r events.SyncResult) lastResult {
	l.outcome, l.err = r.Outcome, r.Error
	if r.Outcome != events.OutcomeFetchFailed && r.Outcome != events.OutcomeSkipped {
		l.worker = r.Worker
	}
	return l
}

// States returns the scheduler's view of every scheduled instance, as the
// state bucket keeps it (Updated unset), keyed by instance key.
func (s *Scheduler) States() map[string]events.InstanceState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]events.InstanceState, len(s.inst))
	for k, e := range s.inst {
		st := events.InstanceState{Key: k, InRotation: !e.out, PollIntervalMS: s.interval(e).Milliseconds(),
			FailedFetches: e.fails, LastGoodSync: e.lastGood, Worker: e.last.worker,
			LastOutcome: e.last.outcome, LastError: e.last.err}
		if e.out {
			st.ProbeIntervalMS = s.probeInterval(e.fails).Milliseconds()
		}
		out[k] = st
	}
	return out
}

// stateWriter keeps the state bucket in step with a Scheduler while its
// publisher leads: every second it writes the instances whose state
// changed (rotation, failures, outcome, error), every events.StateRefresh
// also those whose last good sync or worker moved on and the leader entry,
// and deletes the entries of instances no longer scheduled. At start it
// reads the entries an earlier leader left and keeps their history (last
// good sync, worker, last outcome and error; see keepHistory) until its
// scheduler knows newer; when ctx ends it marks its leader entry ended
// (see endLeader). The state is a view for `matbus status`; a failed write
// is logged and tried again.
type stateWriter struct {
	bus      *events.Bus
	sched    *Scheduler
	identity string
	log      *slog.Logger
	every    time.Duration
	refresh  time.Duration
	// endWait bounds the write that marks the leader entry ended once ctx
	// has ended.
	endWait time.Duration
}

// stateWriter returns the state writer of p's scheduler; the bus's Source
// names the leader.
func (p *Publisher) stateWriter() *stateWriter {
	return &stateWriter{bus: p.bus, sched: p.sched, identity: p.bus.Config().Source, log: p.log.With("part", "state"),
		every: time.Second, refresh: events.StateRefresh, endWait: 2 * time.Second}
}

func (w *stateWriter) run(ctx context.Context) {
	kv, err := w.bus.EnsureState(ctx)
	for err != nil {
		w.log.Warn("state bucket not usable; matbus status will lack this leader's view", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.refresh):
		}
		kv, err = w.bus.EnsureState(ctx)
	}
	ns := w.bus.Config().Namespace
	written := map[string]events.InstanceState{}
	// An earlier leader's entries: their history is kept until the
	// scheduler knows newer; every entry is rewritten at the first pass
	// (written holds none), those of instances no longer present deleted.
	history, _, err := w.bus.ReadState(ctx, ns)
	if err != nil && ctx.Err() == nil {
		w.log.Warn("state bucket: earlier entries not read; their last sync, worker and outcome are lost", "error", err)
	}
	for k := range history {
		written[k] = events.InstanceState{}
	}
	since := time.Now()
	var leaderAt time.Time
	var leaderRev uint64 // revision of this writer's last leader entry
	defer func() { w.endLeader(ctx, kv, ns, since, leaderRev) }()
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		now := time.Now()
		if now.Sub(leaderAt) >= w.refresh {
			b, _ := json.Marshal(events.LeaderState{Identity: w.identity, Since: since, Updated: now})
			if rev, err := kv.Put(ctx, events.StateLeaderKey(ns), b); err == nil {
				leaderAt, leaderRev = now, rev
			} else if ctx.Err() == nil {
				w.log.Warn("state bucket: leader entry not written", "error", err)
			}
		}
		cur := w.sched.States()
		for k, st := range cur {
			if h, ok := history[k]; ok {
				st = keepHistory(h, st)
				cur[k] = st
			}
			old, had := written[k]
			if had && !changed(old, st, now, w.refresh) {
				continue
			}
			st.Updated = now
			b, _ := json.Marshal(st)
			if _, err := kv.Put(ctx, events.StateInstanceKey(k), b); err != nil {
				if ctx.Err() == nil {
					w.log.Warn("state bucket: instance entry not written", "instance", k, "error", err)
				}
				continue
			}
			written[k] = st
		}
		for k := range written {
			if _, ok := cur[k]; ok {
				continue
			}
			if err := kv.Delete(ctx, events.StateInstanceKey(k)); err == nil {
				delete(written, k)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// endLeader marks the leader entry ended once ctx has ended: it rewrites
// it with Ended, within endWait, if it is still the one this writer last
// wrote (revision rev; 0: none), so that a newer leader's entry is never
// overwritten. A process that cannot write (NATS unreachable, killed)
// leaves it to turn stale.
func (w *stateWriter) endLeader(ctx context.Context, kv jetstream.KeyValue, ns string, since time.Time, rev uint64) {
	if rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.endWait)
	defer cancel()
	now := time.Now()
	b, _ := json.Marshal(events.LeaderState{Identity: w.identity, Since: since, Updated: now, Ended: now})
	if _, err := kv.Update(ctx, events.StateLeaderKey(ns), b, rev); err != nil {
		w.log.Info("state bucket: leader entry not marked ended (another leader wrote it, or NATS is not reachable)", "error", err)
		return
	}
	w.log.Info("state bucket: leader entry marked ended")
}

// keepHistory is st, the scheduler's view, with what it does not know yet
// taken from h, an earlier leader's entry: the last good sync and its
// worker while st has none as recent, the last outcome and error while st
// has no result. Rotation, intervals and failed fetches are the
// scheduler's own.
func keepHistory(h, st events.InstanceState) events.InstanceState {
	if h.LastGoodSync.After(st.LastGoodSync) {
		st.LastGoodSync, st.Worker = h.LastGoodSync, h.Worker
	}
	if st.Worker == "" {
		st.Worker = h.Worker
	}
	if st.LastOutcome == "" {
		st.LastOutcome, st.LastError = h.LastOutcome, h.LastError
	}
	return st
}

// changed reports whether st must be written over old (written at
// old.Updated): a change of rotation, failures, intervals, error or
// outcome at once, except between synced and unchanged (a poll and a full
// resync of a healthy instance); those, a later good sync and another
// worker once refresh has passed.
func changed(old, st events.InstanceState, now time.Time, refresh time.Duration) bool {
	if old.InRotation != st.InRotation || old.FailedFetches != st.FailedFetches || old.ProbeIntervalMS != st.ProbeIntervalMS ||
		old.PollIntervalMS != st.PollIntervalMS || !sameHealth(old.LastOutcome, st.LastOutcome) || old.LastError != st.LastError ||
		old.LastGoodSync.IsZero() != st.LastGoodSync.IsZero() {
		return true
	}
	return now.Sub(old.Updated) >= refresh &&
		(!old.LastGoodSync.Equal(st.LastGoodSync) || old.Worker != st.Worker || old.LastOutcome != st.LastOutcome)
}

// sameHealth reports whether outcomes a and b are the same, or both a healthy
// instance's (synced, unchanged).
func sameHealth(a, b string) bool {
	healthy := func(o string) bool { return o == events.OutcomeSynced || o == events.OutcomeUnchanged }
	return a == b || healthy(a) && healthy(b)
}
