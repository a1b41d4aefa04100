package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

// TestStateChanged: a state entry is rewritten at once when rotation,
// failures, intervals, error or the health of the outcome change, and
// otherwise (a later good sync, another worker, synced after unchanged)
// only once the refresh period has passed.
func TestStateChanged(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	old := events.InstanceState{Key: "ns.a", InRotation: true, PollIntervalMS: 1000, LastGoodSync: t0, Worker: "w1",
		LastOutcome: events.OutcomeUnchanged, Updated: t0}
	const refresh = 10 * time.Second
	for _, c := range []struct {
		name  string
		edit  func(*events.InstanceState)
		after time.Duration
		want  bool
	}{
		{"nothing new", func(*events.InstanceState) {}, time.Minute, false},
		{"out of rotation", func(s *events.InstanceState) { s.InRotation, s.ProbeIntervalMS, s.FailedFetches = false, 2000, 3 }, time.Second, true},
		{"a failed fetch", func(s *events.InstanceState) {
			s.FailedFetches, s.LastOutcome, s.LastError = 1, events.OutcomeFetchFailed, "HTTP 500"
		}, time.Second, true},
		{"an apply failure", func(s *events.InstanceState) { s.LastOutcome = events.OutcomeApplyFailed }, time.Second, true},
		{"poll interval", func(s *events.InstanceState) { s.PollIntervalMS = 200 }, time.Second, true},
		{"later good sync, before refresh", func(s *events.InstanceState) { s.LastGoodSync = t0.Add(time.Second) }, time.Second, false},
		{"later good sync, after refresh", func(s *events.InstanceState) { s.LastGoodSync = t0.Add(refresh) }, refresh, true},
		{"another worker, before refresh", func(s *events.InstanceState) { s.Worker = "w2" }, time.Second, false},
		{"another worker, after refresh", func(s *events.InstanceState) { s.Worker = "w2" }, refresh, true},
		{"synced after unchanged, before refresh", func(s *events.InstanceState) { s.LastOutcome = events.OutcomeSynced }, time.Second, false},
		{"synced after unchanged, after refresh", func(s *events.InstanceState) { s.LastOutcome = events.OutcomeSynced }, refresh, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := old
			c.edit(&st)
			st.Updated = time.Time{}
			if got := changed(old, st, t0.Add(c.after), refresh); got != c.want {
				t.Fatalf("changed after %v = %v, want %v (%+v)", c.after, got, c.want, st)
			}
		})
	}
}

// TestStateWriterKeepsHistory: a new leader's writer keeps the last good
// sync, worker and last outcome an earlier leader wrote for an instance it
// schedules (its own rotation and interval replace the earlier ones),
// deletes the entries of instances it does not schedule, and on leaving
// marks its leader entry ended, unless another leader wrote it since.
func TestStateWriterKeepsHistory(t *testing.T) {
	ctx := context.Background()
	b, err := events.New(testenv.NATS(t), events.Config{Namespace: "ns", Source: "discovery/new", Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := b.EnsureState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	put := func(key string, v any) {
		t.Helper()
		body, _ := json.Marshal(v)
		if _, err := kv.Put(ctx, key, body); err != nil {
			t.Fatal(err)
		}
	}
	put(events.StateInstanceKey("ns.a"), events.InstanceState{Key: "ns.a", InRotation: false, PollIntervalMS: 5000, ProbeIntervalMS: 8000,
		FailedFetches: 4, LastGoodSync: t0, Worker: "w1", LastOutcome: events.OutcomeFetchFailed, LastError: "HTTP 500", Updated: t0})
	put(events.StateInstanceKey("ns.gone"), events.InstanceState{Key: "ns.gone", Updated: t0})
	put(events.StateLeaderKey("ns"), events.LeaderState{Identity: "discovery/old", Since: t0, Updated: t0})

	sched := NewScheduler(b, SchedulerConfig{PollInterval: 200 * time.Millisecond}, nil, nil)
	sched.Set([]string{"ns.a"})
	w := &stateWriter{bus: b, sched: sched, identity: "discovery/new", log: slog.New(slog.DiscardHandler),
		every: 20 * time.Millisecond, refresh: time.Hour, endWait: 2 * time.Second}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.run(wctx) }()
	t.Cleanup(func() { stop(); <-done })

	testenv.Wait(t, 10*time.Second, "the new writer's entries", func() (bool, string) {
		states, leader, err := b.ReadState(ctx, "ns")
		a, ok := states["ns.a"]
		_, gone := states["ns.gone"]
		return err == nil && ok && a.Updated.After(t0) && !gone && leader != nil && leader.Identity == "discovery/new",
			fmt.Sprintf("%+v %+v %v", states, leader, err)
	})
	states, _, _ := b.ReadState(ctx, "ns")
	a := states["ns.a"]
	if !a.LastGoodSync.Equal(t0) || a.Worker != "w1" || a.LastOutcome != events.OutcomeFetchFailed || a.LastError != "HTTP 500" {
		t.Errorf("ns.a %+v: want the earlier leader's last good sync %v, worker w1, outcome fetch-failed, error HTTP 500", a, t0)
	}
	if !a.InRotation || a.PollIntervalMS != 200 || a.FailedFetches != 0 || a.ProbeIntervalMS != 0 {
		t.Errorf("ns.a %+v: want the new scheduler's rotation (in, poll 200ms, no failures)", a)
	}

	stop()
	<-done
	_, leader, err := b.ReadState(ctx, "ns")
	if err != nil || leader == nil || leader.Identity != "discovery/new" || leader.Ended.IsZero() || leader.Ended.Before(leader.Since) {
		t.Fatalf("leader entry after the writer ended: %+v (%v), want discovery/new with Ended set", leader, err)
	}

	// An entry another leader wrote since is left alone.
	e, err := kv.Get(ctx, events.StateLeaderKey("ns"))
	if err != nil {
		t.Fatal(err)
	}
	put(events.StateLeaderKey("ns"), events.LeaderState{Identity: "discovery/other", Since: t0, Updated: time.Now()})
	w.endLeader(ctx, kv, "ns", t0, e.Revision())
	if _, leader, _ = b.ReadState(ctx, "ns"); leader == nil || leader.Identity != "discovery/other" || !leader.Ended.IsZero() {
		t.Errorf("leader entry %+v: an ending writer overwrote another leader's entry", leader)
	}
}

// TestKeepHistory: the earlier leader's last good sync and worker stay
// until the scheduler has a later one; its outcome and error until the
// scheduler has a result.
func TestKeepHistory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := events.InstanceState{Key: "ns.a", LastGoodSync: t0, Worker: "w1", LastOutcome: events.OutcomeApplyFailed, LastError: "boom", FailedFetches: 2}
	got := keepHistory(h, events.InstanceState{Key: "ns.a", InRotation: true, PollIntervalMS: 1000})
	if !got.LastGoodSync.Equal(t0) || got.Worker != "w1" || got.LastOutcome != events.OutcomeApplyFailed || got.LastError != "boom" ||
		!got.InRotation || got.FailedFetches != 0 {
		t.Errorf("nothing learnt yet: %+v", got)
	}
	cur := events.InstanceState{Key: "ns.a", InRotation: true, LastGoodSync: t0.Add(time.Minute), Worker: "w2", LastOutcome: events.OutcomeSynced}
	if got := keepHistory(h, cur); got != cur {
		t.Errorf("a later good sync and result: %+v, want %+v", got, cur)
	}
	cur = events.InstanceState{Key: "ns.a", FailedFetches: 1, LastOutcome: events.OutcomeFetchFailed, LastError: "HTTP 500"}
	if got := keepHistory(h, cur); !got.LastGoodSync.Equal(t0) || got.Worker != "w1" || got.LastOutcome != events.OutcomeFetchFailed ||
		got.LastError != "HTTP 500" || got.FailedFetches != 1 {
		t.Errorf("a failed fetch since: %+v", got)
	}
}
