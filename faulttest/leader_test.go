package faulttest

import (
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
)

// announcements records who published each appeared event, and when.
type announcements struct {
	mu   sync.Mutex
	list []announcement
}

type announcement struct {
	at     time.Time
	source string
	key    string
}

func (a *announcements) add(m *nats.Msg) {
	env, err := events.Decode(m.Data)
	if err != nil || env.Type != events.TypeInstanceAppeared {
		return
	}
	inst, err := events.Into[events.Instance](env, events.TypeInstanceAppeared)
	if err != nil {
		return
	}
	a.mu.Lock()
	a.list = append(a.list, announcement{at: time.Now(), source: env.Source, key: inst.Key})
	a.mu.Unlock()
}

// by returns the keys announced by source since t0.
func (a *announcements) by(source string, t0 time.Time) map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]bool{}
	for _, x := range a.list {
		if x.source == source && !x.at.Before(t0) {
			out[x.key] = true
		}
	}
	return out
}

// TestLeaderElectedDiscovery (issue point 8): two `matbus discovery`
// processes (Kubernetes discovery, leader election on a Lease with a 4 s
// lease) and two workers. The leader is killed with SIGKILL: the other
// process takes the Lease once it expires, republishes the current state
// (an appeared event and a sync job for every instance), and the workers
// handle the repeated appeared events idempotently (every Service keeps its
// UID and resourceVersion). The new leader then publishes changes (one
// instance appears, one goes). Then it is stopped cleanly (SIGTERM): it
// releases the Lease and a third process takes over at once.
func TestLeaderElectedDiscovery(t *testing.T) {
	w := newWorld(t)
	spec := fleetSpec{hosts: 3, switches: 1}
	a, b, c, d := w.newInstance("mat-a", spec, 0), w.newInstance("mat-b", spec, 0), w.newInstance("mat-c", spec, 0), w.newInstance("mat-d", spec, 0)
	seen := &announcements{}
	if _, err := w.nc.Subscribe(w.bus.Subjects().Instances(), seen.add); err != nil {
		t.Fatal(err)
	}
	w.discover(a)
	w.discover(b)
	w.startWorker("w1")
	w.startWorker("w2")
	procs := map[string]*proc{"disc-1": w.startDiscovery("disc-1"), "disc-2": w.startDiscovery("disc-2")}
	holder := func() string {
		l, err := adminKube.CoordinationV1().Leases(w.ns).Get(w.ctx, "matbus-discovery", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	w.waitFor("a leader", 30*time.Second, func() (bool, string) { return holder() != "", "no holder" })
	leader := holder()
	follower := "disc-1"
	if leader == "disc-1" {
		follower = "disc-2"
	}
	a.waitConverged(time.Minute)
	before := versions(b.waitConverged(time.Minute))
	before2 := versions(a.services())

	// The leader dies.
	killed := time.Now()
	procs[leader].Kill()
	took := w.waitFor("the follower takes the Lease", 30*time.Second, func() (bool, string) {
		h := holder()
		return h == follower, "holder " + h
	})
	t.Logf("measured: after SIGKILL of leader %s, %s holds the Lease %v later (lease duration 4 s)", leader, follower, took.Round(time.Millisecond))
	w.waitFor("the new leader republishes every instance", 30*time.Second, func() (bool, string) {
		got := seen.by("discovery/"+follower, killed)
		return got[a.key()] && got[b.key()], "not yet"
	})
	t.Logf("measured: current state republished by the new leader %v after the kill", time.Since(killed).Round(time.Millisecond))
	time.Sleep(2 * syncInterval) // the workers handle the repeated events and a tick or two
	if got := versions(b.services()); !maps.Equal(got, before) {
		t.Errorf("the repeated appeared events changed mat-b's Services")
	}
	if got := versions(a.services()); !maps.Equal(got, before2) {
		t.Errorf("the repeated appeared events changed mat-a's Services")
	}

	// The new leader publishes changes.
	start := time.Now()
	w.discover(c)
	w.undiscover(a)
	c.waitConverged(30 * time.Second)
	a.waitGone(30 * time.Second)
	t.Logf("measured: changes after the takeover handled in %v", time.Since(start).Round(time.Millisecond))

	// A clean stop releases the Lease: a third process takes over at once.
	procs["disc-3"] = w.startDiscovery("disc-3")
	stopped := time.Now()
	if _, code := procs[follower].Term(30 * time.Second); code != 0 {
		t.Errorf("%s exit status %d after SIGTERM", follower, code)
	}
	took = w.waitFor("disc-3 takes the Lease", 30*time.Second, func() (bool, string) {
		h := holder()
		return h == "disc-3", "holder " + h
	})
	t.Logf("measured: after SIGTERM of leader %s, disc-3 holds the Lease %v later", follower, took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("a released Lease took %v to be taken (lease duration 4 s): was it released?", took)
	}
	w.discover(d)
	d.waitConverged(30 * time.Second)
	if got := seen.by("discovery/disc-3", stopped); !got[d.key()] {
		t.Errorf("mat-d was not announced by disc-3")
	}
	for _, e := range w.errs.All() {
		if !strings.HasPrefix(string(e.Err.Kind), "discovery") {
			t.Errorf("error event: %s", formatErrs([]errEvent{e}))
		}
	}
	t.Logf("error events:\n%s", w.errs)
}
