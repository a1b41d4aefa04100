package discovery

import (
	"testing"
	"time"

	"github.com/matbus/matbus/events"
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
