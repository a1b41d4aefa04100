package worker_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
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
// in the fixtures README), switches and power shelves under "host", and the
// NVOS Service of the switch that reports an nvos_ip.
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
	{"mat-nvos-1a530254-57f-964ececc", "1a530254-57f0-4a8d-adb9-7d5520153f50", "nvos", "10.98.0.20", "",
		[]wantPort{{"nmxc", "TCP", 9370, 1266}}},
}

func v2MixedNames() []string {
	var out []string
	for _, w := range v2MixedServices {
		out = append(out, w.name)
	}
	return out
}

// TestFullSyncFromFixture: a full sync of v2-mixed.json creates exactly one
// Service per BMC with an IP and one NVOS Service per switch with an NVOS
// IP, with the old controller's names, our labels and annotations (no state
// annotations by default), the ports MAT advertises and the BMC (NVOS) IP
// as clusterIP.
func TestFullSyncFromFixture(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})

	e.waitServices(v2MixedNames()...)
	waitSyncs(t, w, 2) // further syncs change nothing
	got := e.waitServices(v2MixedNames()...)

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
				plan.LabelMachineType: plan.MachineType(want.typ).ContractType(),
				plan.LabelDeviceKind:  want.typ,
			}
			if dev.MachineID != "" {
				wantLabels[plan.LabelMachineID] = dev.MachineID
			}
			if want.parent != "" {
				wantLabels[plan.LabelParentID] = want.parent
			}
			if !mapsEqual(s.Labels, wantLabels) {
				t.Errorf("labels = %v\nwant %v", s.Labels, wantLabels)
			}
			wantAnn := map[string]string{
				plan.AnnotationMatID:       want.matID,
				plan.AnnotationBMCIP:       want.ip,
				plan.AnnotationRedfishPort: "1266",
			}
			if want.typ == "nvos" {
				wantAnn = map[string]string{plan.AnnotationMatID: want.matID, plan.AnnotationNVOSIP: want.ip}
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
	// … and logs at warn level.
	closeLogged := false
	for _, line := range strings.Split(e.logs.Tail(1<<20), "\n") {
		closeLogged = closeLogged || hasAll(line, "level=WARN", "kind=close", urlB, errInjectedClose.Error())
	}
	if !closeLogged {
		t.Errorf("the failed Close was not logged at warn level")
	}
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

// TestFetchFailureDeletesNothing: when the status fetch fails (HTTP 500, a
// hanging server, a malformed body), the instance's Services from the last
// good sync stay untouched and the failure is published to mat.errors.fetch.
func TestFetchFailureDeletesNothing(t *testing.T) {
	for _, tc := range []struct {
		fault     matsim.FaultMode
		permanent bool
	}{
		{matsim.Fault500, false},
		{matsim.FaultHang, false},
		{matsim.FaultMalformed, true},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			e := newEnv(t)
			sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
			e.startDiscovery(e.entry("mat-a", sim.URL()))
			w := e.startWorker(workerOpts{ClientTimeout: 500 * time.Millisecond})
			before := uids(e.waitServices(v2MixedNames()...))
			waitSyncs(t, w, 1)

			sim.SetFault(tc.fault)
			waitFor(t, "a fetch error event", func() (bool, string) {
				return len(e.errs.Of(errKind("fetch"))) > 0, "none yet"
			})
			ev := e.errs.Of(errKind("fetch"))[0]
			if ev.Instance != e.key("mat-a") || ev.URL != sim.URL() || ev.Permanent != tc.permanent {
				t.Errorf("fetch event = %+v, want instance %s, url %s, permanent %v", ev, e.key("mat-a"), sim.URL(), tc.permanent)
			}
			if !strings.Contains(ev.Message, "no Service changed") {
				t.Errorf("fetch event message: %s", ev.Message)
			}
			// More failing syncs: still nothing deleted or changed.
			reqs := sim.Requests()
			waitFor(t, "more failing fetches", func() (bool, string) {
				return sim.Requests() >= reqs+3, fmt.Sprintf("requests %d", sim.Requests())
			})
			waitSyncs(t, w, 1)
			if after := uids(e.services()); !mapsEqual(after, before) {
				t.Errorf("Services changed during fetch failures:\nbefore %v\nafter  %v", before, after)
			}
			if s := w.Stats(); s.DeleteJobs != 0 || s.Deleted != 0 || s.Created != int64(len(before)) ||
				s.Updated != 0 || s.Recreated != 0 {
				t.Errorf("stats = %+v, want only the first sync's creates", s)
			}

			// Healthy again: syncs succeed and still change nothing.
			sim.SetFault(matsim.FaultNone)
			waitSyncs(t, w, 3)
			if after := uids(e.services()); !mapsEqual(after, before) {
				t.Errorf("Services changed after recovery")
			}
		})
	}
}

// TestBMCIPChangeRecreates: a new BMC IP means a new Service (spec.clusterIP
// is immutable): same name, new UID, the new IP; the others stay.
func TestBMCIPChangeRecreates(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	before := e.waitServices(v2MixedNames()...)

	const name = "mat-bmc-host-7ec7b7c3-126-c030b365"
	if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", "10.96.64.50"); err != nil {
		t.Fatal(err)
	}
	var s *corev1.Service
	waitFor(t, name+" on 10.96.64.50", func() (bool, string) {
		s = e.service(name)
		if s == nil {
			return false, "missing"
		}
		return s.Spec.ClusterIP == "10.96.64.50", "clusterIP " + s.Spec.ClusterIP
	})
	if s.UID == before[name].UID {
		t.Errorf("UID unchanged (%s): the Service was not re-created", s.UID)
	}
	if got := s.Annotations[plan.AnnotationBMCIP]; got != "10.96.64.50" {
		t.Errorf("bmc-ip annotation = %q", got)
	}
	waitSyncs(t, w, 2)
	after := e.waitServices(v2MixedNames()...)
	for n, old := range before {
		if n != name && after[n].UID != old.UID {
			t.Errorf("%s was touched (UID %s -> %s)", n, old.UID, after[n].UID)
		}
	}
	if st := w.Stats(); st.Recreated != 1 || st.Deleted != 0 || st.Created != int64(len(before)) {
		t.Errorf("stats = %+v, want one recreate", st)
	}
	if evs := e.errs.Of(errKind("create")); len(evs) != 0 {
		t.Errorf("create errors: %+v", evs)
	}
}

// TestClusterIPAlreadyAllocated: a BMC IP held by a foreign Service cannot
// be the clusterIP of ours. That yields an error event naming the IP, a
// bounded number of events while the conflict lasts (no crash, no storm),
// the foreign Service is not touched, and once it is gone ours is created.
func TestClusterIPAlreadyAllocated(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	before := e.waitServices(v2MixedNames()...)

	foreign, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Labels: map[string]string{"team": "other"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.64.60",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	const name = "mat-bmc-host-7ec7b7c3-126-c030b365"
	service := e.ns + "/" + name
	if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", "10.96.64.60"); err != nil {
		t.Fatal(err)
	}
	forService := func() []events.Error {
		var out []events.Error
		for _, k := range events.ErrorKinds {
			for _, ev := range e.errs.Of(k) {
				if ev.Service == service || ev.Instance == e.key("mat-a") {
					out = append(out, ev)
				}
			}
		}
		return out
	}
	waitFor(t, "an error event for the allocated IP", func() (bool, string) {
		for _, ev := range e.errs.Of(errKind("create")) {
			if ev.Service == service && ev.Permanent && hasAll(ev.Message, "10.96.64.60", "allocated") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %+v", forService())
	})
	// While the conflict lasts, syncs keep coming (each fetches the status):
	// the events stay few.
	reqs, posts := sim.Requests(), w.api.Count("POST services")
	waitFor(t, "more syncs during the conflict", func() (bool, string) {
		return sim.Requests() >= reqs+8, fmt.Sprintf("requests %d", sim.Requests())
	})
	fetches, creates := sim.Requests()-reqs, w.api.Count("POST services")-posts
	// Each sync job tries the create a few times (allocAttempts = 3), then
	// leaves it to the next sync; one job may have been running already.
	if creates > 3*(int(fetches)+1) {
		t.Errorf("retry storm: %d creates during %d sync jobs", creates, fetches)
	}
	if evs := forService(); len(evs) > 3 {
		t.Errorf("%d error events during the conflict, want at most 3: %+v", len(evs), evs)
	}
	if !w.Ready() {
		t.Errorf("worker not ready during the conflict")
	}
	if got := e.service("someone-elses"); got == nil || got.UID != foreign.UID || len(got.Labels) != 1 {
		t.Fatalf("foreign Service touched: %+v", got)
	}
	for n, old := range before {
		if s := e.service(n); n != name && (s == nil || s.UID != old.UID) {
			t.Errorf("%s was touched", n)
		}
	}

	// The holder goes: our Service gets the IP.
	if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx, "someone-elses", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, name+" on 10.96.64.60", func() (bool, string) {
		s := e.service(name)
		if s == nil {
			return false, "missing"
		}
		return s.Spec.ClusterIP == "10.96.64.60", "clusterIP " + s.Spec.ClusterIP
	})
}

// TestForeignMetadataSurvivesUpdate: labels and annotations someone else put
// on our Service are kept when a status change updates it in place.
func TestForeignMetadataSurvivesUpdate(t *testing.T) {
	e := newEnv(t)
	fleet := fixtureFleet(t, fixtureV2Mixed)
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{Tweak: func(c *worker.Config) { c.Plan.StateAnnotations = true }})
	e.waitServices(v2MixedNames()...)

	const name = "mat-bmc-host-922f3d9b-20b-4da64654"
	svc := e.service(name)
	svc.Labels["team.example.com/owner"] = "infra"
	svc.Annotations["example.com/note"] = "do not remove"
	svc, err := e.kube.CoreV1().Services(e.ns).Update(e.ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := svc.UID

	// MAT reports a new API and power state for the host: an in-place update.
	next := fleet.Clone()
	next.Machines[0].APIState = "Assigned/Ready"
	next.Machines[0].PowerState = "Off"
	if err := sim.SetFleet(next); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the update", func() (bool, string) {
		svc = e.service(name)
		return svc.Annotations[plan.AnnotationAPIState] == "Assigned/Ready" &&
			svc.Annotations[plan.AnnotationPowerState] == "Off", fmt.Sprintf("annotations %v", svc.Annotations)
	})
	if svc.UID != uid {
		t.Errorf("Service re-created (UID %s -> %s), want an update", uid, svc.UID)
	}
	if got := svc.Labels["team.example.com/owner"]; got != "infra" {
		t.Errorf("foreign label lost: labels %v", svc.Labels)
	}
	if got := svc.Annotations["example.com/note"]; got != "do not remove" {
		t.Errorf("foreign annotation lost: annotations %v", svc.Annotations)
	}
	if got := svc.Labels[plan.LabelInstance]; got != e.key("mat-a") {
		t.Errorf("our instance label = %q", got)
	}
	// Converged: later syncs leave it alone (foreign keys are not a diff).
	waitSyncs(t, w, 3)
	if s := w.Stats(); s.Updated != 1 || s.Recreated != 0 || s.DeleteJobs != 0 {
		t.Errorf("stats = %+v, want exactly one update", s)
	}
	if got := e.service(name); got.ResourceVersion != svc.ResourceVersion {
		t.Errorf("Service written again after converging (resourceVersion %s -> %s)", svc.ResourceVersion, got.ResourceVersion)
	}
}

// TestRemovedDeviceDeleted: a device gone from the status has its Service
// deleted through a delete job; the other Services are untouched.
func TestRemovedDeviceDeleted(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	before := e.waitServices(v2MixedNames()...)

	const gone = "mat-bmc-host-d5bb3746-fdf-4f4ad08b"
	if err := sim.RemoveDevice("d5bb3746-fdf8-424d-ba9d-3d7d407756a9"); err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(v2MixedNames(), func(n string) bool { return n == gone })
	after := e.waitServices(want...)
	for _, n := range want {
		if after[n].UID != before[n].UID || after[n].ResourceVersion != before[n].ResourceVersion {
			t.Errorf("%s was touched", n)
		}
	}
	waitSyncs(t, w, 2)
	if s := w.Stats(); s.DeleteJobs < 1 || s.Deleted != 1 || s.Created != int64(len(before)) || s.Updated != 0 {
		t.Errorf("stats = %+v, want one delete job that deleted one Service", s)
	}
	if evs := e.errs.Of(errKind("delete")); len(evs) != 0 {
		t.Errorf("delete errors: %+v", evs)
	}
}

// TestAdoptOldControllerServices: the Services the polling controller left
// (same names, managed-by mat-k8s-controller, no instance label) are
// adopted by the first sync: updated in place with the instance label,
// nothing created, deleted or re-created. An old Service no device asks for
// is left alone: without an instance label it is not known to be ours to delete.
func TestAdoptOldControllerServices(t *testing.T) {
	e := newEnv(t)
	body, err := os.ReadFile(fixtureV2Mixed)
	if err != nil {
		t.Fatal(err)
	}
	st, err := matclient.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	opts := plan.Options{Namespace: e.ns, IPMode: plan.IPModeClusterIP}
	desired := plan.Build(plan.Instance{Key: e.key("mat-a")}, st, opts)
	old := append([]*corev1.Service(nil), desired.Services...)
	orphan := desired.Services[0].DeepCopy()
	orphan.Name = "mat-bmc-host-0ld-c0ntr0ller"
	orphan.Spec.ClusterIP, orphan.Spec.ClusterIPs = "10.96.64.99", []string{"10.96.64.99"}
	old = append(old, orphan)
	before := map[string]string{}
	for _, s := range old {
		s = s.DeepCopy()
		delete(s.Labels, plan.LabelInstance)
		got, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create old Service %s: %v", s.Name, err)
		}
		before[got.Name] = string(got.UID)
	}

	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	waitFor(t, "every Service adopted", func() (bool, string) {
		n := 0
		for _, s := range e.services() {
			if s.Labels[plan.LabelInstance] == e.key("mat-a") {
				n++
			}
		}
		return n == len(v2MixedServices), fmt.Sprintf("%d adopted", n)
	})
	waitSyncs(t, w, 2)
	after := e.services()
	if got := uids(after); !mapsEqual(got, before) {
		t.Errorf("UIDs changed:\nbefore %v\nafter  %v", before, got)
	}
	if _, ok := after[orphan.Name].Labels[plan.LabelInstance]; ok {
		t.Errorf("the old Service no device asks for was given an instance label")
	}
	s := w.Stats()
	if s.Created != 0 || s.Recreated != 0 || s.Deleted != 0 || s.DeleteJobs != 0 {
		t.Errorf("stats = %+v, want no create, recreate or delete", s)
	}
	if s.Updated != int64(len(v2MixedServices)) {
		t.Errorf("Stats().Updated = %d, want %d (one per adopted Service)", s.Updated, len(v2MixedServices))
	}
}

// TestGoneInstanceCleanedUp: an instance removed from discovery has its
// Services deleted through one clean-up job and one delete job per Service,
// each done once by one of two workers; the other instance's Services are
// untouched.
func TestGoneInstanceCleanedUp(t *testing.T) {
	e := newEnv(t)
	fleetA := generatedFleet(t, "10.96.90.0/24", 7)
	fleetB := generatedFleet(t, "10.96.91.0/24", 8)
	simA := e.startSim(matsim.Options{Fleet: fleetA})
	simB := e.startSim(matsim.Options{Fleet: fleetB})
	src := e.startDiscovery(e.entry("mat-a", simA.URL()), e.entry("mat-b", simB.URL()))
	state := func(c *worker.Config) { c.Plan.StateAnnotations = true }
	workers := []*testWorker{e.startWorker(workerOpts{Name: "worker-1", Tweak: state}), e.startWorker(workerOpts{Name: "worker-2", Tweak: state})}
	namesA, namesB := wantServiceNames(fleetA), wantServiceNames(fleetB)
	before := e.waitServices(append(slices.Clone(namesA), namesB...)...)

	if err := src.Set([]discoveryEntry{e.entry("mat-b", simB.URL())}); err != nil {
		t.Fatal(err)
	}
	after := e.waitServices(namesB...)
	for _, n := range namesB {
		if after[n].UID != before[n].UID || after[n].ResourceVersion != before[n].ResourceVersion {
			t.Errorf("%s of the present instance was touched", n)
		}
	}
	var total struct{ cleanups, deleted int64 }
	waitFor(t, "the clean-up counted", func() (bool, string) {
		total.cleanups, total.deleted = 0, 0
		for _, w := range workers {
			s := w.Stats()
			total.cleanups += s.Cleanups
			total.deleted += s.Deleted
		}
		return total.cleanups >= 1 && total.deleted >= int64(len(namesA)), fmt.Sprintf("%+v", total)
	})
	for _, w := range workers {
		waitSyncs(t, w, 2)
	}
	total.cleanups, total.deleted = 0, 0
	for _, w := range workers {
		s := w.Stats()
		total.cleanups += s.Cleanups
		total.deleted += s.Deleted
	}
	if total.cleanups != 1 || total.deleted != int64(len(namesA)) {
		t.Errorf("clean-ups %d, deletes %d; want 1 clean-up and %d deletes over both workers",
			total.cleanups, total.deleted, len(namesA))
	}
	for _, kind := range []string{"delete", "create", "update"} {
		if evs := e.errs.Of(errKind(kind)); len(evs) != 0 {
			t.Errorf("%s errors: %+v", kind, evs)
		}
	}
}

// TestGarbageJobs: a job that is not JSON, or an envelope of an unknown
// schema version, is rejected to mat.errors.event and terminated (not
// redelivered), and the worker keeps working.
func TestGarbageJobs(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	e.waitServices(v2MixedNames()...)

	s := e.bus.Subjects()
	future := fmt.Sprintf(`{"schema":99,"type":"io.matbus.job.sync","id":"future-1","time":%q,"source":"test","data":{"key":%q,"reason":"tick"}}`,
		time.Now().UTC().Format(time.RFC3339Nano), e.key("mat-a"))
	garbage := map[string]string{
		s.Sync(e.key("garbage")):   "not json",
		s.Sync(e.key("mat-a")):     future,
		s.Delete(e.key("garbage")): "not json",
		s.Cleanup(e.key("mat-a")):  `{"schema":1,"type":"io.matbus.job.cleanup","id":"c1","time":"2026-01-01T00:00:00Z","source":"test","data":{"key":"no dot"}}`,
		// Not a job: every worker reads the instances stream.
		s.Instance(e.key("bogus")): "not json",
	}
	for subj, body := range garbage {
		if _, err := e.js.Publish(e.ctx, subj, []byte(body)); err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
	}
	waitFor(t, "an event error per garbage message", func() (bool, string) {
		seen := map[string]bool{}
		for _, ev := range e.errs.Of(errKind("event")) {
			if _, ok := garbage[ev.Subject]; ok && ev.Permanent {
				seen[ev.Subject] = true
			}
		}
		return len(seen) == len(garbage), fmt.Sprintf("event errors: %+v", e.errs.Of(errKind("event")))
	})
	for _, ev := range e.errs.Of(errKind("event")) {
		if ev.Subject == s.Sync(e.key("mat-a")) && !strings.Contains(ev.Message, "schema") {
			t.Errorf("schema 99 rejected without saying so: %s", ev.Message)
		}
	}
	// Terminated: nothing of them is left in the work queues.
	waitFor(t, "garbage gone from the work queues", func() (bool, string) {
		var left []string
		for _, stream := range []string{e.bus.StreamName(events.StreamSync), e.bus.StreamName(events.StreamDelete)} {
			str, err := e.js.Stream(e.ctx, stream)
			if err != nil {
				return false, err.Error()
			}
			for subj := range garbage {
				if _, err := str.GetLastMsgForSubject(e.ctx, subj); err == nil && subj != s.Sync(e.key("mat-a")) {
					left = append(left, subj)
				}
			}
		}
		return len(left) == 0, fmt.Sprintf("left: %v", left)
	})

	// Still working: a removed device's Service is deleted.
	if err := sim.RemoveDevice("624423f1-04b4-404c-8d55-d1cb82fa8ae4"); err != nil {
		t.Fatal(err)
	}
	e.waitServices(slices.DeleteFunc(v2MixedNames(), func(n string) bool { return n == "mat-bmc-host-624423f1-04b-216d49b5" })...)
	waitSyncs(t, w, 2)
	if s := w.Stats(); s.Deleted != 1 {
		t.Errorf("stats = %+v", s)
	}
	if n := len(e.errs.Bad()); n != 0 {
		t.Errorf("%d invalid messages on error subjects", n)
	}
}

// TestBMCIPOutsideServiceRange: a new BMC IP outside the service range
// cannot be a clusterIP. That is a permanent error event; the Service keeps
// serving the previous IP and is not deleted and re-created on every sync.
func TestBMCIPOutsideServiceRange(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	e.waitServices(v2MixedNames()...)

	const name = "mat-bmc-host-7ec7b7c3-126-c030b365"
	if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", "192.0.2.21"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a permanent create error naming the range", func() (bool, string) {
		for _, ev := range e.errs.Of(errKind("create")) {
			if ev.Service == e.ns+"/"+name && ev.Permanent && hasAll(ev.Message, "192.0.2.21", "outside the service range") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("create events: %+v", e.errs.Of(errKind("create")))
	})
	first := e.service(name)
	if first == nil || first.Spec.ClusterIP != "10.96.64.13" {
		t.Fatalf("Service after the refused IP change: %+v", first)
	}
	waitSyncs(t, w, 4)
	last := e.service(name)
	if last == nil || last.UID != first.UID || last.Spec.ClusterIP != "10.96.64.13" {
		t.Errorf("Service churned while the new IP is refused: UID %s -> %v", first.UID, last)
	}
	if evs := e.errs.Of(errKind("create")); len(evs) > 2 {
		t.Errorf("%d create error events, want a bounded few: %+v", len(evs), evs)
	}
}

// TestTwoWorkersConverge: two workers handle sync jobs of the same instance
// at once while the status changes in several ways (two new BMC IPs, two
// devices swapping their IPs, a device gone, a state change). They must end
// in exactly the desired Services and stay there.
func TestTwoWorkersConverge(t *testing.T) {
	e := newEnv(t)
	fleet := fixtureFleet(t, fixtureV2Mixed)
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	state := func(c *worker.Config) { c.Plan.StateAnnotations = true }
	workers := []*testWorker{e.startWorker(workerOpts{Name: "worker-1", Tweak: state}), e.startWorker(workerOpts{Name: "worker-2", Tweak: state})}
	e.waitServices(v2MixedNames()...)

	next := fleet.Clone()
	host := &next.Machines[0] // 922f3d9b…, DPUs 2458e540… and a15919aa…
	host.BMC.IP = "10.96.64.51"
	host.DPUs[0].BMC.IP = "10.96.64.52"
	next.Machines[1].DPUs[0].BMC.IP = "10.96.64.30"    // 9b8d41e8… takes the switch's IP …
	next.Machines[3].BMC.IP = "10.96.64.14"            // … and switch 1a530254… takes the DPU's
	next.Machines[5].APIState = "Maintenance(test)"    // power shelf 624423f1…
	next.Machines = slices.Delete(next.Machines, 4, 5) // switch d5bb3746… gone
	if err := sim.SetFleet(next); err != nil {
		t.Fatal(err)
	}
	// Extra sync jobs right away, so that both workers sync at once.
	for i := range 2 {
		if err := e.bus.Publish(e.ctx, e.bus.Subjects().Sync(e.key("mat-a")), events.TypeSyncJob,
			fmt.Sprintf("race-%d", i), events.SyncJob{Key: e.key("mat-a"), Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}

	want := map[string]string{} // name -> clusterIP
	next.Status("", 1).Walk(func(d, _ *matclient.Device) {
		if d.BMC.IP != "" {
			want[plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)] = d.BMC.IP
		}
		if d.Kind == matclient.KindSwitch && d.NvosIP != "" {
			want[plan.NVOSServiceName(d.MatID)] = d.NvosIP
		}
	})
	current := func() (map[string]string, map[string]*corev1.Service) {
		svcs := e.services()
		got := map[string]string{}
		for n, s := range svcs {
			got[n] = s.Spec.ClusterIP
		}
		return got, svcs
	}
	var settled map[string]*corev1.Service
	waitFor(t, "the desired Services", func() (bool, string) {
		got, svcs := current()
		settled = svcs
		shelf, ok := svcs["mat-bmc-host-624423f1-04b-216d49b5"]
		done := mapsEqual(got, want) && ok && shelf.Annotations[plan.AnnotationAPIState] == "Maintenance(test)"
		return done, fmt.Sprintf("have %v\nwant %v", got, want)
	})
	for _, w := range workers {
		waitSyncs(t, w, 3)
	}
	_, final := current()
	for n, s := range final {
		if s.ResourceVersion != settled[n].ResourceVersion {
			t.Errorf("%s still changing after convergence", n)
		}
	}
	for _, kind := range []string{"create", "update", "delete"} {
		for _, ev := range e.errs.Of(errKind(kind)) {
			t.Logf("%s event while converging: %+v", kind, ev)
		}
	}
}

// TestDuplicateBMCIPAcrossInstances: two MAT instances report the same BMC
// IP. The Service made first keeps it; the other device gets no Service and
// a permanent create event, and nothing flaps: the first Service is never
// deleted or re-created, and the events stay few.
func TestDuplicateBMCIPAcrossInstances(t *testing.T) {
	e := newEnv(t)
	fleetA, fleetB, shared := sharedIPFleets(t, "10.96.92.0/24", "10.96.93.0/24", 3)
	simA := e.startSim(matsim.Options{Fleet: fleetA})
	simB := e.startSim(matsim.Options{Fleet: fleetB})
	src := e.startDiscovery(e.entry("mat-a", simA.URL()))
	w := e.startWorker(workerOpts{})
	namesA, namesB := wantServiceNames(fleetA), wantServiceNames(fleetB)
	before := e.waitServices(namesA...)

	if err := src.Set([]discoveryEntry{e.entry("mat-a", simA.URL()), e.entry("mat-b", simB.URL())}); err != nil {
		t.Fatal(err)
	}
	loser := plan.ServiceName(plan.MachineTypeHost, fleetB.Machines[0].MatID)
	e.waitAllocationRefused(loser, shared)
	wantNames := append(slices.Clone(namesA), slices.DeleteFunc(slices.Clone(namesB), func(n string) bool { return n == loser })...)
	e.waitServices(wantNames...)
	reqs := simB.Requests()
	waitFor(t, "more syncs of mat-b", func() (bool, string) {
		return simB.Requests() >= reqs+4, fmt.Sprintf("requests %d", simB.Requests())
	})
	after := e.waitServices(wantNames...)
	for _, n := range namesA {
		if after[n].UID != before[n].UID || after[n].ResourceVersion != before[n].ResourceVersion {
			t.Errorf("%s of the first instance was touched", n)
		}
	}
	if evs := e.errs.Of(errKind("create")); len(evs) > 3 {
		t.Errorf("%d create events, want a bounded few: %+v", len(evs), evs)
	}
	if s := w.Stats(); s.Deleted != 0 || s.Recreated != 0 {
		t.Errorf("stats = %+v, want no delete or recreate", s)
	}
}

// TestShutdownDuringHangingFetch: a worker stopped while its status fetch
// hangs returns from Run after its shutdown grace, closes its clients,
// reports nothing for the abandoned job, and leaves no goroutine behind
// (checked at cleanup). Another worker then gets the job.
func TestShutdownDuringHangingFetch(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w1 := e.startWorker(workerOpts{Name: "worker-1", ClientTimeout: 5 * time.Minute,
		Tweak: func(c *worker.Config) { c.ShutdownGrace = time.Second; c.RetryMaxElapsed = 5 * time.Minute }})
	e.waitServices(v2MixedNames()...)

	sim.SetFault(matsim.FaultHang)
	reqs := sim.Requests()
	waitFor(t, "a hanging fetch", func() (bool, string) {
		return sim.Requests() > reqs, fmt.Sprintf("requests %d", sim.Requests())
	})
	w1.Stop()
	if w1.Ready() {
		t.Errorf("stopped worker still ready")
	}
	for _, c := range w1.clients.For(sim.URL()) {
		if c.closes.Load() != 1 {
			t.Errorf("client closed %d times at shutdown, want 1", c.closes.Load())
		}
	}
	if evs := e.errs.Of(errKind("fetch")); len(evs) != 0 {
		t.Errorf("fetch events for a job abandoned at shutdown: %+v", evs)
	}

	sim.SetFault(matsim.FaultNone)
	w2 := e.startWorker(workerOpts{Name: "worker-2"})
	waitSyncs(t, w2, 2)
	e.waitServices(v2MixedNames()...)
}

// TestOwnerReference: Services of an instance with a MAT Deployment carry an
// owner reference to it, so Kubernetes garbage-collects them with it (no
// controller-manager runs here, so only the reference is checked).
func TestOwnerReference(t *testing.T) {
	e := newEnv(t)
	labels := map[string]string{"app": "mat"}
	dep, err := e.kube.AppsV1().Deployments(e.ns).Create(e.ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "mat"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "mat", Image: "example.invalid/mat"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	entry := e.entry("mat-bmc-mock", sim.URL())
	entry.Owner = "mat"
	e.startDiscovery(entry)
	e.startWorker(workerOpts{})
	for n, s := range e.waitServices(v2MixedNames()...) {
		refs := s.OwnerReferences
		if len(refs) != 1 || refs[0].Kind != "Deployment" || refs[0].APIVersion != "apps/v1" ||
			refs[0].Name != "mat" || refs[0].UID != dep.UID {
			t.Errorf("%s: owner references %+v, want the Deployment mat (%s)", n, refs, dep.UID)
		}
	}
}

// TestSharedURLOneClient: two instances with the same URL share one client,
// which is closed only when the last of them is gone.
func TestSharedURLOneClient(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	url := sim.URL()
	src := e.startDiscovery(e.entry("mat-a", url), e.entry("mat-b", url))
	w := e.startWorker(workerOpts{})
	waitSyncs(t, w, 2)
	cs := w.clients.For(url)
	if len(cs) != 1 {
		t.Fatalf("%d clients for one URL, want 1", len(cs))
	}
	if err := src.Set([]discoveryEntry{e.entry("mat-b", url)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the clean-up of mat-a", func() (bool, string) { return w.Stats().Cleanups == 1, fmt.Sprintf("%+v", w.Stats()) })
	waitSyncs(t, w, 2)
	if n := cs[0].closes.Load(); n != 0 {
		t.Errorf("shared client closed %d times while mat-b still uses it", n)
	}
	if err := src.Set(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shared client closed", func() (bool, string) {
		return cs[0].closes.Load() == 1, fmt.Sprintf("closes %d", cs[0].closes.Load())
	})
	if n := len(w.clients.For(url)); n != 1 {
		t.Errorf("%d clients made for one URL, want 1", n)
	}
}

// TestLateWorker: a worker that starts after discovery has published (and
// after one instance is already gone again) learns the current instances
// from the instances stream: it syncs the present one and makes no client
// for the gone one.
func TestLateWorker(t *testing.T) {
	e := newEnv(t)
	simA := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	simB := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.94.0/24", 5)})
	src := e.startDiscovery(e.entry("mat-a", simA.URL()), e.entry("mat-b", simB.URL()))
	present := func(key string) func() (bool, string) {
		return func() (bool, string) {
			rec, found, err := e.bus.LastInstance(e.ctx, key)
			return err == nil && found && rec.Present(), fmt.Sprintf("found %v, err %v", found, err)
		}
	}
	waitFor(t, "mat-b announced", present(e.key("mat-b")))
	if err := src.Set([]discoveryEntry{e.entry("mat-a", simA.URL())}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "mat-b gone", func() (bool, string) {
		ok, state := present(e.key("mat-b"))()
		return !ok, state
	})

	w := e.startWorker(workerOpts{})
	e.waitServices(v2MixedNames()...)
	waitSyncs(t, w, 2)
	if n := len(w.clients.For(simB.URL())); n != 0 {
		t.Errorf("%d clients made for the gone instance", n)
	}
	if s := w.Cache().Stats(); !slices.Equal(s.URLs, []string{simA.URL()}) {
		t.Errorf("cached URLs %v, want only mat-a's", s.URLs)
	}
	if simB.Requests() != 0 {
		t.Errorf("the gone instance was fetched %d times", simB.Requests())
	}
}

// TestDeleteJobSafety: a delete job never removes a Service re-created
// since the job was made (UID precondition), a Service someone else
// manages, or a Service of another instance; a job for a Service that is
// already gone is done without an error event.
func TestDeleteJobSafety(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	before := e.waitServices(v2MixedNames()...)
	foreign, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "mat-bmc-host-foreign", Labels: map[string]string{
			plan.LabelManagedBy: "someone-else", plan.LabelInstance: e.key("mat-a")}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	host := before["mat-bmc-host-922f3d9b-20b-4da64654"]
	jobs := []events.DeleteJob{
		// Made for an earlier Service of the same name.
		{Key: e.key("mat-a"), Namespace: e.ns, Name: host.Name, UID: "0b5e1e7e-0000-4000-8000-000000000000", Reason: "stale"},
		// Someone else's Service.
		{Key: e.key("mat-a"), Namespace: e.ns, Name: foreign.Name, UID: string(foreign.UID), Reason: "stale"},
		// Ours, but the job names another instance.
		{Key: e.key("mat-z"), Namespace: e.ns, Name: host.Name, UID: string(host.UID), Reason: "stale"},
		// Already gone.
		{Key: e.key("mat-a"), Namespace: e.ns, Name: "mat-bmc-host-not-there", UID: "0b5e1e7e-0000-4000-8000-000000000001", Reason: "stale"},
	}
	for i, j := range jobs {
		if err := e.bus.Publish(e.ctx, e.bus.Subjects().Delete(j.Key), events.TypeDeleteJob, fmt.Sprintf("test-del-%d", i), j); err != nil {
			t.Fatal(err)
		}
	}
	e.drainDeletes()
	waitSyncs(t, w, 1)
	after := e.services()
	for n, s := range before {
		if after[n] == nil || after[n].UID != s.UID {
			t.Errorf("%s deleted or replaced by a delete job that did not match it", n)
		}
	}
	if after[foreign.Name] == nil {
		t.Errorf("someone else's Service was deleted")
	}
	if s := w.Stats(); s.Deleted != 0 {
		t.Errorf("Stats().Deleted = %d, want 0", s.Deleted)
	}
	if evs := e.errs.Of(errKind("delete")); len(evs) != 0 {
		t.Errorf("delete error events: %+v", evs)
	}
}

// TestClientClosedDuringFetch: an instance that goes away while its status
// fetch hangs has its MAT client closed under that fetch. That ends the
// sync as skipped: no fetch error event and no failed job (MAT did not
// fail), and the clean-up deletes its Services.
func TestClientClosedDuringFetch(t *testing.T) {
	e := newEnv(t)
	fleet := generatedFleet(t, "10.96.92.0/24", 4)
	sim := e.startSim(matsim.Options{Fleet: fleet})
	src := e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{ClientTimeout: time.Minute})
	e.waitServices(wantServiceNames(fleet)...)
	waitSyncs(t, w, 1)

	sim.SetFault(matsim.FaultHang)
	reqs := sim.Requests()
	waitFor(t, "a fetch hanging on MAT", func() (bool, string) {
		return sim.Requests() > reqs, fmt.Sprintf("requests %d", sim.Requests())
	})
	before := w.Stats()
	if err := src.Set(nil); err != nil {
		t.Fatal(err)
	}
	e.waitServices()
	waitFor(t, "the hanging sync ended", func() (bool, string) {
		s := w.Stats()
		return s.Syncs > before.Syncs, fmt.Sprintf("syncs %d", s.Syncs)
	})
	if evs := e.errs.Of(errKind("fetch")); len(evs) != 0 {
		t.Errorf("fetch error events for a client closed by the instance's removal: %+v", evs)
	}
	if s := w.Stats(); s.Failed != before.Failed {
		t.Errorf("failed jobs %d → %d; a closed client is not a failure", before.Failed, s.Failed)
	}
}
