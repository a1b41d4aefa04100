package faulttest

import (
	"fmt"
	"maps"
	"net/http"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// TestLongJobKeepsItsDelivery (issue point 6, progress): a sync job whose
// MAT answers after twice AckWait is delivered once: the handler reports
// progress (InProgress) while it works, so JetStream does not hand the job
// out again, and MAT sees exactly one request.
func TestLongJobKeepsItsDelivery(t *testing.T) {
	w := newWorld(t)
	slow := w.newInstance("slow", fleetSpec{hosts: 2, switches: 1, shelves: 1}, 2*ackWait)
	slow.sim.SetFault(matsim.FaultSlow)
	w.startWorker("w1", "--mat-timeout", (4 * ackWait).String())
	// One appeared event and one sync job, published by hand (no ticks).
	inst := events.Instance{Key: slow.key(), URL: slow.url, Scope: "static:faulttest"}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Instance(inst.Key), events.TypeInstanceAppeared, "appeared-slow", inst); err != nil {
		t.Fatal(err)
	}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Sync(inst.Key), events.TypeSyncJob, "sync-slow", events.SyncJob{Key: inst.Key, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	slow.waitConverged(time.Minute)
	t.Logf("measured: a sync job with a %v MAT answer (AckWait %v) done in %v", 2*ackWait, ackWait, time.Since(start).Round(time.Millisecond))
	w.waitFor("sync job acknowledged", 10*time.Second, func() (bool, string) {
		ci, err := w.consumerInfo("SYNC", events.SyncConsumer)
		if err != nil {
			return false, err.Error()
		}
		return ci.NumAckPending == 0 && ci.NumPending == 0, fmt.Sprintf("ack pending %d", ci.NumAckPending)
	})
	ci, err := w.consumerInfo("SYNC", events.SyncConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Delivered.Consumer != 1 || ci.Delivered.Stream != 1 {
		t.Errorf("sync consumer: %d deliveries of %d jobs, want 1 of 1", ci.Delivered.Consumer, ci.Delivered.Stream)
	}
	if n := slow.sim.Requests(); n != 1 {
		t.Errorf("MAT saw %d status requests, want 1 (a redelivered job fetches again)", n)
	}
	if n := w.errs.Len(); n != 0 {
		t.Errorf("error events:\n%s", w.errs)
	}
}

// TestSlowAndParkedJobsDoNotStallHealthyOnes (issue point 6): one worker
// process with the default 4 job slots. Instance "hung" never answers (each
// sync job spends its whole fetch budget); every write of instance
// "parked" is refused with 503 by an admission webhook, so its sync jobs
// retry with backoff for 15 s and are then parked (nak with delay). Sync
// jobs for both keep arriving every tick. Healthy instances added later must
// still converge promptly (before the change that pulls only for free job
// slots and runs one job per instance at a time, they waited about 10 s;
// with the default 60 s retry budget, a minute); failures are reported at
// most once per rate-limit window and target; and once the faults end, both
// instances converge.
func TestSlowAndParkedJobsDoNotStallHealthyOnes(t *testing.T) {
	w := newWorld(t)
	hung := w.newInstance("hung", fleetSpec{hosts: 2}, 0)
	hung.sim.SetFault(matsim.FaultHang)
	parked := w.newInstance("parked", fleetSpec{hosts: 2}, 0)
	hook := w.failServices(map[string]string{plan.LabelInstance: plan.LabelValue(parked.key())}, http.StatusServiceUnavailable)
	w.startWorker("w1", "--retry-max-elapsed", "15s")
	disc := w.startStaticDiscovery(hung, parked)

	// Let the bad instances' jobs pile up for a few ticks.
	time.Sleep(4 * syncInterval)
	var healthy []*instance
	for i := range 3 {
		healthy = append(healthy, w.newInstance(fmt.Sprintf("healthy-%d", i), fleetSpec{hosts: 3, switches: 1}, 0))
	}
	start := time.Now()
	disc.Add(healthy...)
	for _, in := range healthy {
		in.waitConverged(30 * time.Second)
	}
	took := time.Since(start)
	t.Logf("measured: 3 healthy instances converged %v after they appeared, next to a hung and a parked one", took.Round(time.Millisecond))
	if bound := 2 * syncInterval; took > bound {
		t.Errorf("healthy instances waited %v (> %v) behind the hung and parked ones", took.Round(time.Millisecond), bound)
	}

	if hook.denied.Load() == 0 {
		t.Fatal("the webhook refused nothing")
	}
	noFlood(t, w.errs.All())

	// The faults end: both converge.
	hook.Remove()
	hung.sim.SetFault(matsim.FaultNone)
	start = time.Now()
	parked.waitConverged(30 * time.Second)
	hung.waitConverged(30 * time.Second)
	t.Logf("measured: hung and parked instances converged %v after their faults ended", time.Since(start).Round(time.Millisecond))

	for _, e := range w.errs.All() {
		if e.Err.Instance != parked.key() && e.Err.Instance != hung.key() {
			t.Errorf("error event for a healthy instance: %s", formatErrs([]errEvent{e}))
		}
		if e.Err.Permanent {
			t.Errorf("permanent error event for a transient failure: %s", formatErrs([]errEvent{e}))
		}
	}
	t.Logf("error events:\n%s", w.errs)
}

// TestExhaustedJobsAreReportedAndRepaired (issue points 4 and 6): an
// instance goes away while the API server refuses the deletes of its
// Services with 503 (admission webhook). Each delivery of a delete job
// retries with a fresh backoff (its report shows several attempts), the job
// is parked and redelivered, and when it exhausts its deliveries
// an error event says so (attempts = MaxDeliver) and the job is terminated.
// Once the API server accepts deletes again, the worker's sweep publishes a
// new clean-up job for the instance that is gone but still has Services, so
// they are deleted after all: giving up never leaves orphans for good.
func TestExhaustedJobsAreReportedAndRepaired(t *testing.T) {
	w := newWorld(t)
	stuck := w.newInstance("stuck", fleetSpec{hosts: 3, switches: 1}, 0)
	keep := w.newInstance("keep", fleetSpec{hosts: 3, switches: 1}, 0)
	const maxDeliver = 3
	w.startWorker("w1", "--retry-max-elapsed", "2s", "--max-deliver", fmt.Sprint(maxDeliver), "--instance-resync", "2s")
	disc := w.startStaticDiscovery(stuck, keep)
	stuck.waitConverged(time.Minute)
	kept := uidsOf(keep.waitConverged(time.Minute))

	hook := w.failServices(map[string]string{plan.LabelInstance: plan.LabelValue(stuck.key())},
		http.StatusServiceUnavailable, admissionregistrationv1.Delete)
	start := time.Now()
	disc.Remove(stuck)
	w.waitFor("a delete job gives up", time.Minute, func() (bool, string) {
		for _, e := range w.errs.All() {
			if e.Err.Kind == events.ErrorDelete && e.Err.Subject == w.bus.Subjects().Delete(stuck.key()) && e.Err.Attempts == maxDeliver {
				return true, ""
			}
		}
		return false, "no event yet"
	})
	t.Logf("measured: first \"gave up after %d deliveries\" delete event %v after the instance went away", maxDeliver, time.Since(start).Round(time.Millisecond))
	if n := len(stuck.services()); n == 0 {
		t.Fatal("the Services were deleted although the API server refused it")
	}
	// Each delivery retries with a fresh backoff: a later delivery's report
	// (one per rate-limit window) shows several attempts again, where a
	// budget used up by the first delivery would allow one.
	w.waitFor("reports of two deliveries", time.Minute, func() (bool, string) {
		n := 0
		for _, e := range w.errs.All() {
			if e.Err.Kind == events.ErrorDelete && e.Err.Instance == stuck.key() && e.Err.Subject == "" {
				if e.Err.Attempts < 2 {
					t.Fatalf("a delivery gave up after %d attempt: %s", e.Err.Attempts, formatErrs([]errEvent{e}))
				}
				n++
			}
		}
		return n >= 2, fmt.Sprintf("%d reports", n)
	})
	w.waitFor("every delete job ended", time.Minute, func() (bool, string) {
		n, err := w.streamMsgs("DELETE")
		return err == nil && n == 0, fmt.Sprintf("%d delete jobs stored (%v)", n, err)
	})
	noFlood(t, w.errs.All())

	hook.Remove()
	start = time.Now()
	stuck.waitGone(time.Minute)
	t.Logf("measured: the gone instance's Services deleted by the sweep %v after the API server accepted deletes again (--instance-resync 2s)",
		time.Since(start).Round(time.Millisecond))
	if got := uidsOf(keep.services()); !maps.Equal(got, kept) {
		t.Error("the staying instance's Services changed")
	}
	for _, e := range w.errs.All() {
		if e.Err.Instance != stuck.key() {
			t.Errorf("error event for another instance: %s", formatErrs([]errEvent{e}))
		}
	}
	t.Logf("error events:\n%s", w.errs)
}
