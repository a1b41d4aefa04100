package worker_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// TestDeposedLeaderMessagesRefused: once a worker has seen epoch 5 of the
// discovery Lease, an instance event, a sync job and a clean-up job of
// epoch 4 (a deposed leader's) have no effect — no MAT client, no Service
// created, none deleted — and each yields one error event of kind
// discovery. A sync job of epoch 5 for an instance whose stored record is
// the deposed leader's appeared event is skipped; a job without an epoch
// (an older publisher) is done. A worker that starts later learns epoch 5
// from the instances stream and refuses the deposed leader's job before it
// has read any event.
func TestDeposedLeaderMessagesRefused(t *testing.T) {
	e := newEnv(t)
	simA := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	simB := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.98.0/24", 5)})
	w := e.startWorker(workerOpts{Name: "w1"})
	s := e.bus.Subjects()
	keyA, keyB := e.key("mat-a"), e.key("mat-b")
	current := &events.Epoch{Lease: e.ns + "/matbus-discovery", Term: 5, Leader: "disc-2"}
	deposed := &events.Epoch{Lease: current.Lease, Term: 4, Leader: "disc-1"}
	publish := func(subject string, typ events.Type, id string, data any, ep *events.Epoch) {
		t.Helper()
		if err := e.bus.Publish(e.ctx, subject, typ, id, data, events.WithEpoch(ep)); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
	instA := events.Instance{Key: keyA, URL: simA.URL(), Scope: "test"}
	instB := events.Instance{Key: keyB, URL: simB.URL(), Scope: "test"}

	// The current leader announces mat-a and has it synced.
	publish(s.Instance(keyA), events.TypeInstanceAppeared, "appeared-a", instA, current)
	publish(s.Sync(keyA), events.TypeSyncJob, "sync-a-1", events.SyncJob{Key: keyA, Reason: events.ReasonAppeared}, current)
	before := uids(e.waitServices(v2MixedNames()...))
	syncsDone := func(n int64) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d sync jobs done", n), func() (bool, string) { return w.Stats().Syncs >= n, fmt.Sprintf("%+v", w.Stats()) })
	}
	syncsDone(1)

	// The deposed leader: mat-b appeared (from a stale cache), a sync job
	// for it, and a clean-up of mat-a.
	stale := map[string]string{
		s.Instance(keyB): "appeared-b-stale",
		s.Sync(keyB):     "sync-b-stale",
		s.Cleanup(keyA):  "cleanup-a-stale",
	}
	publish(s.Instance(keyB), events.TypeInstanceAppeared, stale[s.Instance(keyB)], instB, deposed)
	publish(s.Sync(keyB), events.TypeSyncJob, stale[s.Sync(keyB)], events.SyncJob{Key: keyB, Reason: events.ReasonAppeared}, deposed)
	publish(s.Cleanup(keyA), events.TypeCleanupJob, stale[s.Cleanup(keyA)], events.CleanupJob{Key: keyA, Scope: "test"}, deposed)
	refusals := func() map[string]int {
		n := map[string]int{}
		for _, ev := range e.errs.Of(events.ErrorDiscovery) {
			if id, ok := stale[ev.Subject]; ok && strings.Contains(ev.Message, id) && strings.Contains(ev.Message, "deposed") {
				n[ev.Subject] += 1 + ev.Suppressed
			}
		}
		return n
	}
	waitFor(t, "an error event per refused message", func() (bool, string) {
		return len(refusals()) == len(stale), fmt.Sprintf("refusals %v; events:\n%s", refusals(), e.errs)
	})

	// The current leader's sync job of mat-b reads the deposed leader's
	// record and skips; a job without an epoch is done.
	publish(s.Sync(keyB), events.TypeSyncJob, "sync-b-current", events.SyncJob{Key: keyB, Reason: events.ReasonResync}, current)
	publish(s.Sync(keyA), events.TypeSyncJob, "sync-a-noepoch", events.SyncJob{Key: keyA, Reason: events.ReasonResync}, nil)
	syncsDone(3) // the refused one is not among them

	if got := w.clients.For(simB.URL()); len(got) != 0 {
		t.Errorf("%d MAT clients made for mat-b from the deposed leader's messages", len(got))
	}
	if n := simB.Requests(); n != 0 {
		t.Errorf("mat-b's simulator got %d requests", n)
	}
	svcB, err := e.kube.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: plan.LabelInstance + "=" + plan.LabelValue(keyB)})
	if err != nil {
		t.Fatal(err)
	}
	if len(svcB.Items) != 0 {
		t.Errorf("%d Services created for mat-b, want none", len(svcB.Items))
	}
	if got := uids(e.services()); !maps.Equal(got, before) {
		t.Errorf("mat-a's Services changed by the deposed leader's clean-up:\nbefore %v\nafter  %v", before, got)
	}
	if st := w.Stats(); st.Cleanups != 0 || st.DeleteJobs != 0 || st.Deleted != 0 {
		t.Errorf("clean-up done: %+v", st)
	}
	for subj, n := range refusals() {
		if n != 1 {
			t.Errorf("%s: %d refusals reported, want 1", subj, n)
		}
	}

	// A worker that starts now refuses the deposed leader's job at once.
	w.Stop()
	w2 := e.startWorker(workerOpts{Name: "w2"})
	publish(s.Cleanup(keyA), events.TypeCleanupJob, "cleanup-a-stale-2", events.CleanupJob{Key: keyA, Scope: "test"}, deposed)
	waitFor(t, "w2 refuses the deposed leader's clean-up", func() (bool, string) {
		for _, ev := range e.errs.Of(events.ErrorDiscovery) {
			if ev.Worker == "w2" && strings.Contains(ev.Message, "cleanup-a-stale-2") {
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	if st := w2.Stats(); st.Cleanups != 0 || st.Deleted != 0 {
		t.Errorf("w2 did the deposed leader's clean-up: %+v", st)
	}
	if got := uids(e.services()); !maps.Equal(got, before) {
		t.Errorf("mat-a's Services changed by the deposed leader's clean-up after a restart")
	}
}
