package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// matAPIService creates the MAT Service of instance name in the test's
// namespace, as discovery finds it (the static source here stands in for
// the informer).
func (e *env) matAPIService(name string) *corev1.Service {
	e.t.Helper()
	svc, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{"nvidia-infra-controller/mat-service": "true"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return svc
}

// kubeEvents starts a Kubernetes Event recorder, stopped with the env.
func (e *env) kubeEvents() *kubeevents.Recorder {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	e.onStop(cancel)
	r, err := kubeevents.Start(ctx, e.kube, kubeevents.Config{Controller: kubeevents.ControllerWorker, Log: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// eventsRegarding lists the events.k8s.io/v1 Events whose regarding.name
// is name, as `kubectl events --for svc/<name>` reads them.
func (e *env) eventsRegarding(name string) []eventsv1.Event {
	e.t.Helper()
	l, err := e.kube.EventsV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

func withReason(evs []eventsv1.Event, reason kubeevents.Reason) *eventsv1.Event {
	for i := range evs {
		if evs[i].Reason == string(reason) {
			return &evs[i]
		}
	}
	return nil
}

// TestKubeEventsTellWhyAnInstanceIsNotSyncing: `kubectl describe svc` of a
// failing instance's MAT Service shows why: a FetchFailed Warning with the
// fetch error, on that Service's UID. A healthy instance whose BMC IP moves
// gets a Recreated Event on the new BMC Service.
func TestKubeEventsTellWhyAnInstanceIsNotSyncing(t *testing.T) {
	e := newEnv(t)
	bad := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.140.0/24", 21)})
	bad.SetFault(matsim.Fault500)
	fleet := generatedFleet(t, "10.96.141.0/24", 22)
	good := e.startSim(matsim.Options{Fleet: fleet})
	badSvc := e.matAPIService("mat-bad")
	e.matAPIService("mat-good")
	rec := e.kubeEvents()
	e.startWorker(workerOpts{Tweak: func(c *worker.Config) { c.Events = rec }})
	e.startDiscovery(e.entry("mat-bad", bad.URL()), e.entry("mat-good", good.URL()))

	var ev *eventsv1.Event
	waitFor(t, "a FetchFailed Event on the failing instance's MAT Service", func() (bool, string) {
		ev = withReason(e.eventsRegarding("mat-bad"), kubeevents.FetchFailed)
		return ev != nil, "none yet"
	})
	if ev.Type != corev1.EventTypeWarning || ev.Regarding.UID != badSvc.UID || ev.Regarding.Kind != "Service" {
		t.Errorf("FetchFailed: type %s, regarding %+v; want a Warning on Service uid %s", ev.Type, ev.Regarding, badSvc.UID)
	}
	if !strings.Contains(ev.Note, "status fetch failed, no Service changed") || !strings.Contains(ev.Note, "500") {
		t.Errorf("FetchFailed note %q: want the fetch error", ev.Note)
	}
	if ev.ReportingController != kubeevents.ControllerWorker {
		t.Errorf("reporting controller %q", ev.ReportingController)
	}

	host := fleet.Machines[0]
	name := plan.ServiceName(plan.MachineTypeOf(host.Kind), host.MatID)
	var old *corev1.Service
	waitFor(t, "the healthy instance's host Service", func() (bool, string) {
		old = e.service(name)
		return old != nil, "not yet"
	})
	if err := good.SetBMCIP(host.MatID, "10.96.141.200"); err != nil {
		t.Fatal(err)
	}
	var cur *corev1.Service
	waitFor(t, "the BMC Service recreated on its new IP", func() (bool, string) {
		cur = e.service(name)
		return cur != nil && cur.Spec.ClusterIP == "10.96.141.200", "not yet"
	})
	waitFor(t, "a Recreated Event on the new BMC Service", func() (bool, string) {
		ev = withReason(e.eventsRegarding(name), kubeevents.Recreated)
		return ev != nil, "none yet"
	})
	if ev.Regarding.UID != cur.UID || ev.Regarding.UID == old.UID || ev.Type != corev1.EventTypeNormal {
		t.Errorf("Recreated on uid %s (%s), want the new Service's %s", ev.Regarding.UID, ev.Type, cur.UID)
	}
	if !strings.Contains(ev.Note, old.Spec.ClusterIP+" -> 10.96.141.200") {
		t.Errorf("Recreated note %q: want both IPs", ev.Note)
	}
	if withReason(e.eventsRegarding("mat-good"), kubeevents.FetchFailed) != nil {
		t.Error("the healthy instance's MAT Service has a FetchFailed Event")
	}
}

// TestNoKubeEventsWhenOff: a worker without a recorder (--kube-events=false)
// makes no Event object, however often an instance fails.
func TestNoKubeEventsWhenOff(t *testing.T) {
	e := newEnv(t)
	bad := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.142.0/24", 23)})
	bad.SetFault(matsim.Fault500)
	e.matAPIService("mat-bad")
	e.startWorker(workerOpts{})
	e.startDiscovery(e.entry("mat-bad", bad.URL()))
	waitFor(t, "three failed fetches", func() (bool, string) {
		return bad.Requests() >= 3, "fewer requests"
	})
	time.Sleep(time.Second) // an Event written after the failures would be listed by now
	l, err := e.kube.EventsV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 0 {
		t.Errorf("%d Event objects with Kubernetes Events off: %+v", len(l.Items), l.Items[0])
	}
}

// TestKubeEventsOnFindingsAndAdoption: a status with an invalid device and
// two devices reporting one BMC IP gives the MAT Service an InvalidDevices
// and a DuplicateBMCIP Warning naming them; the old controller's Service of
// the winning device gets an Adopted Event on its own UID.
func TestKubeEventsOnFindingsAndAdoption(t *testing.T) {
	e := newEnv(t)
	body := statusBody(1, device("dev-a", "10.96.143.1"), device("dev-b", "10.96.143.1"), device("", "10.96.143.4"))
	st, err := matclient.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	desired := plan.Build(plan.Instance{Key: e.key("mat-a")}, st, plan.Options{Namespace: e.ns, IPMode: plan.IPModeClusterIP})
	if len(desired.Services) != 1 {
		t.Fatalf("want one desired Service (dev-a), got %d", len(desired.Services))
	}
	oldSvc := desired.Services[0].DeepCopy()
	delete(oldSvc.Labels, plan.LabelInstance)
	oldSvc, err = e.kube.CoreV1().Services(e.ns).Create(e.ctx, oldSvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.matAPIService("mat-a")
	srv := newBodyServer(t, body)
	rec := e.kubeEvents()
	e.startWorker(workerOpts{Tweak: func(c *worker.Config) { c.Events = rec }})
	e.startDiscovery(e.entry("mat-a", srv.srv.URL))

	var inv, dup, adopted *eventsv1.Event
	waitFor(t, "InvalidDevices, DuplicateBMCIP and Adopted Events", func() (bool, string) {
		evs := e.eventsRegarding("mat-a")
		inv, dup = withReason(evs, kubeevents.InvalidDevices), withReason(evs, kubeevents.DuplicateBMCIP)
		adopted = withReason(e.eventsRegarding(oldSvc.Name), kubeevents.Adopted)
		return inv != nil && dup != nil && adopted != nil, fmt.Sprintf("invalid %v, duplicate %v, adopted %v", inv != nil, dup != nil, adopted != nil)
	})
	if !strings.Contains(inv.Note, "1 invalid devices") || !strings.Contains(inv.Note, "machines[2]") || !strings.Contains(inv.Note, "no Service of this instance is deleted") {
		t.Errorf("InvalidDevices note %q: want the count, the device's path and the held deletes", inv.Note)
	}
	if !strings.Contains(dup.Note, "dev-a") || inv.Type != corev1.EventTypeWarning || dup.Type != corev1.EventTypeWarning {
		t.Errorf("DuplicateBMCIP %s %q: want a Warning naming the winning mat_id", dup.Type, dup.Note)
	}
	if adopted.Regarding.UID != oldSvc.UID || adopted.Type != corev1.EventTypeNormal || !strings.Contains(adopted.Note, e.key("mat-a")) {
		t.Errorf("Adopted on uid %s (%s) %q, want Normal on the old Service's uid %s naming the instance", adopted.Regarding.UID, adopted.Type, adopted.Note, oldSvc.UID)
	}
}
