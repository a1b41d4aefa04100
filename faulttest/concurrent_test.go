package faulttest

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// TestTwoWorkersOnOneInstance (issue point 9): two worker processes with
// one job slot each get a sync job for the same 200-Service instance at the
// same moment, three times: when every Service must be created (both
// create: AlreadyExists, or "IP already allocated" for the same Service),
// when every Service must be updated (both update from their informer
// caches: 409 Conflict), and when some BMC IPs change (both re-create:
// delete preconditions fail, creates collide). Each round ends with exactly
// the desired Services, both workers applied the plan in every round, and
// no error event is published: AlreadyExists and Conflict are absorbed.
func TestTwoWorkersOnOneInstance(t *testing.T) {
	w := newWorld(t)
	in := w.newInstance("shared", fleetSpec{hosts: 90, switches: 10, shelves: 10}, 0)
	workers := []*proc{w.startWorker("w1", "--jobs", "1", "--log-level", "debug"), w.startWorker("w2", "--jobs", "1", "--log-level", "debug")}
	inst := events.Instance{Key: in.key(), URL: in.url, Scope: "static:faulttest"}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Instance(inst.Key), events.TypeInstanceAppeared, "appeared-shared", inst); err != nil {
		t.Fatal(err)
	}
	round := func(name string, change func()) map[string]string {
		t.Helper()
		change()
		applied := []int{workers[0].log.Count("applying plan", inst.Key), workers[1].log.Count("applying plan", inst.Key)}
		start := time.Now()
		for i := range 2 {
			if err := w.bus.Publish(w.ctx, w.bus.Subjects().Sync(inst.Key), events.TypeSyncJob, fmt.Sprintf("%s-%d", name, i),
				events.SyncJob{Key: inst.Key, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
		}
		var got map[string]string
		w.waitFor(name+": converged", time.Minute, func() (bool, string) {
			svcs := in.services()
			got = versions(svcs)
			if !sameNames(svcs, in.want()) {
				return false, diffNames(svcs, in.want())
			}
			// Every Service carries what the fleet says now.
			for name, d := range in.devices() {
				s := svcs[name]
				if s.Spec.ClusterIP != d.BMC.IP || s.Annotations[plan.AnnotationPowerState] != d.PowerState {
					return false, "not updated yet: " + name
				}
			}
			ci, err := w.consumerInfo("SYNC", events.SyncConsumer)
			return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0, "jobs running"
		})
		both := workers[0].log.Count("applying plan", inst.Key) > applied[0] && workers[1].log.Count("applying plan", inst.Key) > applied[1]
		conflicts := workers[0].log.Count("retrying Service write", "modified") + workers[1].log.Count("retrying Service write", "modified")
		t.Logf("measured: %s: converged in %v; both workers applied: %v; conflicts retried so far: %d",
			name, time.Since(start).Round(time.Millisecond), both, conflicts)
		if !both {
			t.Errorf("%s: the two workers did not both work on the instance (nothing proven)", name)
		}
		return got
	}

	round("create", func() {})
	round("update", func() {
		f := in.sim.Fleet()
		for i := range f.Machines {
			f.Machines[i].PowerState = "Off"
			for j := range f.Machines[i].DPUs {
				f.Machines[i].DPUs[j].PowerState = "Off"
			}
		}
		if err := in.sim.SetFleet(f); err != nil {
			t.Fatal(err)
		}
	})
	before := versions(in.services())
	after := round("re-create", func() {
		f := in.sim.Fleet()
		// Ten hosts move to unused addresses of the fleet's subnet (its
		// 200 devices use .1 to .200 of the first /24).
		for i := range 10 {
			a := netip.MustParseAddr(f.Machines[i].BMC.IP).As4()
			a[3] = byte(250 - i)
			if err := in.sim.SetBMCIP(f.Machines[i].MatID, netip.AddrFrom4(a).String()); err != nil {
				t.Fatal(err)
			}
		}
	})
	changed := 0
	for n, v := range after {
		if before[n] != v {
			changed++
		}
	}
	if changed < 10 {
		t.Errorf("only %d Services changed in the re-create round, want >= 10", changed)
	}
	if n := w.errs.Len(); n != 0 {
		t.Errorf("error events:\n%s", w.errs)
	}
}
