package faulttest

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"
)

// apiOutage is how long the tests keep kube-apiserver stopped (restarting
// it takes a few seconds more).
const apiOutage = 20 * time.Second

// stopAPI stops kube-apiserver (etcd keeps the data) and returns a function
// that starts it again and returns when it is ready.
func stopAPI(t *testing.T) func() time.Time {
	t.Helper()
	if err := cluster.StopAPIServer(); err != nil {
		t.Logf("stop kube-apiserver: %v", err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := cluster.StartAPIServer(ctx); err != nil {
				t.Errorf("restart kube-apiserver: %v", err)
			}
		}
	})
	return func() time.Time {
		t.Helper()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cluster.StartAPIServer(ctx); err != nil {
			t.Fatalf("restart kube-apiserver: %v", err)
		}
		restarted = true
		t.Logf("measured: kube-apiserver ready %v after its restart", time.Since(start).Round(time.Millisecond))
		return time.Now()
	}
}

// noFlood checks that no process published two error events for the same
// kind and target within the rate-limit window.
func noFlood(t *testing.T, list []errEvent) {
	t.Helper()
	last := map[string]errEvent{}
	for _, e := range list {
		k := fmt.Sprintf("%s|%s|%s|%s|%s", e.Err.Worker, e.Err.Kind, e.Err.Instance, e.Err.Service, e.Err.Subject)
		if p, ok := last[k]; ok && e.At.Sub(p.At) < errorWindow-time.Second {
			t.Errorf("two error events for the same target within %v:\n%s", errorWindow, formatErrs([]errEvent{p, e}))
		}
		last[k] = e
	}
}

// TestAPIServerOutage (issue point 4): kube-apiserver is stopped for
// apiOutage while two worker processes run, with a retry budget (8 s)
// shorter than the outage. During the outage one instance goes away and
// another appears. No process crashes; the failing API calls are retried
// with backoff, jobs whose budget runs out are parked and redelivered;
// error events report the outage per instance and kind (never one per
// Service), at most once per rate-limit window; and after the API server
// is back, everything converges: the new instance has its Services, the
// gone one none, the staying one the same Services as before.
func TestAPIServerOutage(t *testing.T) {
	w := newWorld(t)
	spec := fleetSpec{hosts: 10, switches: 2, shelves: 2}
	stay, gone, fresh := w.newInstance("stay", spec, 0), w.newInstance("gone", spec, 0), w.newInstance("fresh", spec, 0)
	// A retry budget shorter than the outage, so that failures are reported.
	workers := []*proc{w.startWorker("w1", "--retry-max-elapsed", "8s"), w.startWorker("w2", "--retry-max-elapsed", "8s")}
	disc := w.startStaticDiscovery(stay, gone)
	keep := uidsOf(stay.waitConverged(time.Minute))
	gone.waitConverged(time.Minute)

	down := time.Now()
	start := stopAPI(t)
	disc.Remove(gone)
	disc.Add(fresh)
	time.Sleep(apiOutage)
	for _, p := range workers {
		if p.Exited() {
			t.Fatalf("%s exited during the API outage: %v\n%s", p.name, p.state, p.log.Tail(30))
		}
	}
	up := start()
	fresh.waitConverged(time.Minute)
	gone.waitGone(time.Minute)
	t.Logf("measured: converged %v after the API server was back (outage %v)", time.Since(up).Round(time.Millisecond), up.Sub(down).Round(time.Millisecond))
	if got := uidsOf(stay.services()); !maps.Equal(got, keep) {
		t.Errorf("the staying instance's Services changed")
	}
	list := w.errs.Since(down)
	t.Logf("error events since the outage began (%d):\n%s", len(list), formatErrs(list))
	noFlood(t, list)
	if len(list) == 0 {
		t.Error("no error event reported the outage")
	}
	// Without flooding: transient failures are reported per instance and
	// kind, never per Service, so the count does not grow with the fleet.
	windows := int(up.Sub(down)/errorWindow) + 2
	if max := len(workers) * 3 * 2 * windows; len(list) > max {
		t.Errorf("%d error events, more than %d (workers × kinds × instances × rate-limit windows)", len(list), max)
	}
	for _, e := range list {
		if e.Err.Permanent {
			t.Errorf("an outage is transient, but an event says permanent: %s", formatErrs([]errEvent{e}))
		}
		if e.Err.Service != "" {
			t.Errorf("a transient failure reported per Service: %s", formatErrs([]errEvent{e}))
		}
	}
	if n := w.errs.Len() - len(list); n != 0 {
		t.Errorf("%d error events before the outage", n)
	}
}
