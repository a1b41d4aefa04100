package faulttest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/matsim"
)

// startStaticDiscoveryProc starts a `matbus discovery` process on a static
// list of instances, without leader election.
func (w *world) startStaticDiscoveryProc(ident string, insts []*instance, extra ...string) *proc {
	w.t.Helper()
	var list []string
	for _, in := range insts {
		list = append(list, w.ns+"/"+in.name+"="+in.url)
	}
	health := "127.0.0.1:" + strconv.Itoa(freePort(w.t))
	args := []string{"discovery",
		"--nats-url", w.nats.URL(), "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns,
		"--identity", ident, "--health-addr", health, "--leader-elect=false",
		"--static", strings.Join(list, ","), "--sync-interval", syncInterval.String(),
	}
	p := startProc(w.t, w.dir, ident, matbusBin, append(args, extra...)...)
	p.health = health
	w.addProc(p)
	w.waitReady(p)
	return p
}

// TestFairnessWithFailingInstances (goal 3 of the scheduling issue): 20
// failing instances (10 hang, 10 answer 500) among healthy ones whose names
// sort before and after them, one worker with --jobs 2. Every healthy
// instance converges within two sync intervals plus its apply time and
// keeps being polled every interval; each failing instance has at most one
// request open at a time, is taken out of rotation with an error event,
// is probed at a growing interval, shows in the missed-interval metric and
// log, and comes back (another event) once it answers again.
func TestFairnessWithFailingInstances(t *testing.T) {
	w := newWorld(t)
	const matTimeout = 3 * time.Second // the worker's --mat-timeout
	var healthy, hang, fail500 []*instance
	for _, n := range []string{"a-healthy-0", "a-healthy-1", "z-healthy-0", "z-healthy-1"} {
		healthy = append(healthy, w.newInstance(n, fleetSpec{hosts: 5, switches: 1, shelves: 1}, 0))
	}
	for i := range 20 {
		in := w.newInstance(fmt.Sprintf("m-fail-%02d", i), fleetSpec{hosts: 1}, 0)
		// A hung request is closed by the worker at matTimeout; the sim
		// may notice a little later, when the next job's request can
		// already be there. Half a second of that lag is not counted.
		in.setClientLife(matTimeout - 500*time.Millisecond)
		if i%2 == 0 {
			in.sim.SetFault(matsim.FaultHang)
			hang = append(hang, in)
		} else {
			in.sim.SetFault(matsim.Fault500)
			fail500 = append(fail500, in)
		}
	}
	all := append(append(append([]*instance{}, healthy...), hang...), fail500...)
	w.startWorker("w1", "--jobs", "2", "--mat-timeout", matTimeout.String())
	start := time.Now()
	disc := w.startStaticDiscoveryProc("d1", all)

	bound := 2*syncInterval + 10*time.Second // two intervals plus apply time (and -race start-up)
	for _, in := range healthy {
		in.waitConverged(bound)
		t.Logf("measured: %s converged %v after discovery started", in.name, time.Since(start).Round(time.Millisecond))
	}

	// Healthy instances keep being polled every interval.
	before := map[string]int64{}
	for _, in := range all {
		before[in.name] = in.sim.Requests()
	}
	window := 4 * syncInterval
	time.Sleep(window)
	for _, in := range healthy {
		if got := in.sim.Requests() - before[in.name]; got < int64(window/syncInterval) {
			t.Errorf("%s fetched %d times in %v; want at least one per %v sync interval", in.name, got, window, syncInterval)
		}
	}

	// Failing instances: one request open at most, out of rotation, probed
	// less and less often.
	w.waitFor("every failing instance out of rotation", time.Minute, func() (bool, string) {
		var missing []string
		for _, in := range append(append([]*instance{}, hang...), fail500...) {
			if !w.errs.has(in.key(), "out of rotation") {
				missing = append(missing, in.name)
			}
		}
		return len(missing) == 0, fmt.Sprintf("no out-of-rotation event for %v", missing)
	})
	for _, in := range append(append([]*instance{}, hang...), fail500...) {
		if m := in.maxInflight.Load(); m > 1 {
			t.Errorf("%s had %d requests open at once; a failing instance holds at most one job", in.name, m)
		}
	}
	probeWindow := 8 * time.Second
	counts := map[string]int64{}
	for _, in := range fail500 {
		counts[in.name] = in.sim.Requests()
	}
	time.Sleep(probeWindow)
	for _, in := range fail500 {
		if n := in.sim.Requests() - counts[in.name]; n > int64(probeWindow/time.Second)/2 {
			t.Errorf("%s got %d requests in %v while out of rotation; probes should back off below one per 2 s", in.name, n, probeWindow)
		}
	}
	m, err := disc.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	backoff, slow := m[`matbus_scheduler_missed_intervals_total{cause="backoff"}`], m[`matbus_scheduler_missed_intervals_total{cause="capacity"}`]
	if backoff+slow < 20 || backoff < 10 {
		t.Errorf("missed_intervals_total backoff %v + capacity %v; want one per failing instance (20), the 500s under backoff", backoff, slow)
	}
	if got := m["matbus_scheduler_instances_out_of_rotation"]; got != 20 {
		t.Errorf("instances_out_of_rotation = %v, want 20", got)
	}
	if n := disc.log.Count("instance missed its sync interval"); n < 20 {
		t.Errorf("%d missed-interval log lines, want one per failing instance", n)
	}
	for _, in := range healthy {
		if disc.log.Count("missed its sync interval", "instance="+in.key()+" ") > 0 {
			t.Errorf("healthy instance %s reported as having missed its interval", in.name)
		}
	}

	// The 500s stop: the instances come back, with an event each.
	for _, in := range fail500 {
		in.sim.SetFault(matsim.FaultNone)
	}
	for _, in := range fail500 {
		in.waitConverged(time.Minute + 30*time.Second)
	}
	w.waitFor("recovery events", 30*time.Second, func() (bool, string) {
		var missing []string
		for _, in := range fail500 {
			if !w.errs.has(in.key(), "recovered") {
				missing = append(missing, in.name)
			}
		}
		sort.Strings(missing)
		return len(missing) == 0, fmt.Sprintf("no recovery event for %v", missing)
	})
}

// has reports whether an error event for instance key whose message
// contains text arrived.
func (s *errSink) has(key, text string) bool {
	for _, e := range s.All() {
		if e.Err.Instance == key && strings.Contains(e.Err.Message, text) {
			return true
		}
	}
	return false
}

// TestRequestOverlapCount checks the measure the fairness test relies on:
// requests that overlap count, one the client has given up on does not.
func TestRequestOverlapCount(t *testing.T) {
	t0 := time.Now()
	in := &instance{reqs: map[uint64]time.Time{}}
	in.setClientLife(2500 * time.Millisecond)
	endA := in.requestStarted(t0)
	endB := in.requestStarted(t0.Add(2 * time.Second)) // A's client still waits
	if got := in.maxInflight.Load(); got != 2 {
		t.Errorf("two requests within the client's life: max %d, want 2", got)
	}
	endA()
	endB()

	in = &instance{reqs: map[uint64]time.Time{}}
	in.setClientLife(2500 * time.Millisecond)
	endA = in.requestStarted(t0)
	endB = in.requestStarted(t0.Add(2600 * time.Millisecond)) // A's client gave up; A not yet ended here
	if got := in.maxInflight.Load(); got != 1 {
		t.Errorf("a request past its client's life counted as open: max %d, want 1", got)
	}
	endB()
	endC := in.requestStarted(t0.Add(2700 * time.Millisecond))
	endA()
	endC()
	if got := in.maxInflight.Load(); got != 1 {
		t.Errorf("after B ended: max %d, want 1", got)
	}

	in = &instance{reqs: map[uint64]time.Time{}} // no client life: open until served
	endA = in.requestStarted(t0)
	in.requestStarted(t0.Add(time.Hour))()
	endA()
	if got := in.maxInflight.Load(); got != 2 {
		t.Errorf("without a client life: max %d, want 2", got)
	}
}
