package faulttest

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// Bounds of TestNATSClusterNodeLoss. A consumer whose leader steps down
// gets a new one at once; the workers notice a silent pull within
// pullHeartbeat (2 s, worker/worker.go) and pull again. A killed leader is
// replaced only after a Raft election timeout (4–9 s in nats-server), so
// a kill may stall a consumer that long on top.
const (
	pullHeartbeat      = 2 * time.Second
	electionTimeoutMax = 9 * time.Second
	stepDownStallBound = pullHeartbeat + 8*time.Second
	killStallBound     = pullHeartbeat + electionTimeoutMax + 10*time.Second
	nodeDownFor        = 30 * time.Second
)

// svcEvent is one change of a Service seen by the test's informer.
type svcEvent struct {
	at        time.Time
	added     bool // else deleted
	name, uid string
	instance  string // instance label value
}

// svcRecorder records every Service added to or deleted from the world's
// namespace, as the API server reports them.
type svcRecorder struct {
	mu  sync.Mutex
	evs []svcEvent
}

func (w *world) recordServices() *svcRecorder {
	w.t.Helper()
	r := &svcRecorder{}
	f := informers.NewSharedInformerFactoryWithOptions(adminKube, 0, informers.WithNamespace(w.ns))
	inf := f.Core().V1().Services().Informer()
	rec := func(obj any, added bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*corev1.Service)
		if !ok {
			return
		}
		r.mu.Lock()
		r.evs = append(r.evs, svcEvent{at: time.Now(), added: added, name: s.Name, uid: string(s.UID), instance: s.Labels[plan.LabelInstance]})
		r.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { rec(obj, true) },
		DeleteFunc: func(obj any) { rec(obj, false) },
	}); err != nil {
		w.t.Fatal(err)
	}
	stop := make(chan struct{})
	f.Start(stop)
	w.onStop(func() { close(stop); f.Shutdown() })
	if !cache.WaitForCacheSync(w.ctx.Done(), inf.HasSynced) {
		w.t.Fatal("Service informer did not sync")
	}
	return r
}

// since returns the events of instance (its label value) from t0 on.
func (r *svcRecorder) since(in *instance, t0 time.Time) (added, deleted []svcEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lv := plan.LabelValue(in.key())
	for _, e := range r.evs {
		if e.instance != lv || e.at.Before(t0) {
			continue
		}
		if e.added {
			added = append(added, e)
		} else {
			deleted = append(deleted, e)
		}
	}
	return added, deleted
}

// longestGap returns the longest time without an event in evs (sorted by
// time) between t0 and the last one: how long the work stalled.
func longestGap(t0 time.Time, evs []svcEvent) time.Duration {
	var gap time.Duration
	prev := t0
	for _, e := range evs {
		gap = max(gap, e.at.Sub(prev))
		prev = e.at
	}
	return gap
}

// TestNATSClusterNodeLoss (issue 12): three worker processes and a
// Kubernetes discovery process run against a JetStream cluster of three
// nats-server processes with every stream at three replicas (created with
// one by an earlier release, then scaled to three by the processes). Three
// faults, one after the other:
//
//  1. kill -9 of the node that is both meta leader and leader of the
//     delete-job stream while a clean-up fans out 1,000 delete jobs;
//  2. a node (the sync stream's leader) stopped for 30 s while an
//     instance appears and another goes away, then started again;
//  3. step-downs of the job consumers' leaders while workers pull a fan-out
//     of 300 deletes and sync jobs.
//
// Each ends converged with no lost job (every Service of a gone instance
// deleted, the delete stream drained), no wrong delete (every Service that
// should stay keeps its UID), no duplicated effect (the workers' delete
// and create counters match the Services, and nothing is re-created), and
// no consumer stalled longer than its bound. The recovery times are logged
// ("measured:") and recorded in docs/delivery-guarantees.md.
func TestNATSClusterNodeLoss(t *testing.T) {
	w := newClusterWorld(t, 3)
	rec := w.recordServices()

	// An earlier release made the streams with one replica; the processes
	// below scale them to three.
	old, err := events.New(w.nc, events.Config{Source: "faulttest/earlier-release", Replicas: 1}, w.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.EnsureStreams(w.ctx); err != nil {
		t.Fatalf("streams at 1 replica: %v", err)
	}

	big := w.newInstance("big", fleetSpec{hosts: 400, switches: 100, shelves: 100}, 0)
	mid := w.newInstance("mid", fleetSpec{hosts: 100, switches: 50, shelves: 50}, 0)
	keep := w.newInstance("keep", fleetSpec{hosts: 3, switches: 1, shelves: 1}, 0)
	goes := w.newInstance("goes", fleetSpec{hosts: 10, switches: 2, shelves: 2}, 0)
	comes := w.newInstance("comes", fleetSpec{hosts: 10, switches: 2, shelves: 2}, 0)
	if n := len(big.want()); n != 1000 {
		t.Fatalf("big fleet has %d BMCs, want 1000", n)
	}
	for _, in := range []*instance{big, mid, keep, goes} {
		w.discover(in)
	}
	workers := []*proc{w.startWorker("w1"), w.startWorker("w2"), w.startWorker("w3")}
	disc := w.startDiscovery("disc-1")
	start := time.Now()
	for _, in := range []*instance{big, mid, keep, goes} {
		in.waitConverged(3 * time.Minute)
	}
	t.Logf("measured: 1,320 Services created on the R3 cluster in %v", time.Since(start).Round(time.Millisecond))
	w.waitFor("every stream at 3 replicas, all current", time.Minute, w.allCurrent)
	uids := map[string]string{}
	for _, in := range []*instance{mid, keep, goes} {
		maps.Copy(uids, uidsOf(in.services()))
	}
	// unchanged fails the test if a Service that must stay was deleted or
	// re-created (a wrong delete or a duplicated effect).
	unchanged := func(phase string, ins ...*instance) {
		t.Helper()
		for _, in := range ins {
			got := in.services()
			if len(got) != len(in.want()) {
				t.Errorf("%s: %s has %d Services, want %d", phase, in.name, len(got), len(in.want()))
			}
			for n, s := range got {
				if uids[n] != string(s.UID) {
					t.Errorf("%s: %s/%s was re-created (uid %s, was %s)", phase, in.name, n, s.UID, uids[n])
				}
			}
		}
	}
	// counters returns the workers' created and deleted counters.
	counters := func() (created, deleted float64) {
		t.Helper()
		created, _ = sumMetric(t, "matbus_worker_services_created_total", workers...)
		deleted, _ = sumMetric(t, "matbus_worker_services_deleted_total", workers...)
		return created, deleted
	}
	drained := func(phase string) {
		t.Helper()
		w.waitFor(phase+": delete jobs drained", time.Minute, func() (bool, string) {
			d, err := w.streamMsgs("DELETE")
			if err != nil {
				return false, err.Error()
			}
			ci, err := w.consumerInfo("DELETE", events.DeleteConsumer)
			if err != nil {
				return false, err.Error()
			}
			return d == 0 && ci.NumAckPending == 0 && ci.NumPending == 0,
				fmt.Sprintf("stored %d, ack pending %d, pending %d", d, ci.NumAckPending, ci.NumPending)
		})
	}
	// effects checks a phase's counters: exactly the Services the phase
	// should create and delete, each once.
	effects := func(phase string, c0, d0 float64, wantCreated, wantDeleted int) {
		t.Helper()
		c1, d1 := counters()
		if int(c1-c0) != wantCreated || int(d1-d0) != wantDeleted {
			t.Errorf("%s: workers created %v and deleted %v Services, want %d and %d (each once)", phase, c1-c0, d1-d0, wantCreated, wantDeleted)
		}
	}

	// ---- 1. kill -9 of the meta leader and the delete stream's leader ----
	var victim string
	var lastStep time.Time
	w.waitFor("the delete stream led by the meta leader", time.Minute, func() (bool, string) {
		meta := w.cluster.metaLeader()
		ci, err := w.streamCluster("DELETE")
		if err != nil || meta == "" {
			return false, fmt.Sprintf("meta leader %q, %v", meta, err)
		}
		if ci.Leader == meta {
			victim = meta
			return true, ""
		}
		if time.Since(lastStep) < 2*time.Second {
			return false, fmt.Sprintf("meta leader %s, stream leader %s: stepped down", meta, ci.Leader)
		}
		lastStep = time.Now()
		if err := w.stepDown("DELETE", "", meta); err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("meta leader %s, stream leader %s: stepping down", meta, ci.Leader)
	})
	c0, d0 := counters()
	fanOut, stopWatch := firstToLog(workers, "instance gone: deleting its Services", "instance="+big.key())
	w.undiscover(big)
	removed := time.Now()
	var killed time.Time
	select {
	case p := <-fanOut:
		w.cluster.node(victim).Stop(true)
		killed = time.Now()
		stopWatch()
		t.Logf("killed %s (meta leader, delete stream leader) as %s began the fan-out", victim, p.name)
	case <-time.After(2 * time.Minute):
		stopWatch()
		t.Fatal("no worker began the fan-out of big")
	}
	var metaAt, streamAt, consumerAt time.Duration
	w.waitFor("new meta, stream and consumer leaders and big's Services gone", 4*time.Minute, func() (bool, string) {
		if metaAt == 0 {
			if l := w.cluster.metaLeader(); l != "" && l != victim {
				metaAt = time.Since(killed)
			}
		}
		if streamAt == 0 {
			if ci, err := w.streamCluster("DELETE"); err == nil && ci.Leader != "" && ci.Leader != victim {
				streamAt = time.Since(killed)
			}
		}
		if consumerAt == 0 {
			if l := w.consumerLeader("DELETE", events.DeleteConsumer); l != "" && l != victim {
				consumerAt = time.Since(killed)
			}
		}
		n := len(big.services())
		// The List can show the last Service gone before its watch event
		// reaches the recorder: wait for the events too.
		_, seen := rec.since(big, removed)
		return n == 0 && len(seen) >= 1000 && metaAt > 0 && streamAt > 0 && consumerAt > 0,
			fmt.Sprintf("%d of big's Services left, %d deletions seen; meta %v stream %v consumer %v", n, len(seen), metaAt, streamAt, consumerAt)
	})
	allGone := time.Since(killed)
	_, dels := rec.since(big, removed)
	_, after := rec.since(big, killed)
	stall := longestGap(killed, after)
	t.Logf("measured: kill -9 of %s during the 1,000-delete fan-out: new meta leader %v, new delete stream leader %v, "+
		"delete consumer led again %v, longest pause between deletes %v, all 1,000 gone %v after the kill",
		victim, metaAt.Round(time.Millisecond), streamAt.Round(time.Millisecond), consumerAt.Round(time.Millisecond),
		stall.Round(time.Millisecond), allGone.Round(time.Millisecond))
	if stall > killStallBound {
		t.Errorf("deletes paused %v after the kill, want at most %v", stall, killStallBound)
	}
	drained("kill")
	effects("kill", c0, d0, 0, 1000)
	if adds, _ := rec.since(big, killed); len(adds) != 0 {
		t.Errorf("kill: %d of big's Services re-created after the kill", len(adds))
	}
	if len(dels) != 1000 {
		t.Errorf("kill: %d deletions of big's Services seen, want 1000", len(dels))
	}
	unchanged("kill", mid, keep, goes)
	restarted := time.Now()
	w.cluster.node(victim).Start()
	took := w.waitFor(victim+" caught up", 2*time.Minute, w.allCurrent)
	t.Logf("measured: %s restarted after the kill: every stream replica current %v after its start (%v in all)",
		victim, took.Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))

	// ---- 2. a node stopped for 30 s while syncs and clean-ups run ----
	ci, err := w.streamCluster("SYNC")
	if err != nil {
		t.Fatal(err)
	}
	down := ci.Leader
	c0, d0 = counters()
	w.cluster.node(down).Stop(false)
	stopped := time.Now()
	w.discover(comes)
	w.undiscover(goes)
	comes.waitConverged(time.Minute)
	cameIn := time.Since(stopped)
	goes.waitGone(time.Minute)
	wentIn := time.Since(stopped)
	t.Logf("measured: %s (sync stream leader) stopped: an instance that appeared converged %v, one that went away was cleaned up %v after the stop",
		down, cameIn.Round(time.Millisecond), wentIn.Round(time.Millisecond))
	_, goneDels := rec.since(goes, stopped)
	comesAdds, _ := rec.since(comes, stopped)
	if gap := max(longestGap(stopped, goneDels), longestGap(stopped, comesAdds)); gap > killStallBound {
		t.Errorf("node stop: work paused %v, want at most %v", gap, killStallBound)
	}
	// The node stays away 30 s in all (the fault, not a wait for a condition).
	time.Sleep(time.Until(stopped.Add(nodeDownFor)))
	w.cluster.node(down).Start()
	took = w.waitFor(down+" caught up", 2*time.Minute, w.allCurrent)
	t.Logf("measured: %s started again after %v away: every stream replica current %v after its start",
		down, nodeDownFor, took.Round(time.Millisecond))
	comes.waitConverged(time.Minute)
	drained("node stop")
	effects("node stop", c0, d0, len(comes.want()), len(goes.want()))
	unchanged("node stop", mid, keep)
	maps.Copy(uids, uidsOf(comes.services()))

	// ---- 3. consumer leader step-downs while workers pull ----
	c0, d0 = counters()
	syncs0, _ := sumMetric(t, "matbus_worker_syncs_total", workers...)
	total := len(mid.want())
	w.undiscover(mid)
	var stepped []time.Time
	for _, frac := range []float64{0.2, 0.6} {
		w.waitFor(fmt.Sprintf("%.0f %% of mid deleted", frac*100), 2*time.Minute, func() (bool, string) {
			left := len(mid.services())
			return float64(total-left) >= frac*float64(total), fmt.Sprintf("%d of %d left", left, total)
		})
		before := w.consumerLeader("DELETE", events.DeleteConsumer)
		for _, c := range [][2]string{{"DELETE", events.DeleteConsumer}, {"SYNC", events.SyncConsumer}} {
			if err := w.stepDown(c[0], events.ConsumerName(c[1], w.ns), ""); err != nil {
				t.Fatalf("step down %s: %v", c[1], err)
			}
		}
		at := time.Now()
		stepped = append(stepped, at)
		took := w.waitFor("a new delete consumer leader", time.Minute, func() (bool, string) {
			l := w.consumerLeader("DELETE", events.DeleteConsumer)
			return l != "" && l != before, "leader " + l
		})
		t.Logf("measured: delete and sync consumer leaders stepped down at %.0f %% (delete consumer: %s, new leader known %v later)",
			frac*100, before, took.Round(time.Millisecond))
	}
	mid.waitGone(2 * time.Minute)
	_, midDels := rec.since(mid, stepped[0])
	var worst time.Duration
	for _, at := range stepped {
		var after []svcEvent
		for _, e := range midDels {
			if !e.at.Before(at) {
				after = append(after, e)
			}
		}
		if len(after) > 0 {
			worst = max(worst, longestGap(at, after))
		}
	}
	t.Logf("measured: consumer leader step-downs during a 300-delete fan-out: longest pause between deletes after a step-down %v", worst.Round(time.Millisecond))
	if worst > stepDownStallBound {
		t.Errorf("deletes paused %v after a consumer step-down, want at most %v", worst, stepDownStallBound)
	}
	// Sync jobs are pulled again after the step-down too.
	w.waitFor("sync jobs handled after the step-downs", stepDownStallBound+syncInterval, func() (bool, string) {
		s, _ := sumMetric(t, "matbus_worker_syncs_total", workers...)
		return s > syncs0, fmt.Sprintf("%v syncs since", s-syncs0)
	})
	drained("step-down")
	effects("step-down", c0, d0, 0, total)
	unchanged("step-down", keep, comes)

	for _, p := range append([]*proc{disc}, workers...) {
		if p.Exited() {
			t.Errorf("%s exited: %v", p.name, p.state)
		}
	}
	var writes []string
	for _, e := range w.errs.All() {
		switch e.Err.Kind {
		case events.ErrorCreate, events.ErrorUpdate, events.ErrorDelete:
			writes = append(writes, formatErrs([]errEvent{e}))
		}
	}
	if len(writes) > 0 {
		t.Errorf("Service writes failed:\n%s", strings.Join(writes, ""))
	}
	t.Logf("error events (publishes retried while leaders changed are expected):\n%s", w.errs)
}
