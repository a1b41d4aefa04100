package worker_test

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// TestHandoverOnModeChange: a worker in cluster-ip mode starts beside a
// running worker in external-ip mode, as in a rolling update of the chart
// that changes worker.bmcIPMode. The older worker stands by (it reports
// why, and writes nothing more), the newer one moves every Service once —
// one delete and one create each, however many syncs run while both are
// up. When the newer worker stops (a rollback), the older one takes jobs
// again and moves every Service back, once more each.
func TestHandoverOnModeChange(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	external := func(c *worker.Config) { c.Plan.IPMode = plan.IPModeExternalIP }
	old := e.startWorker(workerOpts{Name: "old-external-ip", Tweak: external})
	inForm := func(what string, ok func(*corev1.Service) bool) {
		t.Helper()
		waitFor(t, "every Service in "+what+" form", func() (bool, string) {
			svcs := e.services()
			if len(svcs) != len(v2MixedServices) {
				return false, fmt.Sprintf("%d Services", len(svcs))
			}
			for n, s := range svcs {
				if !ok(s) {
					return false, fmt.Sprintf("%s: clusterIP %s externalIPs %v", n, s.Spec.ClusterIP, s.Spec.ExternalIPs)
				}
			}
			return true, ""
		})
	}
	isExternal := func(s *corev1.Service) bool {
		return slices.Equal(s.Spec.ExternalIPs, []string{plan.ServiceIP(s)}) && s.Spec.ClusterIP != plan.ServiceIP(s)
	}
	isCluster := func(s *corev1.Service) bool {
		return s.Spec.ClusterIP == plan.ServiceIP(s) && len(s.Spec.ExternalIPs) == 0
	}
	inForm("external-ip", isExternal)
	if err := old.TakesJobs(); err != nil {
		t.Fatalf("the only worker does not take jobs: %v", err)
	}

	life := e.watchServiceLife()
	newer := e.startWorker(workerOpts{Name: "new-cluster-ip"})
	waitFor(t, "the older worker standing by", func() (bool, string) {
		err := old.TakesJobs()
		return err != nil, "takes jobs"
	})
	t.Logf("older worker: %v", old.TakesJobs())
	nc, bus := e.connect("reader")
	waitFor(t, "the older worker's entry marked standby for the newer", func() (bool, string) {
		ws, err := bus.ReadWorkers(e.ctx, e.ns)
		if err != nil || len(ws) != 2 {
			return false, fmt.Sprintf("%+v %v", ws, err)
		}
		return ws[0].Name == "old-external-ip" && ws[0].Standby && ws[0].StandbyFor == "new-cluster-ip" &&
			ws[1].Name == "new-cluster-ip" && !ws[1].Standby && ws[0].Fingerprint != ws[1].Fingerprint, fmt.Sprintf("%+v", ws)
	})
	nc.Close()
	inForm("cluster-ip", isCluster)
	before := old.Stats()
	waitSyncs(t, newer, 6) // 3 s of syncs with both workers up
	if after := old.Stats(); after.Syncs != before.Syncs || after.Created+after.Updated+after.Recreated+after.Deleted != before.Created+before.Updated+before.Recreated+before.Deleted {
		t.Errorf("the standing-by worker ran jobs: %+v then %+v", before, after)
	}
	if err := newer.TakesJobs(); err != nil {
		t.Errorf("the newer worker does not take jobs: %v", err)
	}
	once := func(want int) {
		t.Helper()
		life.mu.Lock()
		defer life.mu.Unlock()
		for name := range e.services() {
			if d, a := len(life.deletes[name]), len(life.adds[name]); d != want || a != want {
				t.Errorf("Service %s: deleted %d and created %d times, want %d each", name, d, a, want)
			}
		}
	}
	once(1)

	// Rollback: the newer worker goes; the older takes jobs again.
	newer.Stop()
	waitFor(t, "the older worker taking jobs again", func() (bool, string) {
		err := old.TakesJobs()
		return err == nil, fmt.Sprint(err)
	})
	inForm("external-ip", isExternal)
	waitSyncs(t, old, 4)
	once(2)
}
