package faulttest

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// natsRecoveryBound is the bound docs/delivery-guarantees.md states: after
// nats-server accepts connections again (or after a consumer or stream was
// lost), events published from then on are handled within it.
const natsRecoveryBound = 30 * time.Second

// TestNATSRestart (issue point 3): two worker processes and a leader-elected
// Kubernetes discovery process run against a nats-server process with a
// file store. Four faults, one after the other:
//
//  1. nats-server stops cleanly (SIGTERM) and restarts on the same store;
//  2. nats-server is killed (SIGKILL) and restarts with its store lost:
//     no streams, no consumers, no de-duplication state;
//  3. the job consumers are deleted while everything runs;
//  4. the job streams are deleted while everything runs.
//
// After each, every process is still running, the publisher republishes,
// the workers re-create what is missing, and an instance that appears and
// one that disappears after the fault are both handled within
// natsRecoveryBound. Services of instances that stay are never touched.
func TestNATSRestart(t *testing.T) {
	w := newWorld(t)
	spec := fleetSpec{hosts: 5, switches: 1, shelves: 1}
	insts := map[string]*instance{}
	for _, n := range []string{"mat-a", "mat-b", "mat-c", "mat-d", "mat-e", "mat-f", "mat-g", "mat-h"} {
		insts[n] = w.newInstance(n, spec, 0)
	}
	w.discover(insts["mat-a"])
	w.discover(insts["mat-b"])
	w.discover(insts["mat-g"]) // stays all along
	workers := []*proc{w.startWorker("w1"), w.startWorker("w2")}
	disc := w.startDiscovery("disc-1")
	insts["mat-a"].waitConverged(time.Minute)
	insts["mat-b"].waitConverged(time.Minute)
	keep := uidsOf(insts["mat-g"].waitConverged(time.Minute))

	// handled waits until add has its Services and remove has none, and
	// logs how long that took from since.
	handled := func(fault string, since time.Time, add, remove *instance) {
		t.Helper()
		add.waitConverged(natsRecoveryBound)
		remove.waitGone(natsRecoveryBound)
		t.Logf("measured: %s: new instance converged and gone instance cleaned up %v after recovery",
			fault, time.Since(since).Round(time.Millisecond))
		for _, p := range append([]*proc{disc}, workers...) {
			if p.Exited() {
				t.Fatalf("%s: %s exited: %v", fault, p.name, p.state)
			}
		}
		if got := uidsOf(insts["mat-g"].services()); !maps.Equal(got, keep) {
			t.Fatalf("%s: the Services of mat-g changed", fault)
		}
	}

	// 1. Clean restart on the same store; the instance set changes while
	// NATS is away.
	w.nats.Stop(false)
	w.discover(insts["mat-c"])
	w.undiscover(insts["mat-a"])
	time.Sleep(3 * time.Second)
	w.nats.Start()
	handled("restart on the same store, changes made while NATS was down", time.Now(), insts["mat-c"], insts["mat-a"])

	// 2. Crash with the store lost. The publisher must announce the
	// instances again before one can be reported gone (see the guarantees).
	w.nats.Stop(true)
	w.nats.WipeStore()
	time.Sleep(time.Second)
	w.nats.Start()
	up := time.Now()
	took := w.waitFor("instances republished", natsRecoveryBound, func() (bool, string) {
		return w.instancePresent(insts["mat-b"]) && w.instancePresent(insts["mat-c"]) && w.instancePresent(insts["mat-g"]), "not yet"
	})
	t.Logf("measured: store lost: instances republished %v after nats-server was back", took.Round(time.Millisecond))
	w.discover(insts["mat-d"])
	w.undiscover(insts["mat-b"])
	handled("restart with the store lost, changes made after", up, insts["mat-d"], insts["mat-b"])

	// 3. Consumers deleted.
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	for _, c := range [][2]string{{"SYNC", events.SyncConsumer}, {"DELETE", events.DeleteConsumer}} {
		if err := w.js.DeleteConsumer(ctx, w.bus.StreamName(events.Role(c[0])), events.ConsumerName(c[1], w.ns)); err != nil {
			t.Fatalf("delete consumer %s: %v", c[1], err)
		}
	}
	since := time.Now()
	w.discover(insts["mat-e"])
	w.undiscover(insts["mat-c"])
	handled("job consumers deleted", since, insts["mat-e"], insts["mat-c"])

	// 4. Job streams deleted.
	for _, s := range []string{"SYNC", "DELETE"} {
		if err := w.js.DeleteStream(ctx, w.bus.StreamName(events.Role(s))); err != nil {
			t.Fatalf("delete stream %s: %v", s, err)
		}
	}
	since = time.Now()
	w.discover(insts["mat-f"])
	w.undiscover(insts["mat-d"])
	handled("job streams deleted", since, insts["mat-f"], insts["mat-d"])

	// 5. (long runs) An outage longer than a publish is retried (30 s).
	if longRun() {
		w.nats.Stop(false)
		w.discover(insts["mat-h"])
		w.undiscover(insts["mat-e"])
		time.Sleep(40 * time.Second)
		w.nats.Start()
		handled("40 s outage, changes made while NATS was down", time.Now(), insts["mat-h"], insts["mat-e"])
	}

	for _, e := range w.errs.All() {
		switch e.Err.Kind {
		case events.ErrorCreate, events.ErrorUpdate, events.ErrorDelete:
			t.Errorf("Service write failed: %s", formatErrs([]errEvent{e}))
		}
	}
	t.Logf("error events (publishing failures while NATS was away are expected):\n%s", w.errs)
}
