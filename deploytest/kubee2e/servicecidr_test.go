package kubee2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/matbus/matbus/internal/testenv"
)

// The networks of TestServiceCIDR, all outside the node's service range
// (10.96.0.0/12, MATBUS_KUBE_E2E_SERVICE_CIDR) and its pod network
// (10.214.0.0/24). Nothing routes them on the host: only kube-proxy's
// rules make them reachable, and a packet to one without a rule is
// dropped by the node's FORWARD rule (it never leaves the machine).
var (
	// extraCIDR is the ServiceCIDR of steps a and b.
	extraCIDR = netip.MustParsePrefix("10.124.0.0/20")
	// cidrBMCs and cidrNVOS are the BMC and NVOS networks of step c's MAT
	// (matsim puts NVOS IPs at the BMC subnet moved up by 2 in its second octet).
	cidrBMCs = netip.MustParsePrefix("10.120.64.0/20")
	cidrNVOS = netip.MustParsePrefix("10.122.64.0/20")
)

const (
	// unrelatedServices is how many Services of step b ask for no IP.
	unrelatedServices = 300
	// labelCIDRTest marks the objects TestServiceCIDR makes besides the chart's.
	labelCIDRTest = "matbus-e2e/servicecidr"
	// routingIP is step a's Service IP, inside extraCIDR.
	routingIP = "10.124.0.10"
	// probeInterval and probeTimeout: the prober connects to each BMC
	// address every interval, each connect bounded by the timeout.
	probeInterval = 150 * time.Millisecond
	probeTimeout  = 300 * time.Millisecond
	// recreateBound is the longest a BMC may be unreachable while matbus
	// moves its Service from external-ip to cluster-ip form. One recreate is
	// the worker's delete and create, back to back (≤ 1 s here); the
	// EndpointSlice controller's write of the new Service's slice (≤ 1 s);
	// kube-proxy's next sync, at most its minSyncPeriod (1 s) after the
	// change, and its iptables-restore (≤ 2 s on this shared 2-core node);
	// and the prober's resolution (an interval and a connect timeout,
	// 0.45 s): 5.5 s, and 2.5 s of margin for a loaded machine.
	recreateBound = 8 * time.Second
)

// TestServiceCIDR measures, on the real node, what an extra ServiceCIDR
// does for BMC Services (chart value bmcServiceCIDR):
//
//	a. routing: a Service whose cluster IP lies in a ServiceCIDR outside
//	   the default range is reached from a pod through kube-proxy; without
//	   the ServiceCIDR the API server refuses that IP, and a pod does not
//	   reach it;
//	b. unrelated Services: how many of 300 ClusterIP Services that ask for
//	   no IP get one inside the extra ServiceCIDR;
//	c. migration: matbus installed in external-ip mode, upgraded to
//	   cluster-ip mode with the chart's ServiceCIDRs for the BMC and NVOS
//	   networks: each Service is recreated once, and a prober pod that
//	   connects to every BMC address every 150 ms sees each unreachable at
//	   most once, for at most recreateBound.
//
// Lines starting with "servicecidr:" carry the numbers.
func TestServiceCIDR(t *testing.T) {
	if os.Getenv("MATBUS_KUBE_E2E") != "1" {
		t.Skip("needs a real cluster: run `make kube-e2e` (hack/kube-e2e.sh)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	e := newE2E(t, ctx)
	for _, p := range []netip.Prefix{extraCIDR, cidrBMCs, cidrNVOS} {
		if p.Overlaps(e.cfg.serviceCIDR) || p.Overlaps(netip.MustParsePrefix("10.214.0.0/16")) {
			t.Fatalf("%s overlaps the node's service range %s or pod network 10.214.0.0/16: this test needs networks outside both", p, e.cfg.serviceCIDR)
		}
	}
	e.ca = testenv.NewCA(t, "matbus-kube-e2e ServiceCIDR MAT CA")
	m := &mat{name: "mat-cidr", hosts: 20, seed: 3, subnet: cidrBMCs}
	e.mats = []*mat{m}

	// Cleanups run last to first: the ServiceCIDRs go after the namespace,
	// once no Service holds an IP of theirs (the API server's finalizer).
	var cidrNames []string
	t.Cleanup(func() { deleteServiceCIDRs(t, e, cidrNames, !e.cfg.keep) })
	e.freshNamespace()
	if !e.cfg.keep {
		t.Cleanup(func() { deleteNamespace(t, e.kube) })
	}
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, e.kube)
		}
	})
	defer e.summary()

	e.step("c0. NATS and a MAT with its BMCs outside the service range", func() string {
		e.createNATS()
		e.createMATService(m)
		e.createMATCerts()
		e.createMATDeployment(m)
		e.waitPodsReady("app.kubernetes.io/name=nats", 1, 3*time.Minute)
		m.podIP = e.waitPodsReady(m.podSelector(), 1, 3*time.Minute)[0].Status.PodIP
		e.waitFor(time.Minute, 2*time.Second, "status of "+m.name, func() (bool, string) {
			if err := e.fetchStatus(m); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		m.plan()
		for _, s := range m.want.Services {
			ip := netip.MustParseAddr(s.Spec.ClusterIP)
			if !cidrBMCs.Contains(ip) && !cidrNVOS.Contains(ip) {
				t.Fatalf("Service %s: IP %s is in neither %s nor %s", s.Name, ip, cidrBMCs, cidrNVOS)
			}
		}
		return fmt.Sprintf("%s: %d BMC + %d NVOS Services on %s and %s", m.name, m.bmcs, len(m.want.Services)-m.bmcs, cidrBMCs, cidrNVOS)
	})

	e.step("a. routing through an extra ServiceCIDR", func() string {
		cidrNames = append(cidrNames, "matbus-e2e-extra")
		return e.routing(m, "matbus-e2e-extra")
	})

	e.step("b. unrelated Services in the extra ServiceCIDR", func() string {
		note := e.unrelatedAllocations()
		e.dropExtraCIDR("matbus-e2e-extra")
		return note
	})

	e.step("c. external-ip to cluster-ip with the chart's ServiceCIDRs", func() string {
		return e.migrate(m, func(names ...string) { cidrNames = append(cidrNames, names...) })
	})
}

// cidrService is step a's Service: ip as its cluster IP, port 443 to the
// MAT pod's 1266 (as a BMC Service's redfish port).
func cidrService(m *mat, name, ip string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelCIDRTest: "routing"}},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Selector: m.podLabels(),
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(matPort), Protocol: corev1.ProtocolTCP}}},
	}
}

// createServiceCIDR creates a ServiceCIDR and waits for its Ready condition.
func (e *e2e) createServiceCIDR(name string, cidrs ...string) time.Duration {
	e.t.Helper()
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelCIDRTest: "true"}},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	start := time.Now()
	if _, err := e.kube.NetworkingV1().ServiceCIDRs().Create(e.ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create ServiceCIDR %s %v: %v", name, cidrs, err)
	}
	e.waitServiceCIDRReady(name)
	return time.Since(start)
}

func (e *e2e) waitServiceCIDRReady(name string) {
	e.t.Helper()
	e.waitFor(time.Minute, 100*time.Millisecond, "ServiceCIDR "+name+" Ready", func() (bool, string) {
		sc, err := e.kube.NetworkingV1().ServiceCIDRs().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range sc.Status.Conditions {
			if c.Type == networkingv1.ServiceCIDRConditionReady {
				return c.Status == metav1.ConditionTrue, fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
		return false, "no Ready condition yet"
	})
}

// probePod runs `matbus probe` against url in a pod and returns whether
// it succeeded, and its log.
func (e *e2e) probePod(name, url string) (bool, string) {
	e.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelCIDRTest: "client"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			EnableServiceLinks:            ptr.To(false),
			SecurityContext:               podSecurity(),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "probe", Image: e.cfg.image, ImagePullPolicy: corev1.PullNever,
				Args:            []string{"probe", "--insecure-skip-verify", "--timeout", "3s", "--url", url},
				SecurityContext: containerSecurity(),
				Resources:       requests("10m", "16Mi"),
			}},
		},
	}
	pods := e.kube.CoreV1().Pods(namespace)
	if _, err := pods.Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	defer func() {
		_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}()
	var phase corev1.PodPhase
	e.waitFor(time.Minute, 250*time.Millisecond, "probe pod "+name+" done", func() (bool, string) {
		p, err := pods.Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, podLine(p)
	})
	return phase == corev1.PodSucceeded, strings.TrimSpace(podLogs(e.ctx, e.kube, name, "probe", false, 5))
}

// routing is step a.
func (e *e2e) routing(m *mat, cidrName string) string {
	t, ctx := e.t, e.ctx
	svcs := e.kube.CoreV1().Services(namespace)
	url := "https://" + routingIP + ":443/healthz"

	// The controls: no ServiceCIDR holds the IP.
	_, err := svcs.Create(ctx, cidrService(m, "cidr-routing", routingIP), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("Service with cluster IP %s outside every ServiceCIDR: %v, want 422 Invalid", routingIP, err)
	}
	refused := err.Error()
	if ok, log := e.probePod("cidr-control", url); ok {
		t.Fatalf("a pod reached %s with no Service behind it: %s", url, log)
	}

	took := e.createServiceCIDR(cidrName, extraCIDR.String())
	// The API server's allocators follow the ServiceCIDRs through an
	// informer: a create right after Ready may still be refused.
	accepted := e.waitFor(10*time.Second, 100*time.Millisecond, "a Service with cluster IP "+routingIP+" in ServiceCIDR "+extraCIDR.String(), func() (bool, string) {
		_, err := svcs.Create(ctx, cidrService(m, "cidr-routing", routingIP), metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	created := time.Now()
	e.waitFor(time.Minute, 200*time.Millisecond, "the EndpointSlice of cidr-routing lists the MAT pod", func() (bool, string) {
		eps, err := e.endpointSlices()
		if err != nil {
			return false, err.Error()
		}
		for _, sl := range eps["cidr-routing"] {
			for _, ep := range sl.Endpoints {
				if slices.Contains(ep.Addresses, m.podIP) && ptr.Deref(ep.Conditions.Ready, false) {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("%d slices", len(eps["cidr-routing"]))
	})
	// kube-proxy syncs at most once a second: a first pod may come too early.
	var log string
	reached := false
	for i := range 3 {
		var ok bool
		if ok, log = e.probePod(fmt.Sprintf("cidr-client-%d", i), url); ok {
			reached = true
			break
		}
	}
	if !reached {
		t.Fatalf("no pod reached %s through ServiceCIDR %s: %s", url, extraCIDR, log)
	}
	t.Logf("servicecidr: routing: yes: a pod GETs %s (%s) through kube-proxy %.1fs after the Service's create; ServiceCIDR %s Ready %.2fs after its create, the Service's IP accepted %.2fs after that; without it the API server refused the IP (%s) and a pod did not reach it",
		url, log, time.Since(created).Seconds(), extraCIDR, took.Seconds(), accepted.Seconds(), refused)
	return fmt.Sprintf("routed yes; ServiceCIDR Ready in %.2fs; without it: create refused (422) and not reached", took.Seconds())
}

// unrelatedAllocations is step b: ClusterIP Services that ask for no IP,
// as other workloads' Services do, with the extra ServiceCIDR Ready.
func (e *e2e) unrelatedAllocations() string {
	t, ctx := e.t, e.ctx
	svcs := e.kube.CoreV1().Services(namespace)
	var mu sync.Mutex
	var ips []netip.Addr
	var firstErr error
	work := make(chan int)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for i := range work {
				s, err := svcs.Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("unrelated-%03d", i), Labels: map[string]string{labelCIDRTest: "unrelated"}},
					Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
				}, metav1.CreateOptions{})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					if a, perr := netip.ParseAddr(s.Spec.ClusterIP); perr == nil {
						ips = append(ips, a)
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range unrelatedServices {
		work <- i
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("create unrelated Services: %v", firstErr)
	}
	in, def := 0, 0
	for _, a := range ips {
		switch {
		case extraCIDR.Contains(a):
			in++
		case e.cfg.serviceCIDR.Contains(a):
			def++
		default:
			t.Errorf("unrelated Service got %s, in neither %s nor %s", a, e.cfg.serviceCIDR, extraCIDR)
		}
	}
	if len(ips) != unrelatedServices {
		t.Errorf("%d of %d unrelated Services got a cluster IP", len(ips), unrelatedServices)
	}
	sizeDefault := uint64(1) << (32 - e.cfg.serviceCIDR.Bits())
	sizeExtra := uint64(1) << (32 - extraCIDR.Bits())
	t.Logf("servicecidr: unrelated Services: %d of %d (%.0f%%) that asked for no IP got one in the extra ServiceCIDR %s, %d in the default range %s (which has %d times as many addresses)",
		in, unrelatedServices, 100*float64(in)/unrelatedServices, extraCIDR, def, e.cfg.serviceCIDR, sizeDefault/sizeExtra)

	var dwg sync.WaitGroup
	for i := range unrelatedServices {
		dwg.Go(func() {
			if err := svcs.Delete(context.Background(), fmt.Sprintf("unrelated-%03d", i), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete unrelated Service: %v", err)
			}
		})
		if i%20 == 19 {
			dwg.Wait()
		}
	}
	dwg.Wait()
	return fmt.Sprintf("%d of %d unrelated Services got an IP in %s", in, unrelatedServices, extraCIDR)
}

// dropExtraCIDR deletes step a's ServiceCIDR while its Service still holds
// an IP of it: the API server keeps the object (its finalizer) and the
// Service keeps routing until the Service goes; then the object goes.
func (e *e2e) dropExtraCIDR(name string) {
	t, ctx := e.t, e.ctx
	scs := e.kube.NetworkingV1().ServiceCIDRs()
	if err := scs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	sc, err := scs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ServiceCIDR %s deleted while Service cidr-routing holds %s: %v (want it held by its finalizer)", name, routingIP, err)
	}
	var ready string
	for _, c := range sc.Status.Conditions {
		if c.Type == networkingv1.ServiceCIDRConditionReady {
			ready = fmt.Sprintf("Ready=%s (%s)", c.Status, c.Reason)
		}
	}
	if ok, log := e.probePod("cidr-client-held", "https://"+routingIP+":443/healthz"); !ok {
		t.Errorf("the Service stopped routing while its ServiceCIDR is held for deletion: %s", log)
	}
	if err := e.kube.CoreV1().Services(namespace).Delete(ctx, "cidr-routing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.waitFor(time.Minute, 200*time.Millisecond, "ServiceCIDR "+name+" gone after its last Service", func() (bool, string) {
		_, err := scs.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	t.Logf("servicecidr: a ServiceCIDR deleted while a Service holds one of its IPs stays (finalizers %v, %s) and the Service keeps routing; it was gone %.1fs after that Service's delete",
		sc.Finalizers, ready, time.Since(start).Seconds())
}

// deleteServiceCIDRs deletes the named ServiceCIDRs and, with wait, waits
// a bounded time for them to go.
func deleteServiceCIDRs(t *testing.T, e *e2e, names []string, wait bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	scs := e.kube.NetworkingV1().ServiceCIDRs()
	for _, n := range names {
		if err := scs.Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete ServiceCIDR %s: %v", n, err)
		}
	}
	if !wait {
		return
	}
	for _, n := range names {
		for {
			_, err := scs.Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				t.Errorf("ServiceCIDR %s still there 2 minutes after its delete: %v", n, err)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// probeTarget is one address the prober connects to: a BMC or NVOS IP and
// the Service port that leads to the MAT pod's 1266.
type probeTarget struct {
	service string
	ip      string
	addr    string
}

func targets(m *mat) []probeTarget {
	var out []probeTarget
	for _, s := range m.want.Services {
		for _, p := range s.Spec.Ports {
			if p.Protocol == corev1.ProtocolTCP && p.TargetPort.IntValue() == matPort {
				out = append(out, probeTarget{service: s.Name, ip: s.Spec.ClusterIP, addr: fmt.Sprintf("%s:%d", s.Spec.ClusterIP, p.Port)})
				break
			}
		}
	}
	return out
}

// buildProber builds reachprobe static into a folder the pods may read
// (the node is this machine) and returns the folder.
func (e *e2e) buildProber() string {
	e.t.Helper()
	dir, err := os.MkdirTemp("", "matbus-reachprobe-")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.CommandContext(e.ctx, "go", "build", "-trimpath", "-o", filepath.Join(dir, "reachprobe"), "./deploytest/kubee2e/reachprobe")
	cmd.Dir = e.cfg.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("go build reachprobe: %v\n%s", err, out)
	}
	return dir
}

// startProber runs reachprobe against every target in a pod.
func (e *e2e) startProber(dir string, ts []probeTarget) string {
	e.t.Helper()
	args := []string{"-interval", probeInterval.String(), "-timeout", probeTimeout.String()}
	for _, tg := range ts {
		args = append(args, tg.addr)
	}
	const name = "reachprobe"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelCIDRTest: "prober"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			EnableServiceLinks:            ptr.To(false),
			SecurityContext:               podSecurity(),
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "probe", Image: e.cfg.image, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/reachprobe/reachprobe"},
				Args:            args,
				SecurityContext: containerSecurity(),
				Resources:       requests("20m", "16Mi"),
				VolumeMounts:    []corev1.VolumeMount{{Name: "bin", MountPath: "/reachprobe", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: dir, Type: ptr.To(corev1.HostPathDirectory)}}}},
		},
	}
	if _, err := e.kube.CoreV1().Pods(namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitPodsReady(labelCIDRTest+"=prober", 1, 2*time.Minute)
	return name
}

// outage is one time a target was unreachable: from the end of the last
// connect that succeeded to the start of the first that did again.
type outage struct {
	from, to time.Time
	failures int
}

// reachLog is what the prober reported so far.
type reachLog struct {
	up      map[string]time.Time // first reachable
	outages map[string][]outage
	down    map[string]string // unreachable now: since when and why
}

func (e *e2e) readProber(pod string) reachLog {
	e.t.Helper()
	rl := reachLog{up: map[string]time.Time{}, outages: map[string][]outage{}, down: map[string]string{}}
	rc, err := e.kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: "probe"}).Stream(e.ctx)
	if err != nil {
		e.t.Fatalf("prober log: %v", err)
	}
	defer rc.Close()
	at := func(s string) time.Time {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			e.t.Fatalf("prober log: bad time %q", s)
		}
		return time.UnixMilli(n)
	}
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "up":
			rl.up[f[1]] = at(f[2])
		case len(f) >= 3 && f[0] == "down":
			rl.down[f[1]] = at(f[2]).Format("15:04:05.000") + " " + strings.Join(f[3:], " ")
		case len(f) == 5 && f[0] == "window":
			n, _ := strconv.Atoi(f[4])
			rl.outages[f[1]] = append(rl.outages[f[1]], outage{from: at(f[2]), to: at(f[3]), failures: n})
			delete(rl.down, f[1])
		default:
			e.t.Logf("prober log: unexpected line %q", sc.Text())
		}
	}
	return rl
}

// externalForm says whether every Service of m is in external-ip form
// (spec.externalIPs = [its IP], a cluster IP of the default range) and
// its EndpointSlice lists the MAT pod.
func (e *e2e) externalForm(m *mat) (bool, string) {
	have, err := e.existing(m)
	if err != nil {
		return false, err.Error()
	}
	byName := map[string]*corev1.Service{}
	for _, s := range have {
		byName[s.Name] = s
	}
	var why []string
	for _, want := range m.want.Services {
		ip := want.Spec.ClusterIP
		s := byName[want.Name]
		switch {
		case s == nil:
			why = append(why, want.Name+" missing")
		case !slices.Equal(s.Spec.ExternalIPs, []string{ip}) || s.Spec.ClusterIP == ip:
			why = append(why, fmt.Sprintf("%s: clusterIP %s externalIPs %v", s.Name, s.Spec.ClusterIP, s.Spec.ExternalIPs))
		}
	}
	if len(why) > 0 {
		return false, fmt.Sprintf("%d of %d not in external-ip form, e.g. %s", len(why), len(m.want.Services), strings.Join(why[:min(3, len(why))], "; "))
	}
	return e.endpointsListed(m)
}

func (e *e2e) endpointsListed(m *mat) (bool, string) {
	eps, err := e.endpointSlices()
	if err != nil {
		return false, err.Error()
	}
	ok, wrong := e.endpointsRight(m, eps, nil)
	return ok == len(m.want.Services), fmt.Sprintf("%d of %d EndpointSlices right; %s", ok, len(m.want.Services), strings.Join(wrong, "; "))
}

// migrate is step c. It gives the chart's ServiceCIDR names to
// register before it makes them (helm uninstall keeps them: the test
// deletes them).
func (e *e2e) migrate(m *mat, register func(names ...string)) string {
	t, ctx := e.t, e.ctx
	// No gateway sidecar: its TLS Secret is the main scenario's, and this
	// step measures the worker's move, not the gateway.
	base := append(e.chartArgs(),
		"--set", "discovery.replicas=1", "--set", "worker.replicas=2", "--set", "discovery.syncInterval=5s",
		"--set", "gateway.enabled=false")
	start := time.Now()
	e.helm(5*time.Minute, append([]string{"install", release, chartDir, "--namespace", namespace, "--wait", "--timeout", "4m",
		"--set", "worker.bmcIPMode=external-ip"}, base...)...)
	e.waitFor(3*time.Minute, time.Second, "every Service of "+m.name+" in external-ip form with its endpoints", func() (bool, string) {
		return e.externalForm(m)
	})
	installed := time.Since(start)

	ts := targets(m)
	if len(ts) != len(m.want.Services) {
		t.Fatalf("%d prober targets for %d Services", len(ts), len(m.want.Services))
	}
	dir := e.buildProber()
	pod := e.startProber(dir, ts)
	var rl reachLog
	e.waitFor(time.Minute, time.Second, "the prober reaches every BMC address in external-ip mode", func() (bool, string) {
		rl = e.readProber(pod)
		var missing []string
		for _, tg := range ts {
			if _, ok := rl.up[tg.addr]; !ok || rl.down[tg.addr] != "" {
				missing = append(missing, tg.addr)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d of %d not reached, e.g. %v", len(missing), len(ts), missing[:min(3, len(missing))])
	})
	time.Sleep(2 * time.Second) // a steady state before the upgrade

	rec := e.recordServices()
	prefix := fullname + "-" + namespace + "-"
	names := []string{prefix + "10-120-64-0-20", prefix + "10-122-64-0-20"}
	register(names...)
	upgrade := time.Now()
	cidrs := []string{cidrBMCs.String(), cidrNVOS.String()}
	e.helm(5*time.Minute, append([]string{"upgrade", release, chartDir, "--namespace", namespace, "--wait", "--timeout", "4m",
		"--set", "worker.bmcIPMode=cluster-ip", "--set", "bmcServiceCIDR.create=true",
		"--set", "bmcServiceCIDR.cidrs={" + strings.Join(cidrs, ",") + "}"}, base...)...)
	upgraded := time.Since(upgrade)
	for _, n := range names {
		e.waitServiceCIDRReady(n)
	}
	converged := e.waitFor(3*time.Minute, time.Second, "every Service of "+m.name+" in cluster-ip form with its endpoints", func() (bool, string) {
		if ok, why := e.converged(m); !ok {
			return false, why
		}
		return e.endpointsListed(m)
	})
	// Reachable again everywhere, and for 3 s since the last outage ended.
	e.waitFor(time.Minute, time.Second, "every BMC address reachable again for 3 s", func() (bool, string) {
		rl = e.readProber(pod)
		if len(rl.down) > 0 {
			return false, fmt.Sprintf("%d unreachable: %v", len(rl.down), rl.down)
		}
		var last time.Time
		for _, outs := range rl.outages {
			for _, o := range outs {
				last = maxTime(last, o.to)
			}
		}
		return time.Since(last) > 3*time.Second, "last outage ended " + last.Format("15:04:05.000")
	})
	_ = e.kube.CoreV1().Pods(namespace).Delete(ctx, pod, metav1.DeleteOptions{})

	// Each Service recreated exactly once, now in cluster-ip form.
	added, deleted := rec.since(upgrade)
	count := func(evs []svcEvent) map[string]int {
		c := map[string]int{}
		for _, ev := range evs {
			c[ev.name]++
		}
		return c
	}
	nAdd, nDel := count(added), count(deleted)
	have, err := e.existing(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range have {
		want := ""
		for _, w := range m.want.Services {
			if w.Name == s.Name {
				want = w.Spec.ClusterIP
			}
		}
		if s.Spec.ClusterIP != want || len(s.Spec.ExternalIPs) != 0 {
			t.Errorf("Service %s: clusterIP %s externalIPs %v, want clusterIP %s and no externalIPs", s.Name, s.Spec.ClusterIP, s.Spec.ExternalIPs, want)
		}
		if nAdd[s.Name] != 1 || nDel[s.Name] != 1 {
			t.Errorf("Service %s: deleted %d and created %d times during the migration, want once each", s.Name, nDel[s.Name], nAdd[s.Name])
		}
	}
	var firstRecreate, lastRecreate time.Time
	for _, ev := range deleted {
		if firstRecreate.IsZero() || ev.at.Before(firstRecreate) {
			firstRecreate = ev.at
		}
		lastRecreate = maxTime(lastRecreate, ev.at)
	}

	// The outages: an address may be unreachable more than once (a busy
	// node can miss a few probes of every address at the same moment), but
	// not for longer than one recreate in all.
	type worst struct {
		ip    string
		took  time.Duration
		total time.Duration
		n     int
	}
	var per []worst
	var overall time.Duration
	for _, tg := range ts {
		w := worst{ip: tg.ip, n: len(rl.outages[tg.addr])}
		for _, o := range rl.outages[tg.addr] {
			w.took = max(w.took, o.to.Sub(o.from))
			w.total += o.to.Sub(o.from)
			if o.from.Before(upgrade) {
				t.Errorf("%s (%s) was unreachable before the upgrade, %s to %s", tg.addr, tg.service, o.from.Format("15:04:05.000"), o.to.Format("15:04:05.000"))
			}
		}
		overall = max(overall, w.took)
		if w.total > recreateBound {
			t.Errorf("%s (%s) was unreachable for %v in all (%d windows), over the bound %v of one recreate: %+v",
				tg.addr, tg.service, w.total.Round(time.Millisecond), w.n, recreateBound, rl.outages[tg.addr])
		}
		per = append(per, w)
	}
	slices.SortFunc(per, func(a, b worst) int { return int(b.took - a.took) })
	var b strings.Builder
	zero := 0
	for _, w := range per {
		if w.n == 0 {
			zero++
			continue
		}
		fmt.Fprintf(&b, " %s=%.2fs", w.ip, w.total.Seconds())
		if w.n > 1 {
			fmt.Fprintf(&b, "(x%d)", w.n)
		}
	}
	t.Logf("servicecidr: migration external-ip -> cluster-ip: %d BMC/NVOS addresses probed every %v (connect timeout %v); unreachable time per IP (windows):%s; %d never unreachable; overall max %.2fs (bound %v)",
		len(ts), probeInterval, probeTimeout, b.String(), zero, overall.Seconds(), recreateBound)
	t.Logf("servicecidr: migration: install in external-ip mode and every Service in that form %.1fs; upgrade --wait %.1fs; recreates from %.1fs to %.1fs after the upgrade began; every Service in cluster-ip form %.1fs after the upgrade returned",
		installed.Seconds(), upgraded.Seconds(), firstRecreate.Sub(upgrade).Seconds(), lastRecreate.Sub(upgrade).Seconds(), converged.Seconds())

	// helm uninstall keeps the ServiceCIDRs (helm.sh/resource-policy: keep).
	e.helm(3*time.Minute, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m")
	for _, n := range names {
		if _, err := e.kube.NetworkingV1().ServiceCIDRs().Get(ctx, n, metav1.GetOptions{}); err != nil {
			t.Errorf("ServiceCIDR %s after helm uninstall: %v, want it kept", n, err)
		}
	}
	return fmt.Sprintf("%d addresses, overall max unreachable %.2fs (bound %v), %d never unreachable; every Service recreated once into cluster-ip form",
		len(ts), overall.Seconds(), recreateBound, zero)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
