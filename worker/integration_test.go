package worker_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

type wantPort struct {
	name   string
	proto  corev1.Protocol
	port   int32
	target int32
}

type wantService struct {
	name, matID, typ, ip, parent string
	ports                        []wantPort
}

// v2MixedServices is what the fixture v2-mixed.json must give: one Service
// per device with a BMC IP, named as the old controller named them (hash list
// in the fixtures README), switches and power shelves under "host".
var v2MixedServices = []wantService{
	{"mat-bmc-host-922f3d9b-20b-4da64654", "922f3d9b-20be-461f-9b69-90928701ce93", "host", "10.96.64.10", "",
		[]wantPort{{"redfish", "TCP", 443, 1266}, {"ssh", "TCP", 2222, 2222}}},
	{"mat-bmc-dpu-2458e540-24e-879b716a", "2458e540-24e4-46e5-b2cf-6caac4b9c637", "dpu", "10.96.64.11", "922f3d9b-20be-461f-9b69-90928701ce93",
		[]wantPort{{"redfish", "TCP", 443, 1266}, {"ssh", "TCP", 34011, 34011}}},
	{"mat-bmc-dpu-a15919aa-572-726d4120", "a15919aa-5727-4fb9-84e9-2980007cfc58", "dpu", "10.96.64.12", "922f3d9b-20be-461f-9b69-90928701ce93",
		[]wantPort{{"redfish", "TCP", 443, 1266}, {"ssh", "TCP", 34012, 34012}}},
	{"mat-bmc-host-7ec7b7c3-126-c030b365", "7ec7b7c3-126b-412a-babf-fd79d002e921", "host", "10.96.64.13", "",
		[]wantPort{{"redfish", "TCP", 443, 1266}, {"ipmi", "UDP", 16021, 16021}, {"ssh", "TCP", 2222, 2222}}},
	{"mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50", "9b8d41e8-ad45-4b7d-a541-38d781be09da", "dpu", "10.96.64.14", "7ec7b7c3-126b-412a-babf-fd79d002e921",
		[]wantPort{{"redfish", "TCP", 443, 1266}, {"ssh", "TCP", 34014, 34014}}},
	{"mat-bmc-host-1a530254-57f-964ececc", "1a530254-57f0-4a8d-adb9-7d5520153f50", "switch", "10.96.64.30", "",
		[]wantPort{{"redfish", "TCP", 443, 1266}}},
	{"mat-bmc-host-d5bb3746-fdf-4f4ad08b", "d5bb3746-fdf8-424d-ba9d-3d7d407756a9", "switch", "10.96.64.31", "",
		[]wantPort{{"redfish", "TCP", 443, 1266}}},
	{"mat-bmc-host-624423f1-04b-216d49b5", "624423f1-04b4-404c-8d55-d1cb82fa8ae4", "power-shelf", "10.96.64.40", "",
		[]wantPort{{"redfish", "TCP", 443, 1266}}},
}

func v2MixedNames() []string {
	var out []string
	for _, w := range v2MixedServices {
		out = append(out, w.name)
	}
	return out
}

// TestFullSyncFromFixture: a full sync of v2-mixed.json creates exactly one
// Service per BMC with an IP, with the old controller's names, our labels
// and annotations, the ports MAT advertises and the BMC IP as clusterIP.
func TestFullSyncFromFixture(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})

	got := e.waitServices(v2MixedNames()...)
	waitSyncs(t, w, 2) // further syncs change nothing
	got = e.waitServices(v2MixedNames()...)

	body, err := os.ReadFile(fixtureV2Mixed)
	if err != nil {
		t.Fatal(err)
	}
	st, err := matclient.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	devs := map[string]*matclient.Device{}
	st.Walk(func(d, _ *matclient.Device) { devs[d.MatID] = d })

	for _, want := range v2MixedServices {
		s := got[want.name]
		dev := devs[want.matID]
		t.Run(want.name, func(t *testing.T) {
			if s.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Errorf("type = %s", s.Spec.Type)
			}
			if s.Spec.ClusterIP != want.ip || !slices.Equal(s.Spec.ClusterIPs, []string{want.ip}) {
				t.Errorf("clusterIP = %s, clusterIPs = %v, want %s", s.Spec.ClusterIP, s.Spec.ClusterIPs, want.ip)
			}
			wantLabels := map[string]string{
				plan.LabelManagedBy:   "mat-k8s-controller",
				plan.LabelInstance:    e.key("mat-a"),
				plan.LabelMatID:       want.matID,
				plan.LabelMachineType: want.typ,
			}
			if dev.MachineID != "" {
				wantLabels[plan.LabelMachineID] = dev.MachineID
			}
			if want.parent != "" {
				wantLabels[plan.LabelParentMatID] = want.parent
			}
			if !mapsEqual(s.Labels, wantLabels) {
				t.Errorf("labels = %v\nwant %v", s.Labels, wantLabels)
			}
			wantAnn := map[string]string{
				plan.AnnotationMatID:       want.matID,
				plan.AnnotationBMCIP:       want.ip,
				plan.AnnotationRedfishPort: "1266",
				plan.AnnotationAPIState:    dev.APIState,
				plan.AnnotationPowerState:  dev.PowerState,
			}
			if dev.HardwareType != "" {
				wantAnn[plan.AnnotationHardwareType] = dev.HardwareType
			}
			for _, p := range want.ports {
				switch p.name {
				case "ipmi":
					wantAnn[plan.AnnotationIPMIPort] = fmt.Sprint(p.target)
				case "ssh":
					wantAnn[plan.AnnotationSSHPort] = fmt.Sprint(p.target)
				}
			}
			if !mapsEqual(s.Annotations, wantAnn) {
				t.Errorf("annotations = %v\nwant %v", s.Annotations, wantAnn)
			}
			var gotPorts []string
			for _, p := range s.Spec.Ports {
				gotPorts = append(gotPorts, portString(p.Name, p.Protocol, p.Port, p.TargetPort))
			}
			var wantPorts []string
			for _, p := range want.ports {
				wantPorts = append(wantPorts, portString(p.name, p.proto, p.port, intstr.FromInt32(p.target)))
			}
			slices.Sort(gotPorts)
			slices.Sort(wantPorts)
			if !slices.Equal(gotPorts, wantPorts) {
				t.Errorf("ports = %v, want %v", gotPorts, wantPorts)
			}
			if len(s.OwnerReferences) != 0 {
				t.Errorf("owner references = %v, want none (static instance without owner)", s.OwnerReferences)
			}
		})
	}

	stats := w.Stats()
	if stats.Created != int64(len(v2MixedServices)) || stats.Updated != 0 || stats.Recreated != 0 ||
		stats.Deleted != 0 || stats.DeleteJobs != 0 {
		t.Errorf("stats = %+v, want exactly %d creates and nothing else", stats, len(v2MixedServices))
	}
	// The devices without a BMC IP (host d171a368…, DPU 923c3a06…) get no
	// Service, and that is not an error.
	for _, kind := range []string{"create", "update", "delete", "fetch", "plan", "event"} {
		if evs := e.errs.Of(errKind(kind)); len(evs) != 0 {
			t.Errorf("unexpected %s error events: %+v", kind, evs)
		}
	}
}

func portString(name string, proto corev1.Protocol, port int32, target intstr.IntOrString) string {
	return fmt.Sprintf("%s/%s/%d->%s", name, proto, port, target.String())
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func hasAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestClientReusedAcrossSyncs: one client per URL, the same object for every
// sync, and matsim sees a single TCP connection however many syncs run.
func TestClientReusedAcrossSyncs(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	url := sim.URL()
	e.startDiscovery(e.entry("mat-a", url))
	w := e.startWorker(workerOpts{})

	e.waitServices(v2MixedNames()...)
	waitSyncs(t, w, 1)
	first := w.clients.For(url)
	if len(first) != 1 {
		t.Fatalf("clients made for %s after the first sync: %d, want 1", url, len(first))
	}
	conns := sim.Connections()
	if conns != 1 {
		t.Errorf("matsim connections after the first sync = %d, want 1", conns)
	}
	reqs := sim.Requests()

	waitSyncs(t, w, 6)

	if got := w.clients.For(url); len(got) != 1 || got[0] != first[0] {
		t.Errorf("clients made for %s after 7 syncs: %d, want the first one only", url, len(got))
	}
	if c, ok := w.Cache().Peek(url); !ok || c != first[0] {
		t.Errorf("cached client for %s is %p (found %v), want the first one %p", url, c, ok, first[0])
	}
	if n := first[0].closes.Load(); n != 0 {
		t.Errorf("client closed %d times while its instance is present", n)
	}
	if got := sim.Requests(); got < reqs+6 {
		t.Errorf("matsim requests went from %d to %d over 6 syncs", reqs, got)
	}
	if got := sim.Connections(); got != conns {
		t.Errorf("matsim connections went from %d to %d: the client does not reuse its connection", conns, got)
	}
	if s := w.Cache().Stats(); s.Created != 1 || s.Closed != 0 || !slices.Equal(s.URLs, []string{url}) {
		t.Errorf("cache stats = %+v", s)
	}
}

// TestClientCacheEviction: every worker closes the client of an instance
// whose URL changed, of an instance that is gone, and of the last instances
// when all disappear; a failing Close is published to mat.errors.close.
func TestClientCacheEviction(t *testing.T) {
	e := newEnv(t)
	simA := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.80.0/24", 1)})
	simB := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.81.0/24", 2)})
	simA2 := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.80.0/24", 1)})
	urlA, urlB, urlA2 := simA.URL(), simB.URL(), simA2.URL()
	src := e.startDiscovery(e.entry("mat-a", urlA), e.entry("mat-b", urlB))
	closeErr := map[string]error{urlB: errInjectedClose}
	workers := []*testWorker{
		e.startWorker(workerOpts{Name: "worker-1", CloseErr: closeErr}),
		e.startWorker(workerOpts{Name: "worker-2", CloseErr: closeErr}),
	}
	cached := func(w *testWorker, urls ...string) func() (bool, string) {
		return func() (bool, string) {
			s := w.Cache().Stats()
			want := slices.Clone(urls)
			slices.Sort(want)
			return slices.Equal(s.URLs, want), fmt.Sprintf("%+v", s)
		}
	}
	for _, w := range workers {
		waitFor(t, "both URLs cached", cached(w, urlA, urlB))
	}
	oneClient := func(w *testWorker, url string) *recClient {
		t.Helper()
		cs := w.clients.For(url)
		if len(cs) != 1 {
			t.Fatalf("clients for %s: %d, want 1", url, len(cs))
		}
		return cs[0]
	}

	// URL change of mat-a: the old client is closed, a new one made.
	if err := src.Set([]discoveryEntry{e.entry("mat-a", urlA2), e.entry("mat-b", urlB)}); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		waitFor(t, "URL change applied", cached(w, urlA2, urlB))
		old := oneClient(w, urlA)
		waitFor(t, "old client closed", func() (bool, string) {
			return old.closes.Load() == 1, fmt.Sprintf("closes=%d", old.closes.Load())
		})
		if c, _ := w.Cache().Peek(urlA2); c != oneClient(w, urlA2) {
			t.Errorf("cached client for the new URL is not the one the factory made")
		}
	}
	// The new URL serves the same fleet: the Services stay.
	want := wantServiceNames(generatedFleet(t, "10.96.80.0/24", 1))
	want = append(want, wantServiceNames(generatedFleet(t, "10.96.81.0/24", 2))...)
	e.waitServices(want...)

	// mat-a gone: its client is closed by every worker; mat-b's stays.
	if err := src.Set([]discoveryEntry{e.entry("mat-b", urlB)}); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		waitFor(t, "gone instance evicted", cached(w, urlB))
		a2 := oneClient(w, urlA2)
		waitFor(t, "client of the gone instance closed", func() (bool, string) {
			return a2.closes.Load() == 1, fmt.Sprintf("closes=%d", a2.closes.Load())
		})
		if n := oneClient(w, urlB).closes.Load(); n != 0 {
			t.Errorf("client of the present instance closed %d times", n)
		}
	}

	// Every instance gone: the last clients are closed too; their Close
	// fails, which each worker publishes to mat.errors.close.
	if err := src.Set(nil); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		waitFor(t, "cache empty", cached(w))
		b := oneClient(w, urlB)
		waitFor(t, "last client closed", func() (bool, string) {
			return b.closes.Load() == 1, fmt.Sprintf("closes=%d", b.closes.Load())
		})
	}
	waitFor(t, "close errors published by both workers", func() (bool, string) {
		seen := map[string]bool{}
		for _, ev := range e.errs.Of(errKind("close")) {
			if ev.URL == urlB && ev.Instance == e.key("mat-b") && strings.Contains(ev.Message, errInjectedClose.Error()) {
				seen[ev.Worker] = true
			}
		}
		return seen["worker-1"] && seen["worker-2"], fmt.Sprintf("close events: %+v", e.errs.Of(errKind("close")))
	})
	for _, w := range workers {
		for _, url := range []string{urlA, urlA2, urlB} {
			if n := oneClient(w, url).closes.Load(); n != 1 {
				t.Errorf("client for %s closed %d times, want exactly 1", url, n)
			}
		}
		if s := w.Cache().Stats(); s.Created != 3 || s.Closed != 3 {
			t.Errorf("cache stats = %+v, want 3 made and 3 closed", s)
		}
	}
	// And the Services of the gone instances are deleted.
	e.waitServices()
}

type discoveryEntry = discovery.StaticEntry

// TestConcurrentDeleteFailuresForbidden: a worker whose API user may do
// everything with Services but delete them gets 403 on the delete jobs of
// three stale Services that run at once. Each failure is its own permanent
// error event on mat.errors.delete naming the missing permission, none is
// counted as deleted, and the Services stay.
func TestConcurrentDeleteFailuresForbidden(t *testing.T) {
	e := newEnv(t)
	const user = "matbus-no-delete"
	e.grant(user, "get", "list", "watch", "create", "update", "patch")
	rc := cluster.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}

	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{Rest: rc})
	before := uids(e.waitServices(v2MixedNames()...))

	// The host 922f3d9b… goes with its two DPUs: three delete jobs at once.
	if err := sim.RemoveDevice("922f3d9b-20be-461f-9b69-90928701ce93"); err != nil {
		t.Fatal(err)
	}
	stale := []string{
		e.ns + "/mat-bmc-host-922f3d9b-20b-4da64654",
		e.ns + "/mat-bmc-dpu-2458e540-24e-879b716a",
		e.ns + "/mat-bmc-dpu-a15919aa-572-726d4120",
	}
	slices.Sort(stale)
	deleteEvents := func() []string {
		var out []string
		for _, ev := range e.errs.Of(errKind("delete")) {
			out = append(out, ev.Service)
		}
		slices.Sort(out)
		return out
	}
	waitFor(t, "one delete error event per stale Service", func() (bool, string) {
		got := deleteEvents()
		return slices.Equal(got, stale), fmt.Sprintf("delete events for %v", got)
	})
	for _, ev := range e.errs.Of(errKind("delete")) {
		if !ev.Permanent {
			t.Errorf("%s: event not permanent: %+v", ev.Service, ev)
		}
		if ev.Instance != e.key("mat-a") {
			t.Errorf("%s: instance = %q", ev.Service, ev.Instance)
		}
		if !hasAll(ev.Message, "forbidden", user, `cannot delete resource "services"`) {
			t.Errorf("%s: message does not name the missing permission: %s", ev.Service, ev.Message)
		}
	}

	// Later syncs see the same stale Services: their delete jobs are not
	// redone within the duplicate window, so no more events.
	waitSyncs(t, w, 4)
	if got := deleteEvents(); !slices.Equal(got, stale) {
		t.Errorf("delete events after more syncs: %v, want exactly %v", got, stale)
	}
	s := w.Stats()
	if s.Deleted != 0 {
		t.Errorf("Stats().Deleted = %d, want 0", s.Deleted)
	}
	if s.DeleteJobs < 3 {
		t.Errorf("Stats().DeleteJobs = %d, want >= 3", s.DeleteJobs)
	}
	if s.Failed < 3 {
		t.Errorf("Stats().Failed = %d, want >= 3", s.Failed)
	}
	if after := uids(e.services()); !mapsEqual(after, before) {
		t.Errorf("Services changed although every delete was refused:\nbefore %v\nafter  %v", before, after)
	}
}
