package faulttest

import (
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/plan"
)

// sibling returns a world in a second namespace that shares w's NATS
// server, test connection and error sink. Its processes and namespace are
// removed before w's cleanup runs.
func (w *world) sibling() *world {
	w.t.Helper()
	s := &world{t: w.t, ctx: w.ctx, dir: w.dir, nats: w.nats, nc: w.nc, js: w.js, bus: w.bus, errs: w.errs, log: w.log,
		ns: testenv.Namespace("g", w.t.Name())}
	if _, err := adminKube.CoreV1().Namespaces().Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("create namespace: %v", err)
	}
	w.t.Cleanup(func() {
		s.mu.Lock()
		stops, procs := s.stops, s.procs
		s.stops, s.procs = nil, nil
		s.mu.Unlock()
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		for _, p := range procs {
			p.stop()
		}
		s.deleteNamespace()
	})
	return s
}

// managedServices returns every Service matbus manages in the world's
// namespace, by name, with the value of its instance label.
func (w *world) managedServices() map[string]string {
	w.t.Helper()
	out := map[string]string{}
	for n, s := range w.servicesBy(plan.LabelManagedBy + "=mat-k8s-controller") {
		out[n] = s.Labels[plan.LabelInstance]
	}
	return out
}

// TestTwoPipelinesOnOneNATS runs two full pipelines (Kubernetes discovery
// with leader election and two workers each) in two namespaces on one NATS
// server and subject prefix. Each converges its own instances in its own
// namespace, an instance removed in one is cleaned up there only, no
// Service of one namespace's instance appears in the other, no error event
// is published, and neither scheduler counts the other's results.
func TestTwoPipelinesOnOneNATS(t *testing.T) {
	a := newWorld(t)
	b := a.sibling()
	spec := fleetSpec{hosts: 3, switches: 1, shelves: 1}
	// Same names (and, from the same seeds, the same device ids) in both
	// namespaces; the fleets' BMC subnets differ.
	inA := []*instance{a.newInstance("mat-0", spec, 0), a.newInstance("mat-1", spec, 0)}
	inB := []*instance{b.newInstance("mat-0", spec, 0), b.newInstance("mat-1", spec, 0)}
	for _, in := range inA {
		a.discover(in)
	}
	for _, in := range inB {
		b.discover(in)
	}
	discA, discB := a.startDiscovery("disc-a"), b.startDiscovery("disc-b")
	a.startWorker("wa-1")
	b.startWorker("wb-1")
	a.startWorker("wa-2")
	b.startWorker("wb-2")
	for _, in := range append(append([]*instance{}, inA...), inB...) {
		in.waitConverged(time.Minute)
	}
	for _, w := range []*world{a, b} {
		for name, inst := range w.managedServices() {
			if !strings.HasPrefix(inst, w.ns+".") {
				t.Errorf("namespace %s holds Service %s of instance %q", w.ns, name, inst)
			}
		}
	}
	before := uidsOf(inA[1].services())

	// An instance of B goes: its Services are deleted (clean-up and delete
	// jobs of B), A's twin of the same name keeps every Service.
	b.undiscover(inB[1])
	inB[1].waitGone(time.Minute)
	time.Sleep(3 * syncInterval) // a few more ticks of both pipelines
	if got := uidsOf(inA[1].services()); !maps.Equal(got, before) {
		t.Errorf("removing %s changed the Services of %s", inB[1].key(), inA[1].key())
	}
	inA[0].waitConverged(10 * time.Second)
	inB[0].waitConverged(10 * time.Second)

	if n := a.errs.Len(); n > 0 {
		t.Errorf("%d error events:\n%s", n, a.errs)
	}
	// Each pipeline's consumers are its own; no unfiltered one exists.
	for _, w := range []*world{a, b} {
		for stream, role := range map[string]string{"SYNC": events.SyncConsumer, "DELETE": events.DeleteConsumer} {
			ci, err := w.consumerInfo(stream, role)
			if err != nil {
				t.Errorf("consumer %s of %s: %v", role, w.ns, err)
				continue
			}
			for _, f := range ci.Config.FilterSubjects {
				if !strings.Contains(f, "."+w.ns+".") {
					t.Errorf("consumer %s filters %q", ci.Name, f)
				}
			}
		}
		if _, err := w.js.Consumer(w.ctx, w.bus.StreamName(events.StreamSync), events.SyncConsumer); err == nil {
			t.Errorf("an unfiltered %s consumer exists", events.SyncConsumer)
		}
	}
	// A scheduler that read the other pipeline's results would count more
	// results than it sent jobs.
	for _, p := range []*proc{discA, discB} {
		m, err := p.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		var sent, back float64
		for k, v := range m {
			switch {
			case strings.HasPrefix(k, "matbus_scheduler_jobs_dispatched_total{"):
				sent += v
			case strings.HasPrefix(k, "matbus_scheduler_results_total{"):
				back += v
			}
		}
		if back > sent || sent == 0 {
			t.Errorf("%s: %v results for %v jobs sent", p.name, back, sent)
		}
	}
}
