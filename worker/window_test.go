package worker

import "testing"

// fixedWindow is a KubeWindow whose limits the test sets.
type fixedWindow struct{ limit, max int }

func (f *fixedWindow) InFlightLimit() int { return f.limit }
func (f *fixedWindow) MaxInFlight() int   { return f.max }

// The delete jobs follow the Kubernetes client's in-flight limit (a
// quarter more, at least 4) up to DeleteJobs, which defaults to twice its
// ceiling; without an adaptive limit the slots alone bound them (32 by
// default), as does Concurrency.
func TestDeleteWindowFollowsKubeLimit(t *testing.T) {
	c := Config{}.withDefaults()
	if c.DeleteJobs != 32 || c.Concurrency != 32 || c.deleteWindow() != nil {
		t.Fatalf("without Kube: delete jobs %d, concurrency %d, window set %v; want 32, 32, none", c.DeleteJobs, c.Concurrency, c.deleteWindow() != nil)
	}
	kw := &fixedWindow{limit: 16, max: 64}
	c = Config{Kube: kw}.withDefaults()
	if c.DeleteJobs != 128 || c.Concurrency != 128 {
		t.Fatalf("with Kube (ceiling 64): delete jobs %d, concurrency %d; want 128 each", c.DeleteJobs, c.Concurrency)
	}
	win := c.deleteWindow()
	for _, tc := range []struct{ limit, want int }{{1, 5}, {2, 6}, {16, 20}, {32, 40}, {64, 80}} {
		kw.limit = tc.limit
		if got := win(); got != tc.want {
			t.Errorf("in-flight limit %d: window %d, want %d", tc.limit, got, tc.want)
		}
	}
	c = Config{Kube: kw, DeleteJobs: 10, Concurrency: 7}.withDefaults()
	if c.DeleteJobs != 10 || c.Concurrency != 7 {
		t.Errorf("explicit values %d and %d, want 10 and 7 kept", c.DeleteJobs, c.Concurrency)
	}
}
