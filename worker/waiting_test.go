package worker_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// The tests of this file poll every pollInterval and resync fully only
// every fullResync, far beyond the test: whatever they see re-created was
// re-created by a poll.
const (
	pollInterval = time.Second
	fullResync   = 10 * time.Minute
)

// startPolling runs a publisher of entries that polls every pollInterval
// and resyncs every fullResync.
func (e *env) startPolling(entries ...discovery.StaticEntry) *discovery.StaticSource {
	e.t.Helper()
	src, err := discovery.NewStatic("test", entries)
	if err != nil {
		e.t.Fatalf("static source: %v", err)
	}
	e.startPublisherWith(src, discovery.PublisherConfig{SyncInterval: fullResync,
		Scheduler: discovery.SchedulerConfig{PollInterval: pollInterval}})
	return src
}

// TestHolderGoneServicesComeBack: two discovered instances on one MAT URL
// want the same nine Services; each gets some, and the other's are
// collisions, which cost no API request while nothing changes. A Service
// of the holder deleted by hand is back within two
// poll intervals; then the instance holding the most goes away: its
// Services are deleted, and the other instance has all nine within two
// poll intervals of the last delete, with no full resync in between.
func TestHolderGoneServicesComeBack(t *testing.T) {
	e := newEnv(t)
	f, err := matsim.Generate(matsim.FleetSpec{Hosts: 3, DPUsPerHost: 2, BMCSubnet: "10.101.0.0/24", Seed: 21})
	if err != nil {
		t.Fatal(err)
	}
	want := wantServiceNames(f)
	if len(want) != 9 {
		t.Fatalf("fleet has %d Services, want 9", len(want))
	}
	sim := e.startSim(matsim.Options{Fleet: f})
	a, b := e.entry("mat-a", sim.URL()), e.entry("mat-b", sim.URL())
	src := e.startPolling(a, b)
	w := e.startWorker(workerOpts{})
	e.waitServices(want...)
	// Each waits for the other's Services, at no cost.
	e.steady(w, sim)

	// A Service deleted by hand while both want it: whichever instance
	// polls first creates it again.
	holders := e.holders()
	victim := want[0]
	if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFor(t, victim+" re-created", func() (bool, string) { return e.service(victim) != nil, "missing" })
	back := time.Since(deleted)
	t.Logf("measured: %s (of %s) deleted by hand, back after %v", victim, holders[victim], back.Round(10*time.Millisecond))
	if back > 2*pollInterval {
		t.Errorf("%s was back only after %v, want within two poll intervals (%v)", victim, back, 2*pollInterval)
	}

	holders = e.holders()
	count := map[string]int{}
	for _, h := range holders {
		count[h]++
	}
	gone, stays := a, b
	if count[plan.LabelValue(e.key(b.Name))] > count[plan.LabelValue(e.key(a.Name))] {
		gone, stays = b, a
	}
	t.Logf("split: %v; %s goes away", count, gone.Name)
	if err := src.Set([]discovery.StaticEntry{stays}); err != nil {
		t.Fatal(err)
	}
	e.waitHeldBy(want, e.key(gone.Name), e.key(stays.Name))
}

// TestIPHolderGoneServiceComes: two instances report one BMC IP for
// different devices (cluster-ip mode). The first one's Service holds the
// IP; the second's create is refused permanently. When the first instance
// goes away, the second's Service exists within two poll intervals of the
// holder's delete, with no full resync in between; until then its polls
// cost no API request.
func TestIPHolderGoneServiceComes(t *testing.T) {
	e := newEnv(t)
	fa, fb, shared := sharedIPFleets(t, "10.101.1.0/24", "10.101.2.0/24", 22)
	sa, sb := e.startSim(matsim.Options{Fleet: fa}), e.startSim(matsim.Options{Fleet: fb})
	a, b := e.entry("mat-a", sa.URL()), e.entry("mat-b", sb.URL())
	src := e.startPolling(a)
	w := e.startWorker(workerOpts{})
	e.waitServices(wantServiceNames(fa)...)

	if err := src.Set([]discovery.StaticEntry{a, b}); err != nil {
		t.Fatal(err)
	}
	loser := plan.ServiceName(plan.MachineTypeHost, fb.Machines[0].MatID)
	e.waitAllocationRefused(loser, shared)
	// The refusal is not tried again while nothing changes.
	e.steady(w, sb)
	if e.service(loser) != nil {
		t.Fatalf("%s exists while %s holds its IP", loser, a.Name)
	}

	if err := src.Set([]discovery.StaticEntry{b}); err != nil {
		t.Fatal(err)
	}
	e.waitHeldBy(wantServiceNames(fb), e.key(a.Name), e.key(b.Name))
	if s := e.service(loser); s == nil || s.Spec.ClusterIP != shared {
		t.Errorf("%s does not hold %s: %+v", loser, shared, s)
	}
}

// sharedIPFleets returns two generated fleets (BMC IPs from subnets a and
// b, seeds seed and seed+1) whose first machines report the same BMC IP,
// and that IP.
func sharedIPFleets(t *testing.T, a, b string, seed int64) (*matsim.Fleet, *matsim.Fleet, string) {
	t.Helper()
	fa, fb := generatedFleet(t, a, seed), generatedFleet(t, b, seed+1)
	fb.Machines[0].BMC.IP = fa.Machines[0].BMC.IP
	return fa, fb, fa.Machines[0].BMC.IP
}

// waitAllocationRefused waits for a permanent create event of Service name
// saying that ip is already allocated.
func (e *env) waitAllocationRefused(name, ip string) {
	e.t.Helper()
	waitFor(e.t, "a permanent create event for "+name, func() (bool, string) {
		for _, ev := range e.errs.Of(errKind("create")) {
			if ev.Service == e.ns+"/"+name && ev.Permanent && hasAll(ev.Message, ip, "allocated") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("create events: %+v", e.errs.Of(errKind("create")))
	})
}

// holders maps the names of the namespace's Services to their instance
// label values.
func (e *env) holders() map[string]string {
	out := map[string]string{}
	for n, s := range e.services() {
		out[n] = s.Labels[plan.LabelInstance]
	}
	return out
}

// waitHeldBy waits until no Service of instance gone is left and want are
// exactly the namespace's Services, all of instance stays; it fails the
// test when that took more than two poll intervals after the last Service
// of gone was seen.
func (e *env) waitHeldBy(want []string, gone, stays string) {
	e.t.Helper()
	goneV, staysV := plan.LabelValue(gone), plan.LabelValue(stays)
	lastGone := time.Now()
	waitFor(e.t, "every Service held by "+stays, func() (bool, string) {
		h := e.holders()
		var other, missing []string
		for n, v := range h {
			if v == goneV {
				lastGone = time.Now()
			}
			if v != staysV {
				other = append(other, n+"="+v)
			}
		}
		for _, n := range want {
			if _, ok := h[n]; !ok {
				missing = append(missing, n)
			}
		}
		slices.Sort(other)
		return len(other) == 0 && len(missing) == 0 && len(h) == len(want),
			fmt.Sprintf("not of %s: %s; missing: %s", stays, strings.Join(other, ","), strings.Join(missing, ","))
	})
	took := time.Since(lastGone)
	e.t.Logf("measured: every Service held by %s %v after the last of %s was seen", stays, took.Round(10*time.Millisecond), gone)
	if took > 2*pollInterval {
		e.t.Errorf("the Services came back %v after the holder's last one went, want within two poll intervals (%v)", took, 2*pollInterval)
	}
}

// steady lets a few polls of sim pass (the first may plan again after the
// worker's own writes) and then fails the test if the worker makes any
// API request during four more.
func (e *env) steady(w *testWorker, sim *matsim.Server) {
	e.t.Helper()
	polls := func(n int64) {
		e.t.Helper()
		reqs := sim.Requests()
		waitFor(e.t, fmt.Sprintf("%d polls", n), func() (bool, string) {
			return sim.Requests() >= reqs+n, fmt.Sprintf("requests %d", sim.Requests())
		})
	}
	polls(4)
	before := w.api.all()
	polls(4)
	if after := w.api.all(); !maps.Equal(before, after) {
		e.t.Errorf("API requests while nothing changed: before %v, after %v", before, after)
	}
}

// all returns a copy of the request counts.
func (c *apiCalls) all() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}
