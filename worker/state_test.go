package worker_test

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// writes returns the Service writes (POST, PUT, PATCH, DELETE) c counted.
func writes(c *apiCalls) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.n {
		method, what, _ := strings.Cut(k, " ")
		if strings.HasPrefix(what, "services") && method != "GET" {
			n += v
		}
	}
	return n
}

// TestStateAnnotationsOff: Services written with state annotations lose
// them at the next sync of a worker with them off (the default), foreign
// annotations stay, and later power and API state flips make no API write
// at all, counted on the worker's client. Switched on again, the next flip
// is written.
func TestStateAnnotationsOff(t *testing.T) {
	e := newEnv(t)
	fleet := fixtureFleet(t, fixtureV2Mixed)
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	on := func(c *worker.Config) { c.Plan.StateAnnotations = true }
	first := e.startWorker(workerOpts{Name: "with-state", Tweak: on})
	before := e.waitServices(v2MixedNames()...)
	const host = "mat-bmc-host-922f3d9b-20b-4da64654"
	if before[host].Annotations[plan.AnnotationPowerState] != "On" {
		t.Fatalf("%s: annotations %v, want the power state", host, before[host].Annotations)
	}
	svc := before[host].DeepCopy()
	svc.Annotations["example.com/note"] = "keep"
	if _, err := e.kube.CoreV1().Services(e.ns).Update(e.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	first.Stop()

	w := e.startWorker(workerOpts{Name: "default"})
	hasState := func() (int, string) {
		n := 0
		for name, s := range e.services() {
			for _, k := range []string{plan.AnnotationAPIState, plan.AnnotationPowerState} {
				if _, ok := s.Annotations[k]; ok {
					n++
					return n, name + " still has " + k
				}
			}
		}
		return 0, ""
	}
	waitFor(t, "state annotations removed", func() (bool, string) {
		n, state := hasState()
		return n == 0, state
	})
	if got := e.service(host).Annotations["example.com/note"]; got != "keep" {
		t.Errorf("foreign annotation lost: %q", got)
	}
	waitSyncs(t, w, 2)
	after := e.services()
	base := writes(w.api)
	if st := w.Stats(); st.Updated != int64(len(v2MixedServices)-1) || st.Created != 0 || st.Recreated != 0 {
		// Every BMC Service carried state annotations; the NVOS Service never does.
		t.Errorf("stats after removal = %+v, want %d updates only", st, len(v2MixedServices)-1)
	}

	// Three rounds of power and API state flips of every device.
	next := fleet
	for round, power := range []string{"Off", "On", "Off"} {
		next = next.Clone()
		for i := range next.Machines {
			next.Machines[i].PowerState = power
			next.Machines[i].APIState = fmt.Sprintf("Assigned/Ready-%d", round)
			for j := range next.Machines[i].DPUs {
				next.Machines[i].DPUs[j].PowerState = power
			}
		}
		if err := sim.SetFleet(next); err != nil {
			t.Fatal(err)
		}
		planned := w.Stats().Syncs - w.Stats().Unchanged
		waitFor(t, fmt.Sprintf("round %d planned", round), func() (bool, string) {
			st := w.Stats()
			return st.Syncs-st.Unchanged > planned+1, fmt.Sprintf("%+v", st)
		})
	}
	if got := writes(w.api) - base; got != 0 {
		t.Errorf("%d Service writes during power flips with state annotations off, want 0", got)
	}
	for name, s := range e.services() {
		if s.ResourceVersion != after[name].ResourceVersion {
			t.Errorf("%s written during power flips", name)
		}
	}
	w.Stop()

	// Switched on: the current state is written.
	e.startWorker(workerOpts{Name: "state-again", Tweak: on})
	waitFor(t, "state annotations back", func() (bool, string) {
		s := e.service(host)
		return s.Annotations[plan.AnnotationPowerState] == "Off", fmt.Sprintf("%v", s.Annotations)
	})
}
