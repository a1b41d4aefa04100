package faulttest

import (
	"fmt"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matsim"
)

// announce publishes an appeared event and a sync job for in, by hand.
func (w *world) announce(in *instance, id string) events.Instance {
	w.t.Helper()
	inst := events.Instance{Key: in.key(), URL: in.url, Scope: "static:faulttest"}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Instance(inst.Key), events.TypeInstanceAppeared, "appeared-"+id, inst); err != nil {
		w.t.Fatal(err)
	}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Sync(inst.Key), events.TypeSyncJob, "sync-"+id, events.SyncJob{Key: inst.Key, Reason: "test"}); err != nil {
		w.t.Fatal(err)
	}
	return inst
}

// TestShutdown (issue point 11). SIGTERM to a worker process:
//
//   - a job in flight that can finish within --shutdown-grace is finished
//     and acknowledged before the process exits 0 (no other worker runs, so
//     the Services prove it);
//   - a job that cannot (its MAT hangs) is left for redelivery when the
//     grace period ends: the process exits 0 shortly after it, no error
//     event is published, and the next worker does the job;
//   - the worker's MAT clients are closed: when an instance goes, its
//     client is evicted and the simulator sees its connection closed; when
//     the worker stops, every connection it had is closed.
//
// The test process itself checks for goroutine leaks (goleak) at the end.
func TestShutdown(t *testing.T) {
	w := newWorld(t)
	spec := fleetSpec{hosts: 2, switches: 1}

	// 1. Drained within the grace period.
	slow := w.newInstance("slow", spec, shutdownGrace/2)
	slow.sim.SetFault(matsim.FaultSlow)
	w1 := w.startWorker("w1")
	w.announce(slow, "slow")
	w.waitFor("slow job in flight", 30*time.Second, func() (bool, string) { return slow.sim.Requests() > 0, "no request yet" })
	took, code := w1.Term(30 * time.Second)
	t.Logf("measured: SIGTERM with a %v job in flight: exit %d after %v (grace %v)", shutdownGrace/2, code, took.Round(time.Millisecond), shutdownGrace)
	if code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	if got, want := len(slow.services()), len(slow.want()); got != want {
		t.Errorf("the in-flight job was not finished before exit: %d of %d Services", got, want)
	}
	ci, err := w.consumerInfo("SYNC", events.SyncConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumAckPending != 0 || ci.NumPending != 0 {
		t.Errorf("the finished job was not acknowledged: %d pending, %d ack pending", ci.NumPending, ci.NumAckPending)
	}

	// 2. Left for redelivery after the grace period.
	hung := w.newInstance("hung", spec, 0)
	hung.sim.SetFault(matsim.FaultHang)
	w2 := w.startWorker("w2", "--mat-timeout", "60s")
	w.announce(hung, "hung")
	w.waitFor("hung job in flight", 30*time.Second, func() (bool, string) { return hung.sim.Requests() > 0, "no request yet" })
	took, code = w2.Term(30 * time.Second)
	t.Logf("measured: SIGTERM with a job that cannot finish: exit %d after %v (grace %v)", code, took.Round(time.Millisecond), shutdownGrace)
	if code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	if took > shutdownGrace+5*time.Second {
		t.Errorf("exit took %v, far beyond the grace period %v", took, shutdownGrace)
	}
	if n := len(hung.services()); n != 0 {
		t.Fatalf("%d Services from a job that never got its status", n)
	}
	hung.sim.SetFault(matsim.FaultNone)
	w3 := w.startWorker("w3")
	start := time.Now()
	hung.waitConverged(30 * time.Second)
	t.Logf("measured: the job left by the stopped worker was done by the next one %v after it started", time.Since(start).Round(time.Millisecond))
	ci, err = w.consumerInfo("SYNC", events.SyncConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Delivered.Consumer <= ci.Delivered.Stream {
		t.Errorf("sync consumer: %d deliveries of %d jobs; the hung job should have been delivered twice", ci.Delivered.Consumer, ci.Delivered.Stream)
	}
	if n := w.errs.Len(); n != 0 {
		t.Errorf("a shutdown is not a failure, but error events were published:\n%s", w.errs)
	}

	// 3. Evicted and stopped clients leave no connection behind.
	evict := w.newInstance("evict", spec, 0)
	inst := w.announce(evict, "evict")
	evict.waitConverged(30 * time.Second)
	if evict.open.Load() == 0 {
		t.Fatal("the worker keeps no connection to the instance it syncs (nothing to prove)")
	}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Instance(inst.Key), events.TypeInstanceGone, "gone-evict", inst); err != nil {
		t.Fatal(err)
	}
	took = w.waitFor("the evicted client's connection closed", 10*time.Second, func() (bool, string) {
		return evict.open.Load() == 0, fmt.Sprintf("%d open", evict.open.Load())
	})
	t.Logf("measured: connection to a gone instance closed %v after the gone event", took.Round(time.Millisecond))
	if _, code := w3.Term(30 * time.Second); code != 0 {
		t.Errorf("w3 exit status %d", code)
	}
	for _, in := range []*instance{slow, hung, evict} {
		if n := in.open.Load(); n != 0 {
			t.Errorf("%s: %d connections still open after every worker stopped", in.name, n)
		}
	}
}
