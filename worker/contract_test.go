package worker_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/matbus/matbus/discovery"

	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// oldControllerServices is what the old polling controller itself wrote for
// the three instances of goldenInstances (a copy of
// shared/fixtures/old-controller).
const oldControllerServices = "../plan/testdata/old-controller/services.json"

// goldenInstances: discovered Service, pod-name label and Deployment,
// status fixture, as in the old controller's fixture run.
var goldenInstances = []struct{ service, pod, fixture string }{
	{"mat-0-bmc-mock", "mat-0", "../matclient/testdata/v2-mixed.json"},
	{"mat-1-bmc-mock", "mat-1", "../matclient/testdata/legacy-small.json"},
	{"mat-2-bmc-mock", "mat-2", "../matclient/testdata/long-ids.json"},
}

// Documented additions (ADR 14): keys matbus adds to an adopted Service;
// "ssh" is the newer controller's port, added when MAT advertises SSH.
var (
	addedLabels      = []string{plan.LabelInstance, plan.LabelDeviceKind, plan.LabelPodName}
	addedAnnotations = []string{plan.AnnotationMatID, plan.AnnotationSSHPort}
)

func without(m map[string]string, keys []string) map[string]string {
	c := maps.Clone(m)
	for _, k := range keys {
		delete(c, k)
	}
	return c
}

func portsWithoutSSH(ps []corev1.ServicePort) []corev1.ServicePort {
	return slices.DeleteFunc(slices.Clone(ps), func(p corev1.ServicePort) bool { return p.Name == plan.PortSSH })
}

// createOldControllerServices creates the MAT Deployments and the Services of
// services.json in the test's namespace, as the old controller did (its
// cluster IPs, its labels, annotations, selector and owner references with
// the Deployments' UIDs), and returns them as created, by name.
func createOldControllerServices(e *env) map[string]*corev1.Service {
	e.t.Helper()
	uid := map[string]string{}
	for _, gi := range goldenInstances {
		labels := map[string]string{"app.kubernetes.io/name": "nico-machine-a-tron", plan.PodNameLabel: gi.pod}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: gi.pod, Namespace: e.ns},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "mat", Image: "machine-a-tron:test"}}},
				},
			},
		}
		d, err := e.kube.AppsV1().Deployments(e.ns).Create(e.ctx, d, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("create Deployment %s: %v", gi.pod, err)
		}
		uid[gi.pod] = string(d.UID)
	}
	body, err := os.ReadFile(oldControllerServices)
	if err != nil {
		e.t.Fatal(err)
	}
	var list corev1.ServiceList
	if err := json.Unmarshal(body, &list); err != nil {
		e.t.Fatalf("services.json: %v", err)
	}
	out := map[string]*corev1.Service{}
	for i := range list.Items {
		s := list.Items[i].DeepCopy()
		s.Namespace = e.ns
		for j := range s.OwnerReferences {
			s.OwnerReferences[j].UID = types.UID(uid[s.OwnerReferences[j].Name])
		}
		got, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, s, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("create the old controller's %s: %v", s.Name, err)
		}
		out[got.Name] = got
	}
	return out
}

// writes returns the worker's write requests (POST, PUT, PATCH, DELETE) on
// Services, by "METHOD services[/name]".
func (c *apiCalls) writes() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, n := range c.n {
		method, what, _ := strings.Cut(k, " ")
		if method != "GET" && strings.HasPrefix(what, "services") {
			out[k] = n
		}
	}
	return out
}

// TestTakeOverFromOldController: a namespace holds the Services the old
// controller wrote (services.json) for three instances; a worker with the
// default options takes over. On the real API server: every old Service that
// a status wants gets exactly one write, an update that adds only the
// documented additions; its UID, selector, ports (but an ssh port where MAT
// advertises SSH), cluster IP, owner and contract keys stay; the old
// Services of devices without a BMC IP get no write at all; nothing is
// deleted; and once converged, further syncs write nothing.
func TestTakeOverFromOldController(t *testing.T) {
	e := newEnv(t)
	old := createOldControllerServices(e)

	w := startGolden(e)

	adopted := func(s *corev1.Service) bool { return s.Labels[plan.LabelInstance] != "" }
	withIP := 0
	for _, o := range old {
		if o.Annotations[plan.AnnotationBMCIP] != "" {
			withIP++
		}
	}
	waitFor(t, "every old Service with a BMC IP adopted", func() (bool, string) {
		n := 0
		for name, s := range e.services() {
			if old[name] != nil && adopted(s) {
				n++
			}
		}
		return n == withIP, fmt.Sprintf("%d of %d adopted", n, withIP)
	})
	waitSyncs(t, w, 6) // two more rounds of the three instances
	converged := w.api.writes()

	now := e.services()
	for name, o := range old {
		s := now[name]
		if s == nil {
			t.Errorf("%s: the old controller's Service was deleted", name)
			continue
		}
		puts := converged["PUT services/"+name]
		if converged["DELETE services/"+name] > 0 || converged["PATCH services/"+name] > 0 {
			t.Errorf("%s: deleted or patched: %v", name, converged)
		}
		if s.UID != o.UID {
			t.Errorf("%s: recreated (UID %s, was %s)", name, s.UID, o.UID)
		}
		if !maps.Equal(s.Spec.Selector, o.Spec.Selector) {
			t.Errorf("%s: selector %v, was %v", name, s.Spec.Selector, o.Spec.Selector)
		}
		if !reflect.DeepEqual(portsWithoutSSH(s.Spec.Ports), o.Spec.Ports) {
			t.Errorf("%s: ports %+v, was %+v", name, s.Spec.Ports, o.Spec.Ports)
		}
		if s.Spec.ClusterIP != o.Spec.ClusterIP || !slices.Equal(s.Spec.ClusterIPs, o.Spec.ClusterIPs) || len(s.Spec.ExternalIPs) > 0 {
			t.Errorf("%s: IPs %s %v %v, were %s %v", name, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalIPs, o.Spec.ClusterIP, o.Spec.ClusterIPs)
		}
		if !reflect.DeepEqual(s.OwnerReferences, o.OwnerReferences) {
			t.Errorf("%s: owner references %+v, were %+v", name, s.OwnerReferences, o.OwnerReferences)
		}
		if got := without(s.Labels, addedLabels); !maps.Equal(got, o.Labels) {
			t.Errorf("%s: labels beyond the additions %v, were %v", name, got, o.Labels)
		}
		if got := without(s.Annotations, addedAnnotations); !maps.Equal(got, o.Annotations) {
			t.Errorf("%s: annotations beyond the additions %v, were %v", name, got, o.Annotations)
		}
		if o.Annotations[plan.AnnotationBMCIP] == "" {
			if puts != 0 || adopted(s) {
				t.Errorf("%s (no BMC IP, the device is held): %d updates, adopted %v; want none", name, puts, adopted(s))
			}
			continue
		}
		if puts != 1 {
			t.Errorf("%s: %d updates, want exactly 1 (the additions)", name, puts)
		}
		if s.Labels[plan.LabelInstance] != plan.LabelValue(e.key(s.OwnerReferences[0].Name+"-bmc-mock")) ||
			s.Labels[plan.LabelPodName] != s.OwnerReferences[0].Name || s.Annotations[plan.AnnotationMatID] == "" ||
			s.Labels[plan.LabelDeviceKind] == "" {
			t.Errorf("%s: additions %v %v", name, s.Labels, s.Annotations)
		}
	}
	for k := range converged {
		if name, ok := strings.CutPrefix(k, "PUT services/"); ok && old[name] == nil {
			t.Errorf("update of %s, which matbus created itself: the create should have been final", name)
		}
	}

	// Steady: more syncs, no update or delete, and no Service changes. (The
	// creates of legacy-small's BMCs outside the service range are refused
	// by the API server at every sync, as they were for the old controller;
	// each such create is a POST to the collection, never a change.)
	before := e.services()
	waitSyncs(t, w, 6)
	after := w.api.writes()
	delete(after, "POST services")
	delete(converged, "POST services")
	if !maps.Equal(after, converged) {
		t.Errorf("writes after convergence:\nbefore %v\nafter  %v", converged, after)
	}
	for name, s := range e.services() {
		if b := before[name]; b == nil || b.ResourceVersion != s.ResourceVersion {
			t.Errorf("%s changed after convergence", name)
		}
	}
	t.Logf("writes at takeover: %v", converged)
}

// startGolden starts the fixture run's three instances (simulators,
// discovery with pod names and owners) and a worker with the default
// options (the old controller's target selector, state annotations on).
func startGolden(e *env) *testWorker {
	e.t.Helper()
	entries := make([]discovery.StaticEntry, 0, len(goldenInstances))
	for _, gi := range goldenInstances {
		sim := e.startSim(matsim.Options{FixturePath: gi.fixture})
		en := e.entry(gi.service, sim.URL())
		en.PodName, en.Owner = gi.pod, gi.pod
		entries = append(entries, en)
	}
	e.startDiscovery(entries...)
	k, v, _ := strings.Cut(plan.DefaultTargetSelector, "=")
	return e.startWorker(workerOpts{Tweak: func(c *worker.Config) {
		c.Plan.TargetSelector = map[string]string{k: v}
		c.Plan.StateAnnotations = true
	}})
}

// TestCreatedServicesMatchOldController: in an empty namespace (the MAT
// Deployments only), the Services a worker creates for the fixture run's
// instances are, field by field, those of services.json with only the
// documented additions — for every Service the old controller made with a
// BMC IP (the others belong to devices matbus holds until they have one).
func TestCreatedServicesMatchOldController(t *testing.T) {
	e := newEnv(t)
	old := createOldControllerServices(e)
	for name := range old { // keep the Deployments, drop the Services
		if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the old Services gone", func() (bool, string) { return len(e.services()) == 0, fmt.Sprint(names(e.services())) })
	startGolden(e)

	for name, o := range old {
		if o.Annotations[plan.AnnotationBMCIP] == "" {
			continue
		}
		var s *corev1.Service
		waitFor(t, name+" created", func() (bool, string) { s = e.service(name); return s != nil, "not yet" })
		if got := without(s.Labels, addedLabels); !maps.Equal(got, o.Labels) {
			t.Errorf("%s: labels %v, want %v (+ additions)", name, got, o.Labels)
		}
		if got := without(s.Annotations, addedAnnotations); !maps.Equal(got, o.Annotations) {
			t.Errorf("%s: annotations %v, want %v (+ additions)", name, got, o.Annotations)
		}
		if !maps.Equal(s.Spec.Selector, o.Spec.Selector) || !reflect.DeepEqual(portsWithoutSSH(s.Spec.Ports), o.Spec.Ports) {
			t.Errorf("%s: selector %v ports %+v, want %v %+v", name, s.Spec.Selector, s.Spec.Ports, o.Spec.Selector, o.Spec.Ports)
		}
		if s.Spec.ClusterIP != o.Spec.ClusterIP || s.Spec.Type != o.Spec.Type || s.Spec.SessionAffinity != o.Spec.SessionAffinity ||
			!slices.Equal(s.Spec.IPFamilies, o.Spec.IPFamilies) || !reflect.DeepEqual(s.Spec.InternalTrafficPolicy, o.Spec.InternalTrafficPolicy) {
			t.Errorf("%s: spec %+v, want %+v", name, s.Spec, o.Spec)
		}
		if !reflect.DeepEqual(s.OwnerReferences, o.OwnerReferences) {
			t.Errorf("%s: owner references %+v, want %+v", name, s.OwnerReferences, o.OwnerReferences)
		}
	}
}

// TestLegacyMatbusServicesConvergeInPlace: Services as earlier matbus
// versions wrote them (matbus.io/* keys only) are updated in place to the
// contract: same UID, contract keys written, legacy keys gone, foreign keys
// kept.
func TestLegacyMatbusServicesConvergeInPlace(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{Name: "current"})
	want := e.waitServices(v2MixedNames()...)
	w.Stop()

	legacy := map[string]string{ // contract key -> the key earlier versions wrote
		plan.LabelMatID: "matbus.io/mat-id", plan.LabelMachineID: "matbus.io/machine-id", plan.LabelParentID: "matbus.io/parent-mat-id",
	}
	legacyAnn := map[string]string{
		plan.AnnotationBMCIP: "matbus.io/bmc-ip", plan.AnnotationNVOSIP: "matbus.io/nvos-ip",
		plan.AnnotationHardwareType: "matbus.io/hardware-type", plan.AnnotationRedfishPort: "matbus.io/redfish-listen-port",
		plan.AnnotationIPMIPort: "matbus.io/ipmi-listen-port", plan.AnnotationSSHPort: "matbus.io/ssh-listen-port",
	}
	svcs := e.kube.CoreV1().Services(e.ns)
	before := map[string]*corev1.Service{}
	for name := range want {
		s := e.service(name)
		for k, lk := range legacy {
			if v, ok := s.Labels[k]; ok {
				delete(s.Labels, k)
				s.Labels[lk] = v
			}
		}
		delete(s.Labels, plan.LabelMachineType)
		for k, lk := range legacyAnn {
			if v, ok := s.Annotations[k]; ok {
				delete(s.Annotations, k)
				s.Annotations[lk] = v
			}
		}
		s.Labels["team.example.com/owner"] = "infra"
		s, err := svcs.Update(e.ctx, s, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[name] = s
	}

	e.startWorker(workerOpts{Name: "next"})
	for name, b := range before {
		waitFor(t, name+" converged", func() (bool, string) {
			s := e.service(name)
			if s == nil {
				return false, "gone"
			}
			if s.UID != b.UID {
				t.Fatalf("%s recreated", name)
			}
			w := want[name]
			return maps.Equal(without(s.Labels, []string{"team.example.com/owner"}), w.Labels) && maps.Equal(s.Annotations, w.Annotations) &&
					s.Labels["team.example.com/owner"] == "infra",
				fmt.Sprintf("labels %v annotations %v", s.Labels, s.Annotations)
		})
	}
}
