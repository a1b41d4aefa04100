package worker_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// The ServiceCIDR mode (docs/adr/0033-servicecidr-mode.md): with a
// ServiceCIDR object that covers the BMC and NVOS networks, cluster-ip mode
// works for IPs outside the API server's default service range, without
// spec.externalIPs. These tests run on the real API server (v1.37) and
// record what the ADR quotes.

const (
	cidrBMC  = "10.200.0.0/22" // outside the test API server's 10.96.0.0/12
	cidrNVOS = "10.202.0.0/22" // matsim's default: the BMC subnet moved up by 2
)

// createServiceCIDR creates a ServiceCIDR of cidr and waits until the API
// server allocates from it. When the test ends it is deleted, after the
// test's Services (the API server keeps a ServiceCIDR while it holds
// allocated IPs), and the test waits until it is gone, so later tests see
// the default range alone. Workers that could re-create those Services must
// be stopped by a cleanup registered after this call.
func (e *env) createServiceCIDR(name, cidr string) {
	e.t.Helper()
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr}}}
	api := e.kube.NetworkingV1().ServiceCIDRs()
	if _, err := api.Create(e.ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create ServiceCIDR %s: %v", cidr, err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		e.deleteServices(ctx, "")
		_ = api.Delete(ctx, name, metav1.DeleteOptions{})
		for ctx.Err() == nil {
			if _, err := api.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		e.t.Errorf("ServiceCIDR %s still there 60 s after its delete", name)
	})
	// Ready is set by kube-controller-manager, which these tests do not run
	// (the API server then takes a ServiceCIDR without the condition as
	// ready): wait until the API server allocates a cluster IP of it. Not
	// by a dry run: with several ServiceCIDRs, v1.37 checks a dry run's IP
	// against one of them chosen at random (MetaAllocator.DryRun).
	ip := netip.MustParsePrefix(cidr).Addr().Next().String()
	svcs := e.kube.CoreV1().Services(e.ns)
	waitFor(e.t, "ServiceCIDR "+cidr+" in use", func() (bool, string) {
		_, err := svcs.Create(e.ctx, svcWithIP("probe-"+name, ip), metav1.CreateOptions{})
		if err != nil {
			return false, err.Error()
		}
		if err := svcs.Delete(e.ctx, "probe-"+name, metav1.DeleteOptions{}); err != nil {
			e.t.Fatal(err)
		}
		return true, ""
	})
}

// listedRanges makes a worker read the service range from the ServiceCIDR
// objects, as one without --service-cidr does.
func (e *env) listedRanges(c *worker.Config) {
	c.Classifier = worker.Classifier{Ranges: worker.ListServiceRanges(e.ctx, e.kube, e.log)}
}

// deleteServices deletes the namespace's Services that match selector
// (Services have no delete-collection call).
func (e *env) deleteServices(ctx context.Context, selector string) {
	svcs := e.kube.CoreV1().Services(e.ns)
	list, err := svcs.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		e.t.Errorf("list Services %q: %v", selector, err)
		return
	}
	for _, s := range list.Items {
		if err := svcs.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("delete Service %s: %v", s.Name, err)
		}
	}
}

// fleetIPs maps each Service name of f to the IP the Service carries.
func fleetIPs(f *matsim.Fleet) map[string]string {
	want := map[string]string{}
	f.Status("", 1).Walk(func(d, _ *matclient.Device) {
		if d.BMC.IP != "" {
			want[plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)] = d.BMC.IP
		}
		if d.Kind == matclient.KindSwitch && d.NvosIP != "" {
			want[plan.NVOSServiceName(d.MatID)] = d.NvosIP
		}
	})
	return want
}

// serviceLife records, per Service name, when it was deleted and when it
// was added, from a watch of the namespace.
type serviceLife struct {
	mu      sync.Mutex
	deletes map[string][]time.Time
	adds    map[string][]time.Time
}

func (e *env) watchServiceLife() *serviceLife {
	e.t.Helper()
	l := &serviceLife{deletes: map[string][]time.Time{}, adds: map[string][]time.Time{}}
	list, err := e.kube.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	wi, err := e.kube.CoreV1().Services(e.ns).Watch(e.ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	e.onStop(func() { wi.Stop(); <-done })
	go func() {
		defer close(done)
		for ev := range wi.ResultChan() {
			s, ok := ev.Object.(*corev1.Service)
			if !ok {
				continue
			}
			now := time.Now()
			l.mu.Lock()
			switch ev.Type {
			case watch.Deleted:
				l.deletes[s.Name] = append(l.deletes[s.Name], now)
			case watch.Added:
				l.adds[s.Name] = append(l.adds[s.Name], now)
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// gaps returns, per name, how long it was without a Service: from each
// delete to the next add (to now when none followed).
func (l *serviceLife) gaps() map[string][]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]time.Duration{}
	for name, dels := range l.deletes {
		for _, d := range dels {
			end := time.Now()
			for _, a := range l.adds[name] {
				if a.After(d) {
					end = a
					break
				}
			}
			out[name] = append(out[name], end.Sub(d))
		}
	}
	return out
}

// TestServiceCIDRMode: a fleet whose BMC and NVOS networks lie outside the
// default service range runs in external-ip mode; two ServiceCIDRs that
// cover those networks are created; unrelated Services are created to see
// where the API server puts them; then a worker in cluster-ip mode moves
// every Service to ClusterIP = device IP, each with one recreate, and no
// Service is missing for longer than one delete and create.
func TestServiceCIDRMode(t *testing.T) {
	e := newEnv(t)
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 40, DPUsPerHost: 2, Switches: 4, PowerShelves: 4,
		IPMI: true, BMCSubnet: cidrBMC, Seed: 32})
	if err != nil {
		t.Fatal(err)
	}
	want := fleetIPs(fleet)
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))

	// 1. external-ip mode: no ServiceCIDR needed.
	external := e.startWorker(workerOpts{Name: "external-ip", Tweak: func(c *worker.Config) { c.Plan.IPMode = plan.IPModeExternalIP }})
	before := e.waitServices(names...)
	external.Stop()

	// Without a ServiceCIDR a BMC IP of the fleet is refused as a cluster IP.
	probe := svcWithIP("probe-outside", want[names[0]])
	if _, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsInvalid(err) {
		t.Fatalf("cluster IP %s with no ServiceCIDR covering it: err %v, want invalid", probe.Spec.ClusterIP, err)
	}

	// 2. The ServiceCIDRs an operator creates (`matbus check` names them).
	e.createServiceCIDR("matbus-bmc-"+e.ns, cidrBMC)
	e.createServiceCIDR("matbus-nvos-"+e.ns, cidrNVOS)

	// 3. Unrelated Services with no IP asked: the API server allocates from
	// every ServiceCIDR, the extra ones included.
	const unrelated = 300
	extra := []netip.Prefix{netip.MustParsePrefix(cidrBMC), netip.MustParsePrefix(cidrNVOS)}
	deviceIP := map[string]bool{}
	for _, ip := range want {
		deviceIP[ip] = true
	}
	inExtra, onDevice := 0, 0
	for i := range unrelated {
		s, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, svcWithIP(fmt.Sprintf("unrelated-%d", i), ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a := netip.MustParseAddr(s.Spec.ClusterIP)
		if slices.ContainsFunc(extra, func(p netip.Prefix) bool { return p.Contains(a) }) {
			inExtra++
		}
		if deviceIP[s.Spec.ClusterIP] {
			onDevice++
		}
	}
	t.Logf("servicecidr: %d of %d unrelated Services got a cluster IP in the BMC or NVOS ServiceCIDR (%.0f %%); %d of them a device's IP (%d device IPs in %d addresses)",
		inExtra, unrelated, 100*float64(inExtra)/unrelated, onDevice, len(want), 2*1024)
	if inExtra == 0 {
		t.Errorf("no unrelated Service got an IP of the extra ServiceCIDRs: the API server no longer allocates from them at random, and ADR 33 must be revisited")
	}
	e.deleteServices(e.ctx, "!"+plan.LabelInstance)
	waitFor(t, "unrelated Services gone", func() (bool, string) {
		n := len(e.services())
		return n == len(want), fmt.Sprintf("%d Services", n)
	})

	// 4. Migration: a worker in cluster-ip mode.
	life := e.watchServiceLife()
	start := time.Now()
	w := e.startWorker(workerOpts{Name: "cluster-ip", Tweak: e.listedRanges})
	t.Cleanup(w.Stop) // before the ServiceCIDRs' clean-up
	migrated := func(s *corev1.Service) bool {
		return s.Spec.ClusterIP == want[s.Name] && len(s.Spec.ExternalIPs) == 0
	}
	var after map[string]*corev1.Service
	waitFor(t, "every Service at ClusterIP = device IP", func() (bool, string) {
		after = e.services()
		var left []string
		for _, n := range names {
			if s := after[n]; s == nil || !migrated(s) {
				left = append(left, n)
			}
		}
		return len(left) == 0, fmt.Sprintf("%d of %d not migrated, e.g. %v", len(left), len(names), left[:min(3, len(left))])
	})
	took := time.Since(start)
	var longest time.Duration
	var all []time.Duration
	for n, g := range life.gaps() {
		if len(g) != 1 {
			t.Errorf("%s: %d deletes during the migration, want 1", n, len(g))
		}
		all = append(all, g...)
		longest = max(longest, slices.Max(g))
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) != len(names) {
		t.Errorf("%d Services recreated, want %d", len(all), len(names))
	} else {
		t.Logf("servicecidr: %d Services migrated from external-ip to cluster-ip in %v; without a Service: p50 %v, max %v",
			len(all), took.Round(time.Millisecond), all[len(all)/2].Round(time.Millisecond), longest.Round(time.Millisecond))
	}
	for n, s := range after {
		if s.UID == before[n].UID {
			t.Errorf("%s: not recreated", n)
		}
	}
	if st := w.Stats(); st.Recreated != int64(len(names)) {
		t.Errorf("stats = %+v, want %d recreates", st, len(names))
	}
	if evs := e.errs.Of(errKind("create")); len(evs) != 0 {
		t.Errorf("create error events during the migration: %+v", evs)
	}
}

// TestServiceCIDRCreatedLater: a device IP that no ServiceCIDR covers is
// refused before anything is deleted, and the Service keeps its IP and UID;
// once an operator creates a ServiceCIDR that covers it, the same worker
// (which lists the ServiceCIDRs, as one without --service-cidr does), not
// restarted, moves the Service at a later sync.
func TestServiceCIDRCreatedLater(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{Tweak: e.listedRanges})
	e.waitServices(v2MixedNames()...)

	const (
		name  = "mat-bmc-host-7ec7b7c3-126-c030b365"
		newIP = "10.203.0.21" // in no ServiceCIDR yet
	)
	first := e.service(name)
	if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", newIP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a permanent create error naming the range", func() (bool, string) {
		for _, ev := range e.errs.Of(errKind("create")) {
			if ev.Service == e.ns+"/"+name && ev.Permanent && hasAll(ev.Message, newIP, "outside the service range", "create a ServiceCIDR") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("create events: %+v", e.errs.Of(errKind("create")))
	})
	waitSyncs(t, w, 2)
	if s := e.service(name); s == nil || s.UID != first.UID || s.Spec.ClusterIP != first.Spec.ClusterIP {
		t.Fatalf("Service changed while its new IP was refused: %+v -> %+v", first, s)
	}

	e.createServiceCIDR("matbus-later-"+e.ns, "10.203.0.0/24")
	t.Cleanup(w.Stop) // before the ServiceCIDR's clean-up
	waitFor(t, "the Service at its new IP", func() (bool, string) {
		s := e.service(name)
		if s == nil {
			return false, "missing"
		}
		return s.Spec.ClusterIP == newIP, "clusterIP " + s.Spec.ClusterIP
	})
	if st := w.Stats(); st.Recreated != 1 {
		t.Errorf("stats = %+v, want 1 recreate", st)
	}
}
