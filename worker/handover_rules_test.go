package worker

import (
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// TestHandoverRules: a worker stands by for the newest live, active
// worker of another fingerprint that started after it, and waits at
// start for the live, active ones of another fingerprint that started
// before it; workers of its own fingerprint, standing-by ones and stale
// ones count for neither.
func TestHandoverRules(t *testing.T) {
	now := time.Now()
	p := func(name, fp string, epoch uint64, standby bool, age time.Duration) peer {
		return peer{state: events.WorkerState{Name: name, Fingerprint: fp, Standby: standby}, epoch: epoch, seen: now.Add(-age)}
	}
	peers := []peer{
		p("a-old", "A", 3, false, time.Second),
		p("b-older", "B", 2, false, time.Second),
		p("b-newer", "B", 9, false, time.Second),
		p("c-newest-standby", "C", 12, true, time.Second),
		p("d-newest-stale", "D", 15, false, events.WorkerStale+time.Second),
		p("b-same-later", "A", 20, false, time.Second),
	}
	cases := []struct {
		fp        string
		epoch     uint64
		standFor  string // "" for none
		waitOlder []string
	}{
		{fp: "A", epoch: 5, standFor: "b-newer", waitOlder: []string{"b-older"}},
		{fp: "A", epoch: 1, standFor: "b-newer"},
		{fp: "B", epoch: 10, standFor: "b-same-later", waitOlder: []string{"a-old"}},
		{fp: "A", epoch: 30, waitOlder: []string{"b-older", "b-newer"}},
		{fp: "E", epoch: 30, waitOlder: []string{"a-old", "b-older", "b-newer", "b-same-later"}},
	}
	for _, c := range cases {
		got, ok := newerConfig(c.fp, c.epoch, peers, now)
		if name := got.state.Name; (c.standFor == "") == ok || (ok && name != c.standFor) {
			t.Errorf("%s@%d: stands by for %q (%v), want %q", c.fp, c.epoch, name, ok, c.standFor)
		}
		var older []string
		for _, o := range olderConfig(c.fp, c.epoch, peers, now) {
			older = append(older, o.state.Name)
		}
		if len(older) != len(c.waitOlder) {
			t.Errorf("%s@%d: waits for %v, want %v", c.fp, c.epoch, older, c.waitOlder)
			continue
		}
		for i := range older {
			if older[i] != c.waitOlder[i] {
				t.Errorf("%s@%d: waits for %v, want %v", c.fp, c.epoch, older, c.waitOlder)
				break
			}
		}
	}
}
