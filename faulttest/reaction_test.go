package faulttest

import (
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/plan"
)

// kubeRequests sums matbus_kube_requests_total over methods.
func kubeRequests(t *testing.T, p *proc) float64 {
	t.Helper()
	m, err := p.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, "matbus_kube_requests_total") {
			n += v
		}
	}
	return n
}

// TestReactionAndSteadyState (goal 2 of the scheduling issue): with default
// poll settings, a BMC added to or removed from a MAT status gets its
// Service created or deleted with p50 ≤ 2 s and p99 ≤ 4 s; while nothing
// changes, each instance costs at most one GET per poll interval over a
// kept-alive connection, and the worker sends no Kubernetes request.
func TestReactionAndSteadyState(t *testing.T) {
	w := newWorld(t)
	in := w.newInstance("react", fleetSpec{hosts: 10, switches: 2, shelves: 2}, 0)
	wp := w.startWorker("w1")
	w.startStaticDiscovery(in)
	in.waitConverged(time.Minute)

	// Steady state.
	time.Sleep(3 * time.Second) // the informer has seen our own writes; polls find nothing to do
	reqs, conns, kube := in.sim.Requests(), in.total.Load(), kubeRequests(t, wp)
	m0, _ := wp.Metrics()
	const window = 6 * time.Second
	time.Sleep(window)
	gets := in.sim.Requests() - reqs
	m1, _ := wp.Metrics()
	t.Logf("measured: steady %v: %d GETs, %d new connections, %v Kubernetes requests, %v unchanged polls",
		window, gets, in.total.Load()-conns, kubeRequests(t, wp)-kube,
		m1["matbus_worker_syncs_unchanged_total"]-m0["matbus_worker_syncs_unchanged_total"])
	if gets > int64(window/time.Second)+1 {
		t.Errorf("%d status GETs in %v, want at most one per 1s poll interval", gets, window)
	}
	if gets < 2 {
		t.Errorf("%d status GETs in %v: the instance is not polled", gets, window)
	}
	if n := in.total.Load() - conns; n != 0 {
		t.Errorf("%d new TCP connections in steady state, want 0 (keep-alive)", n)
	}
	if n := kubeRequests(t, wp) - kube; n != 0 {
		t.Errorf("%v Kubernetes requests in steady state, want 0", n)
	}

	// Reaction: remove and re-add single BMCs.
	full := in.sim.Fleet()
	var lat []time.Duration
	svcs := adminKube.CoreV1().Services(w.ns)
	exists := func(name string) bool {
		_, err := svcs.Get(w.ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("get %s: %v", name, err)
		}
		return err == nil
	}
	for i := range 10 {
		d := full.Machines[i%len(full.Machines)]
		name := plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)
		start := time.Now()
		if err := in.sim.RemoveDevice(d.MatID); err != nil {
			t.Fatal(err)
		}
		w.waitFor(name+" deleted", 30*time.Second, func() (bool, string) { return !exists(name), "still there" })
		lat = append(lat, time.Since(start))
		time.Sleep(time.Duration(300+100*i%700) * time.Millisecond)
		start = time.Now()
		if err := in.sim.SetFleet(full); err != nil {
			t.Fatal(err)
		}
		w.waitFor(name+" created", 30*time.Second, func() (bool, string) { return exists(name), "missing" })
		lat = append(lat, time.Since(start))
		time.Sleep(time.Duration(300+170*i%700) * time.Millisecond)
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("measured: reaction over %d changes: p50 %v, p99 %v", len(lat), p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	if p50 > 2*time.Second || p99 > 4*time.Second {
		t.Errorf("reaction p50 %v, p99 %v; want at most 2 s and 4 s", p50, p99)
	}
}
