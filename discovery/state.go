package discovery

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

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
		st := events.InstanceState{Key: k, InRotation: !e.out, PollIntervalMS: s.cfg.PollInterval.Milliseconds(),
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
// and deletes the entries of instances no longer scheduled. The state is a
// view for `matbus status`; a failed write is logged and tried again.
type stateWriter struct {
	bus      *events.Bus
	sched    *Scheduler
	identity string
	log      *slog.Logger
	every    time.Duration
	refresh  time.Duration
}

// stateWriter returns the state writer of p's scheduler; the bus's Source
// names the leader.
func (p *Publisher) stateWriter() *stateWriter {
	return &stateWriter{bus: p.bus, sched: p.sched, identity: p.bus.Config().Source, log: p.log.With("part", "state"),
		every: time.Second, refresh: events.StateRefresh}
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
	// Entries of an earlier leader for instances no longer present go at
	// the first pass.
	if lister, err := kv.ListKeysFiltered(ctx, events.StateInstancesIn(ns)); err == nil {
		for k := range lister.Keys() {
			written[k[len("instance."):]] = events.InstanceState{}
		}
	}
	since := time.Now()
	var leaderAt time.Time
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		now := time.Now()
		if now.Sub(leaderAt) >= w.refresh {
			b, _ := json.Marshal(events.LeaderState{Identity: w.identity, Since: since, Updated: now})
			if _, err := kv.Put(ctx, events.StateLeaderKey(ns), b); err == nil {
				leaderAt = now
			} else if ctx.Err() == nil {
				w.log.Warn("state bucket: leader entry not written", "error", err)
			}
		}
		cur := w.sched.States()
		for k, st := range cur {
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
