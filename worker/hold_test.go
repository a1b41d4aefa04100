package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/operator"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// holdFleetSize is the number of BMCs of the instance in the hold tests.
const holdFleetSize = 400

// holdWorld is one instance of holdFleetSize BMCs synced by one worker
// whose hold rule is the default share with a short window, a watch of
// the namespace's Service deletes, and the Services as they first
// converged.
type holdWorld struct {
	e      *env
	sim    *matsim.Server
	fleet  *matsim.Fleet
	key    string
	window time.Duration
	w      *testWorker
	past   []*testWorker // workers stopped by restart
	n      int           // workers started
	before map[string]*corev1.Service
	tweak  func(*worker.Config)

	mu      sync.Mutex
	deletes []time.Time // when each Service delete was seen
}

func newHoldWorld(t *testing.T, window time.Duration, tweak func(*worker.Config)) *holdWorld {
	e := newEnv(t)
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: holdFleetSize, BMCSubnet: "10.103.0.0/22", Seed: 31})
	if err != nil {
		t.Fatal(err)
	}
	h := &holdWorld{e: e, fleet: fleet, key: e.key("mat-a"), window: window, tweak: tweak}
	h.sim = e.startSim(matsim.Options{Fleet: fleet, EpochID: "2026-12-06T04:00:00.000000001Z"})
	e.startDiscovery(e.entry("mat-a", h.sim.URL()))
	h.startWorker()
	h.before = e.waitServices(wantServiceNames(fleet)...)
	h.watchDeletes()
	// Settled: the worker's polls find nothing to do.
	waitSyncs(t, h.w, 3)
	return h
}

// startWorker starts the next worker with the hold rule.
func (h *holdWorld) startWorker() {
	h.n++
	h.w = h.e.startWorker(workerOpts{Name: fmt.Sprintf("hold-%d", h.n), Tweak: func(c *worker.Config) {
		c.Hold = plan.HoldRule{Share: plan.DefaultHoldShare, Window: h.window}
		if h.tweak != nil {
			h.tweak(c)
		}
	}})
}

// restart stops the running worker and starts a new one on the same NATS
// server and API server.
func (h *holdWorld) restart() {
	h.e.t.Helper()
	h.w.Stop()
	h.past = append(h.past, h.w)
	h.startWorker()
	h.e.t.Logf("worker restarted: hold-%d stopped, hold-%d running", h.n-1, h.n)
}

// watchDeletes records when each Service delete of the namespace is seen.
func (h *holdWorld) watchDeletes() {
	e := h.e
	wa, err := e.kube.CoreV1().Services(e.ns).Watch(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range wa.ResultChan() {
			if ev.Type == watch.Deleted {
				h.mu.Lock()
				h.deletes = append(h.deletes, time.Now())
				h.mu.Unlock()
			}
		}
	}()
	e.onStop(func() { wa.Stop(); <-done })
}

// firstDelete returns when the first delete was seen (zero: none) and how
// many were seen.
func (h *holdWorld) firstDelete() (time.Time, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.deletes) == 0 {
		return time.Time{}, 0
	}
	return h.deletes[0], len(h.deletes)
}

// writes is the Service writes of every worker so far.
func (h *holdWorld) writes() int {
	n := writes(h.w.api)
	for _, w := range h.past {
		n += writes(w.api)
	}
	return n
}

// stats sums the workers' counters.
func (h *holdWorld) stats() worker.Stats {
	s := h.w.Stats()
	for _, w := range h.past {
		p := w.Stats()
		s.Created += p.Created
		s.Updated += p.Updated
		s.Recreated += p.Recreated
		s.Deleted += p.Deleted
		s.DeleteJobs += p.DeleteJobs
	}
	return s
}

// hold reads the instance's hold record (nil: none).
func (h *holdWorld) hold() *events.HoldRecord {
	h.e.t.Helper()
	holds, err := h.e.bus.ReadHolds(h.e.ctx, h.e.ns)
	if errors.Is(err, events.ErrNoState) {
		return nil
	}
	if err != nil {
		h.e.t.Fatalf("read holds: %v", err)
	}
	if r, ok := holds[h.key]; ok {
		return &r
	}
	return nil
}

func (h *holdWorld) waitHold() *events.HoldRecord {
	h.e.t.Helper()
	var r *events.HoldRecord
	waitFor(h.e.t, "a hold record", func() (bool, string) {
		r = h.hold()
		return r != nil, "none"
	})
	return r
}

func (h *holdWorld) waitNoHold() {
	h.e.t.Helper()
	waitFor(h.e.t, "the hold record removed", func() (bool, string) {
		r := h.hold()
		return r == nil, fmt.Sprintf("%+v", r)
	})
}

// sameUIDs reports how many of the first Services exist with the same UID.
func (h *holdWorld) sameUIDs() (same int, now map[string]*corev1.Service) {
	now = h.bmcServices()
	for name, s := range h.before {
		if c, ok := now[name]; ok && c.UID == s.UID {
			same++
		}
	}
	return same, now
}

// bmcServices returns the instance's Services (not the MAT Service).
func (h *holdWorld) bmcServices() map[string]*corev1.Service {
	out := h.e.services()
	for name, s := range out {
		if _, ok := s.Labels[plan.LabelInstance]; !ok {
			delete(out, name)
		}
	}
	return out
}

// keptThrough checks that no Service was deleted before until, polling
// until then; it fails the test at the first missing Service.
func (h *holdWorld) keptThrough(until time.Time, want int) {
	h.e.t.Helper()
	for time.Until(until) > 200*time.Millisecond {
		if at, n := h.firstDelete(); n > 0 {
			h.e.t.Fatalf("a Service was deleted %v before the hold's window ended", until.Sub(at))
		}
		if n := len(h.bmcServices()); n != want {
			h.e.t.Fatalf("%d Services during the hold, want %d", n, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// emptyFleet is the fleet's inventory with no machine registered.
func (h *holdWorld) emptyFleet() *matsim.Fleet {
	return &matsim.Fleet{InventoryID: h.fleet.InventoryID}
}

// TestHoldMATRestart: a MAT that restarts serves an empty inventory under a
// new epoch for 3 s, then the same devices again. The instance's 400
// Services are held, not deleted: no delete, no Service write, every UID
// the same; the hold record is removed once the devices are back. With a
// worker restart in the middle, the new worker keeps the hold it finds.
func TestHoldMATRestart(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("worker-restart=%v", restart), func(t *testing.T) {
			h := newHoldWorld(t, 30*time.Second, nil)
			writes0 := h.writes()
			t0 := time.Now()
			if err := h.sim.Restart("2026-12-06T05:00:00.000000002Z", h.emptyFleet()); err != nil {
				t.Fatal(err)
			}
			r := h.waitHold()
			if r.Held != holdFleetSize || r.Reason != string(plan.MassAll) || !r.InForce() || r.Epoch != "2026-12-06T05:00:00.000000002Z" {
				t.Errorf("hold record: held %d, reason %q, in force %v, epoch %q; want %d, all, true, the new epoch", r.Held, r.Reason, r.InForce(), r.Epoch, holdFleetSize)
			}
			// matbus status shows the hold.
			status, err := operator.ReadStatus(h.e.ctx, operator.StatusConfig{Bus: h.e.bus})
			if err != nil {
				t.Fatal(err)
			}
			if len(status.Rows) != 1 || status.Rows[0].Hold == nil || status.Rows[0].Hold.Held != holdFleetSize || status.Summary.HeldDeletes != holdFleetSize {
				t.Errorf("status: rows %+v, held deletes %d; want the instance's hold of %d", status.Rows, status.Summary.HeldDeletes, holdFleetSize)
			}
			if restart {
				h.restart()
			}
			time.Sleep(3*time.Second - time.Since(t0))
			if err := h.sim.SetFleet(h.fleet); err != nil {
				t.Fatal(err)
			}
			h.waitNoHold()
			waitSyncs(t, h.w, 3)
			same, now := h.sameUIDs()
			_, deleted := h.firstDelete()
			st := h.stats()
			t.Logf("measured: %d-BMC instance, 3 s empty inventory under a new epoch (worker restart %v): %d Services deleted, %d Service writes, %d of %d UIDs unchanged, %d delete jobs",
				holdFleetSize, restart, deleted, h.writes()-writes0, same, holdFleetSize, st.DeleteJobs)
			if deleted != 0 || h.writes() != writes0 || same != holdFleetSize || len(now) != holdFleetSize || st.DeleteJobs != 0 {
				t.Errorf("deleted %d, writes %d, same UIDs %d of %d (%d Services), delete jobs %d; want 0, 0, all",
					deleted, h.writes()-writes0, same, holdFleetSize, len(now), st.DeleteJobs)
			}
			var held, resolved int
			for _, ev := range h.e.errs.Of(events.ErrorHold) {
				switch {
				case ev.Resolved && strings.Contains(ev.Message, "devices are back"):
					resolved++
				case !ev.Resolved && strings.Contains(ev.Message, fmt.Sprintf("%d Service deletes held until", holdFleetSize)):
					held++
				}
			}
			if held != 1 || resolved != 1 {
				t.Errorf("hold events: %d held, %d resolved; want 1 each:\n%s", held, resolved, h.e.errs)
			}
		})
	}
}

// TestHoldEmptyInventoryDeletedAfterWindow: an inventory that stays empty
// under a new epoch: every Service is kept until the window's end and
// deleted after it; the hold record is removed when they are gone. The
// hold is visible meanwhile: error events, Kubernetes Events on the MAT
// Service and the held-deletes metric. Through a worker restart, the new
// worker deletes nothing early either.
func TestHoldEmptyInventoryDeletedAfterWindow(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("worker-restart=%v", restart), func(t *testing.T) {
			const window = 3 * time.Second
			var rec *kubeevents.Recorder
			reg := prometheus.NewRegistry()
			metrics, err := worker.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			var h *holdWorld
			h = newHoldWorld(t, window, func(c *worker.Config) {
				if h != nil && h.n == 2 {
					c.Metrics = metrics
				}
				c.Events = rec
			})
			matSvc := h.e.matAPIService("mat-a")
			rec = h.e.kubeEvents()
			h.restart() // a worker with the Event recorder and the metrics
			if err := h.sim.Restart("2026-12-06T05:00:00.000000002Z", h.emptyFleet()); err != nil {
				t.Fatal(err)
			}
			r := h.waitHold()
			if got := r.Until.Sub(r.Since); got != window {
				t.Errorf("hold window %v, want %v", got, window)
			}
			waitFor(t, "the held-deletes metric", func() (bool, string) {
				v, ok := metricValue(t, reg, "matbus_worker_held_deletes", h.key)
				return ok && v == holdFleetSize, fmt.Sprintf("%v %v", v, ok)
			})
			if restart {
				time.Sleep(window / 3)
				h.restart()
			}
			h.keptThrough(r.Until, holdFleetSize)
			waitFor(t, "every Service deleted", func() (bool, string) {
				n := len(h.bmcServices())
				return n == 0, fmt.Sprintf("%d left", n)
			})
			first, deleted := h.firstDelete()
			h.mu.Lock()
			last := h.deletes[len(h.deletes)-1]
			h.mu.Unlock()
			t.Logf("measured: %d-BMC instance, lasting empty inventory (worker restart %v), window %v: first delete %v after the window's end, last %v after it (%v after the empty status); %d deleted",
				holdFleetSize, restart, window, first.Sub(r.Until).Round(time.Millisecond), last.Sub(r.Until).Round(time.Millisecond),
				last.Sub(r.Since).Round(time.Millisecond), deleted)
			if first.Before(r.Until) {
				t.Errorf("first delete %v before the window's end", r.Until.Sub(first))
			}
			h.waitNoHold()

			var held, released, resolved bool
			for _, ev := range h.e.errs.Of(events.ErrorHold) {
				held = held || strings.Contains(ev.Message, "deletes held until")
				released = released || strings.Contains(ev.Message, "still lacks the devices")
				resolved = resolved || ev.Resolved && strings.Contains(ev.Message, "were deleted")
			}
			if !held || !released || !resolved {
				t.Errorf("hold events: held %v, released %v, resolved %v; want all:\n%s", held, released, resolved, h.e.errs)
			}
			waitFor(t, "Kubernetes Events on the MAT Service", func() (bool, string) {
				evs := h.e.eventsRegarding(matSvc.Name)
				ok := withReason(evs, kubeevents.DeletesHeld) != nil && withReason(evs, kubeevents.DeletesReleased) != nil &&
					withReason(evs, kubeevents.HoldResolved) != nil
				return ok, fmt.Sprintf("%d events", len(evs))
			})
			if ev := withReason(h.e.eventsRegarding(matSvc.Name), kubeevents.DeletesHeld); ev != nil &&
				(!strings.Contains(ev.Note, "400 Service deletes held until") || ev.Type != corev1.EventTypeWarning) {
				t.Errorf("DeletesHeld Event: %s %q", ev.Type, ev.Note)
			}
			if v, ok := metricValue(t, reg, "matbus_worker_delete_holds_total", string(plan.MassAll)); !ok || v != 1 {
				t.Errorf("holds started: %v (%v), want 1", v, ok)
			}
			if !restart {
				// The hold's series go with its record.
				waitFor(t, "the hold's metric series gone", func() (bool, string) {
					_, ok := metricValue(t, reg, "matbus_worker_held_deletes", h.key)
					return !ok, "still there"
				})
			}
		})
	}
}

// TestHoldSingleDeleteNotHeld: one device of 400 removed is deleted at the
// usual speed: no hold record, no hold event (the window is a minute, so a
// held delete would outlast the wait). Through a worker restart too.
func TestHoldSingleDeleteNotHeld(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("worker-restart=%v", restart), func(t *testing.T) {
			h := newHoldWorld(t, time.Minute, nil)
			d := h.fleet.Machines[7]
			name := plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)
			t0 := time.Now()
			if err := h.sim.RemoveDevice(d.MatID); err != nil {
				t.Fatal(err)
			}
			if restart {
				h.restart()
			}
			waitFor(t, name+" deleted", func() (bool, string) {
				_, ok := h.e.services()[name]
				return !ok, "still there"
			})
			took := time.Since(t0)
			same, now := h.sameUIDs()
			t.Logf("measured: 1 device of %d removed (worker restart %v): its Service deleted after %v; %d other UIDs unchanged",
				holdFleetSize, restart, took.Round(time.Millisecond), same)
			if same != holdFleetSize-1 || len(now) != holdFleetSize-1 {
				t.Errorf("%d Services, %d unchanged; want %d", len(now), same, holdFleetSize-1)
			}
			if r := h.hold(); r != nil {
				t.Errorf("hold record for a single delete: %+v", r)
			}
			if evs := h.e.errs.Of(events.ErrorHold); len(evs) != 0 {
				t.Errorf("hold events for a single delete: %v", evs)
			}
		})
	}
}

// TestHoldHalfRemoved: half the devices removed at once (the default
// share): their deletes are held for the window and run after it; the
// other half is untouched. Through a worker restart too.
func TestHoldHalfRemoved(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("worker-restart=%v", restart), func(t *testing.T) {
			const window = 3 * time.Second
			h := newHoldWorld(t, window, nil)
			half := &matsim.Fleet{InventoryID: h.fleet.InventoryID, Machines: h.fleet.Machines[:holdFleetSize/2]}
			if err := h.sim.SetFleet(half); err != nil {
				t.Fatal(err)
			}
			r := h.waitHold()
			if r.Held != holdFleetSize/2 || r.Reason != string(plan.MassShare) {
				t.Errorf("hold record: held %d, reason %q; want %d, share", r.Held, r.Reason, holdFleetSize/2)
			}
			if restart {
				time.Sleep(window / 3)
				h.restart()
			}
			h.keptThrough(r.Until, holdFleetSize)
			want := wantServiceNames(half)
			h.e.waitServices(want...)
			first, deleted := h.firstDelete()
			same, _ := h.sameUIDs()
			t.Logf("measured: half of %d devices removed (worker restart %v), window %v: first delete %v after the window's end; %d deleted, %d UIDs unchanged",
				holdFleetSize, restart, window, first.Sub(r.Until).Round(time.Millisecond), deleted, same)
			if first.Before(r.Until) {
				t.Errorf("first delete %v before the window's end", r.Until.Sub(first))
			}
			if same != holdFleetSize/2 {
				t.Errorf("%d UIDs unchanged, want %d", same, holdFleetSize/2)
			}
			h.waitNoHold()
		})
	}
}

// TestHoldBucketCreatedByWorker: a worker that starts before any discovery
// leader created the state bucket creates it when it needs to hold.
func TestHoldBucketCreatedByWorker(t *testing.T) {
	e := newEnv(t)
	fleet := generatedFleet(t, "10.96.69.0/24", 41)
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	// The publisher's state writer may create the bucket; remove it once
	// the Services exist, as if no leader of this version had run.
	w := e.startWorker(workerOpts{Name: "w", Tweak: func(c *worker.Config) { c.Hold = plan.HoldRule{Share: 0.5, Window: time.Minute} }})
	e.waitServices(wantServiceNames(fleet)...)
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if err := e.js.DeleteKeyValue(ctx, e.bus.StateBucket()); err != nil {
		t.Fatalf("delete the state bucket: %v", err)
	}
	w.Stop()
	e.startWorker(workerOpts{Name: "w2", Tweak: func(c *worker.Config) { c.Hold = plan.HoldRule{Share: 0.5, Window: time.Minute} }})
	if err := sim.Restart("", &matsim.Fleet{InventoryID: fleet.InventoryID}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a hold record", func() (bool, string) {
		holds, err := e.bus.ReadHolds(e.ctx, e.ns)
		return err == nil && len(holds) == 1, fmt.Sprintf("%v %v", holds, err)
	})
	if n := len(e.services()); n != len(wantServiceNames(fleet)) {
		t.Errorf("%d Services, want all kept", n)
	}
}

// metricValue returns the value of the series of family name whose one
// label has value label, and whether it exists.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				if g := m.GetGauge(); g != nil {
					return g.GetValue(), true
				}
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestHoldOffDeletesAtOnce: with the window 0 (holding off), the same 3 s
// MAT restart deletes the instance's Services and creates them again (new
// UIDs), as before holds existed: the hold is what keeps them in
// TestHoldMATRestart.
func TestHoldOffDeletesAtOnce(t *testing.T) {
	h := newHoldWorld(t, 0, nil)
	writes0 := h.writes()
	t0 := time.Now()
	if err := h.sim.Restart("2026-12-06T05:00:00.000000002Z", h.emptyFleet()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3*time.Second - time.Since(t0))
	if err := h.sim.SetFleet(h.fleet); err != nil {
		t.Fatal(err)
	}
	h.e.waitServices(wantServiceNames(h.fleet)...)
	same, _ := h.sameUIDs()
	_, deleted := h.firstDelete()
	t.Logf("measured: holding off, %d-BMC instance, 3 s empty inventory under a new epoch: %d Services deleted, %d Service writes, %d of %d UIDs changed",
		holdFleetSize, deleted, h.writes()-writes0, holdFleetSize-same, holdFleetSize)
	if deleted == 0 || same == holdFleetSize {
		t.Errorf("holding off: %d deleted, %d UIDs unchanged; want the Services deleted and created again", deleted, same)
	}
	if r := h.hold(); r != nil {
		t.Errorf("hold record with holding off: %+v", r)
	}
}

// TestHoldKeepsQueuedDeleteJobs: a stale delete job that was queued before
// the hold began (planned from an earlier status), for a Service the hold
// lists, is acknowledged without deleting while the hold is in force,
// although the newest status lacks the device.
func TestHoldKeepsQueuedDeleteJobs(t *testing.T) {
	h := newHoldWorld(t, time.Minute, nil)
	if err := h.sim.Restart("", h.emptyFleet()); err != nil {
		t.Fatal(err)
	}
	r := h.waitHold()
	victim := h.before[r.Services[0].Name]
	kept0 := h.w.Stats().DeletesKept
	job := events.DeleteJob{Key: h.key, Namespace: h.e.ns, Name: victim.Name, UID: string(victim.UID),
		MatID: victim.Annotations[plan.AnnotationMatID], Reason: "stale", PlannedAt: r.Since.Add(-time.Second)}
	if err := h.e.bus.Publish(h.e.ctx, h.e.bus.Subjects().Delete(h.key), events.TypeDeleteJob, "test-queued-before-hold", job); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delete job kept", func() (bool, string) {
		s := h.w.Stats()
		return s.DeletesKept > kept0, fmt.Sprintf("%+v", s)
	})
	if s := h.e.service(victim.Name); s == nil || s.UID != victim.UID {
		t.Errorf("held Service %s deleted or replaced by a queued delete job", victim.Name)
	}
	if _, n := h.firstDelete(); n != 0 {
		t.Errorf("%d Services deleted during the hold", n)
	}
}
