package deploytest

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// TestChartRBACConverges runs the chart's discovery and worker containers
// (their rendered args and env, as processes) as the chart's ServiceAccount
// against the real API server: a recording proxy impersonates
// system:serviceaccount:<ns>:<sa> for every request. The pipeline must
// create, update, recreate and delete BMC Services and survive a leader
// change with no request refused, and every verb the Role grants must
// have been used: the Role is what the code needs, no less and no more.
func TestChartRBACConverges(t *testing.T) {
	c := requireCluster(t)
	admin := kubernetes.NewForConfigOrDie(adminConfig(c))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(t, admin, "rbac")

	ns2, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns2.Shutdown()

	objs := render(t, ns,
		"--set", "nats.url="+ns2.ClientURL(),
		"--set", "worker.serviceCIDR[0]="+c.ServiceCIDR,
		"--set", "worker.enableStateAnnotations=true", // the power state update below
		"--set", "worker.insecureSkipVerify=true", // matsim's self-signed certificate
		"--set", "discovery.syncInterval=1s",
		"--set", "discovery.leaderElection.leaseDuration=4s",
		"--set", "discovery.leaderElection.renewDeadline=3s",
		"--set", "discovery.leaderElection.retryPeriod=500ms",
		"--set", "common.logFormat=text",
		"--set", "common.logLevel=debug")
	var sa string
	for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
		o := find(t, objs, kind, "matbus")
		createAsAdmin(t, admin, o)
		if kind == "ServiceAccount" {
			sa = o.GetName()
		}
	}
	role := find(t, objs, "Role", "matbus")
	granted := roleVerbs(t, role)
	leaseName := leaseNameOf(t, objs)

	// Every request of the processes goes through rec, as the ServiceAccount.
	rec := newRecorder(t, c, "system:serviceaccount:"+ns+":"+sa)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	writeKubeconfig(t, kubeconfig, rec.URL)

	// A MAT simulator, its Deployment (owner of the BMC Services) and the
	// MAT API Service discovery finds.
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 1, PowerShelves: 1, IPMI: true,
		BMCSubnet: "10.97.1.0/24", Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := matsim.New(matsim.Options{Fleet: fleet, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	simURL, err := sim.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	dep := matDeployment(ns, "mat-a")
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	matSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "mat-a" + discovery.OwnerSuffix, Namespace: ns,
			Labels:      map[string]string{"nvidia-infra-controller/mat-service": "true"},
			Annotations: map[string]string{discovery.URLAnnotation: simURL}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}},
	}
	if _, err := admin.CoreV1().Services(ns).Create(ctx, matSvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The chart's pods, as processes.
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
		if t.Failed() {
			for _, p := range procs {
				t.Logf("--- %s (last lines)\n%s", p.name, lastLines(p.out.Bytes(), 40))
			}
		}
	}()
	secret := find(t, objs, "Secret", "-nats")
	for _, comp := range []string{"discovery", "worker"} {
		d := find(t, objs, "Deployment", "-"+comp)
		replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
		if replicas < 2 {
			t.Fatalf("%s: want at least 2 replicas in the chart's defaults, got %d", comp, replicas)
		}
		for i := 0; i < int(replicas); i++ {
			procs = append(procs, startPod(t, d, secret, fmt.Sprintf("%s-%d", d.GetName(), i), kubeconfig))
		}
	}
	for _, p := range procs {
		p.waitReady(t, ctx)
	}

	// waitFor, failing at once when a request was refused (the Role lacks it).
	waitFor := func(t *testing.T, ctx context.Context, what string, cond func() bool) {
		t.Helper()
		waitFor(t, ctx, what, func() bool {
			if _, forbidden := rec.result(); len(forbidden) > 0 {
				t.Fatalf("waiting for %s: requests refused to the chart's ServiceAccount (the Role lacks them):\n  %s", what, strings.Join(forbidden, "\n  "))
			}
			return cond()
		})
	}
	managed := func() []corev1.Service {
		l, err := admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: plan.LabelManagedBy + "=" + plan.DefaultManagedBy})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	waitFor(t, ctx, "a Service per simulated BMC and NVOS", func() bool { return len(managed()) == sim.BMCs()+sim.Fleet().NVOSIPs() })
	for _, s := range managed() {
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Name != "mat-a" {
			t.Errorf("Service %s: owner references %v, want the MAT Deployment mat-a (needs deployments get)", s.Name, s.OwnerReferences)
		}
	}

	// update: a power state change; recreate: a new BMC IP (clusterIP is immutable).
	f := sim.Fleet()
	host := f.Machines[0]
	f.Machines[0].PowerState = "Off-" + host.PowerState
	if err := sim.SetFleet(f); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the power state update", func() bool {
		s := serviceOf(managed(), host.MatID)
		return s != nil && s.Annotations[plan.AnnotationPowerState] == "Off-"+host.PowerState
	})
	newIP := "10.97.1.200"
	if err := sim.SetBMCIP(host.MatID, newIP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the BMC Service recreated on the new IP", func() bool {
		s := serviceOf(managed(), host.MatID)
		return s != nil && s.Spec.ClusterIP == newIP
	})

	// get: a Service another tool took over (its managed-by changed) is read
	// when the create of its name answers AlreadyExists, and left alone;
	// handed back, it is ours again.
	setManagedBy := func(matID, value string) {
		t.Helper()
		s := serviceOf(managed(), matID)
		if value == plan.DefaultManagedBy {
			l, err := admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: plan.LabelManagedBy + "=someone-else"})
			if err != nil || len(l.Items) != 1 {
				t.Fatalf("the taken-over Service: %v, %d found", err, len(l.Items))
			}
			s = &l.Items[0]
		}
		s.Labels[plan.LabelManagedBy] = value
		if _, err := admin.CoreV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setManagedBy(host.MatID, "someone-else")
	waitFor(t, ctx, "the taken-over name read with get", func() bool { used, _ := rec.result(); return used["get services"] })
	// The refused create repeats at every resync: a CreateRefused Event on
	// the MAT Service (create), then its series count (patch).
	waitFor(t, ctx, "the refused create as a Kubernetes Event series", func() bool {
		used, _ := rec.result()
		return used["create events.events.k8s.io"] && used["patch events.events.k8s.io"]
	})
	evs, err := admin.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + matSvc.Name + ",reason=CreateRefused"})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no CreateRefused Event regarding the MAT Service %s (%v)", matSvc.Name, err)
	}
	setManagedBy(host.MatID, plan.DefaultManagedBy)
	waitFor(t, ctx, "the handed-back Service managed again", func() bool { return serviceOf(managed(), host.MatID) != nil })

	// A leader change: stop the leading publisher; the standby takes over.
	lease, err := admin.CoordinationV1().Leases(ns).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the election Lease %s: %v", leaseName, err)
	}
	leader := *lease.Spec.HolderIdentity
	for _, p := range procs {
		if p.name == leader {
			p.stop()
		}
	}
	waitFor(t, ctx, "another publisher to lead", func() bool {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, leaseName, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && *l.Spec.HolderIdentity != leader
	})

	// delete: a device disappears, then the whole instance is gone.
	sw := f.Machines[len(f.Machines)-1]
	if err := sim.RemoveDevice(sw.MatID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the removed device's Service deleted", func() bool {
		return serviceOf(managed(), sw.MatID) == nil && len(managed()) == sim.BMCs()+sim.Fleet().NVOSIPs()
	})
	if err := admin.CoreV1().Services(ns).Delete(ctx, matSvc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "every BMC Service deleted after the instance is gone", func() bool { return len(managed()) == 0 })

	// The Role against what was asked.
	used, forbidden := rec.result()
	if len(forbidden) > 0 {
		t.Errorf("requests refused to the chart's ServiceAccount (the Role lacks them):\n  %s", strings.Join(forbidden, "\n  "))
	}
	var unused, extra []string
	for k := range granted {
		if !used[k] {
			unused = append(unused, k)
		}
	}
	for k := range used {
		if !granted[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(unused)
	sort.Strings(extra)
	if len(unused) > 0 {
		t.Errorf("the Role grants what the code never asked for: %v", unused)
	}
	if len(extra) > 0 {
		t.Errorf("the code asked for what the Role does not grant: %v", extra)
	}
	for _, p := range rec.leaseNames() {
		if p != leaseName {
			t.Errorf("a Lease other than %s was read or written: %s", leaseName, p)
		}
	}
	t.Logf("requests by verb: %s", rec.summary())
}

func createAsAdmin(t *testing.T, admin kubernetes.Interface, o *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch o.GetKind() {
	case "ServiceAccount":
		var sa corev1.ServiceAccount
		convert(t, o, &sa)
		_, err = admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{})
	case "Role":
		var r rbacv1.Role
		convert(t, o, &r)
		_, err = admin.RbacV1().Roles(r.Namespace).Create(ctx, &r, metav1.CreateOptions{})
	case "RoleBinding":
		var rb rbacv1.RoleBinding
		convert(t, o, &rb)
		_, err = admin.RbacV1().RoleBindings(rb.Namespace).Create(ctx, &rb, metav1.CreateOptions{})
	default:
		t.Fatalf("createAsAdmin: %s", o.GetKind())
	}
	if err != nil {
		t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

// roleVerbs returns "verb resource" for every verb the Role grants, e.g.
// "get leases.coordination.k8s.io".
func roleVerbs(t *testing.T, o *unstructured.Unstructured) map[string]bool {
	t.Helper()
	var r rbacv1.Role
	convert(t, o, &r)
	out := map[string]bool{}
	for _, rule := range r.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					if v == "*" || res == "*" || g == "*" {
						t.Errorf("the Role grants a wildcard: %+v", rule)
					}
					out[v+" "+qualified(res, g)] = true
				}
			}
		}
	}
	return out
}

func qualified(resource, group string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

func leaseNameOf(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	args := container(t, find(t, objs, "Deployment", "-discovery")).args
	name, ok := flagValue(args, "lease-name")
	if !ok {
		t.Fatal("the discovery Deployment passes no --lease-name")
	}
	return name
}

func matDeployment(ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": "nico-machine-a-tron"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "mat", Image: "mat:test"}}},
			},
		},
	}
}

func serviceOf(svcs []corev1.Service, matID string) *corev1.Service {
	for i := range svcs {
		if svcs[i].Annotations[plan.AnnotationMatID] == matID {
			return &svcs[i]
		}
	}
	return nil
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func writeKubeconfig(t *testing.T, path, server string) {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: server}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "sa"}
	kc.CurrentContext = "proxy"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
}

// recorder is a reverse proxy to the API server that sends every request
// as the impersonated user and records its verb, resource and status.
type recorder struct {
	*httptest.Server
	mu        sync.Mutex
	used      map[string]bool
	counts    map[string]int
	forbidden []string
	leases    map[string]bool
}

func newRecorder(t *testing.T, c *kubelocal.Cluster, user string) *recorder {
	t.Helper()
	target, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{used: map[string]bool{}, counts: map[string]int{}, leases: map[string]bool{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Del("Authorization")
			for h := range pr.Out.Header {
				if strings.HasPrefix(strings.ToLower(h), "impersonate-") {
					pr.Out.Header.Del(h)
				}
			}
			pr.Out.Header.Set("Authorization", "Bearer "+c.Token)
			pr.Out.Header.Set("Impersonate-User", user)
		},
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		FlushInterval: -1, // watches stream
	}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// Recorded when the status is known: a watch sends it at once and
		// then streams until its client goes.
		sw := &statusWriter{ResponseWriter: w, onHeader: func(code int) { r.record(req, code) }}
		proxy.ServeHTTP(sw, req)
		sw.WriteHeader(http.StatusOK) // no-op when already written
	}))
	t.Cleanup(r.Close)
	return r
}

// statusWriter calls onHeader once with the response status.
type statusWriter struct {
	http.ResponseWriter
	onHeader func(code int)
	wrote    bool
}

func (s *statusWriter) WriteHeader(code int) {
	if s.wrote {
		return
	}
	s.wrote = true
	s.onHeader(code)
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// record turns a request into "verb resource[.group]" as RBAC sees it.
func (r *recorder) record(req *http.Request, code int) {
	verb, res, name, ok := requestAttributes(req)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok {
		return // discovery and other non-resource paths
	}
	key := verb + " " + res
	if code == http.StatusForbidden {
		r.forbidden = append(r.forbidden, fmt.Sprintf("%s (%s %s)", key, req.Method, req.URL.RequestURI()))
		return
	}
	r.used[key] = true
	r.counts[key]++
	if strings.HasPrefix(res, "leases.") && name != "" {
		r.leases[name] = true
	}
}

func (r *recorder) result() (map[string]bool, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.used), slices.Clone(r.forbidden)
}

func (r *recorder) leaseNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for n := range r.leases {
		out = append(out, n)
	}
	return out
}

func (r *recorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for k, n := range r.counts {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// requestAttributes parses /api/v1/... and /apis/<group>/<version>/...
// paths into RBAC's verb, resource (with group) and object name.
func requestAttributes(req *http.Request) (verb, resource, name string, ok bool) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var group string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, parts = parts[1], parts[3:]
	default:
		return "", "", "", false
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	resource = qualified(parts[0], group)
	if len(parts) > 1 {
		name = parts[1]
	}
	if len(parts) > 2 {
		resource = qualified(parts[0]+"/"+parts[2], group)
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case name != "":
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if name == "" {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource, name, true
}

// proc is one rendered container run as a process.
type proc struct {
	name     string
	cmd      *exec.Cmd
	out      *syncBuffer
	readyURL string
	liveURL  string
	stopOnce sync.Once
	waitErr  error
	waitDone chan struct{}
}

// startPod runs the Deployment's container as pod name: its args, and its
// env with secretKeyRef resolved from the rendered Secret and the pod name
// from the downward API. Two things differ from a pod, as they must on one
// machine: KUBECONFIG points at the recording proxy (in a pod, the
// ServiceAccount token), and the health port is a free one.
func startPod(t *testing.T, dep, secret *unstructured.Unstructured, name, kubeconfig string) *proc {
	t.Helper()
	c := container(t, dep)
	port, err := kubelocal.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + t.TempDir(), "KUBECONFIG=" + kubeconfig}
	secretData, _, _ := unstructured.NestedStringMap(secret.Object, "stringData")
	for _, e := range c.env {
		n := e["name"].(string)
		var v string
		switch {
		case e["value"] != nil:
			v = fmt.Sprint(e["value"])
		case e["valueFrom"] != nil:
			from := e["valueFrom"].(map[string]any)
			if ref, ok := from["secretKeyRef"].(map[string]any); ok {
				if ref["name"] != secret.GetName() {
					t.Fatalf("%s: env %s from Secret %v, not the chart's", name, n, ref["name"])
				}
				v = secretData[ref["key"].(string)]
			} else if ref, ok := from["fieldRef"].(map[string]any); ok && ref["fieldPath"] == "metadata.name" {
				v = name
			} else {
				t.Fatalf("%s: env %s: unsupported valueFrom %v", name, n, from)
			}
		}
		if n == "MATBUS_HEALTH_ADDR" {
			v = fmt.Sprintf("127.0.0.1:%d", port)
		}
		env = append(env, n+"="+v)
	}
	p := &proc{name: name, out: &syncBuffer{}, waitDone: make(chan struct{})}
	probe := func(kind string) string {
		cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
		path, _, _ := unstructured.NestedString(cs[0].(map[string]any), kind, "httpGet", "path")
		if path == "" {
			t.Fatalf("%s: no %s", dep.GetName(), kind)
		}
		return fmt.Sprintf("http://127.0.0.1:%d%s", port, path)
	}
	p.readyURL, p.liveURL = probe("readinessProbe"), probe("livenessProbe")
	p.cmd = exec.Command(matbus(t), c.args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.waitDone) }()
	return p
}

// waitReady polls the readiness probe's path, as the kubelet would.
func (p *proc) waitReady(t *testing.T, ctx context.Context) {
	t.Helper()
	hc := &http.Client{Timeout: time.Second}
	waitFor(t, ctx, p.name+" ready ("+p.readyURL+")", func() bool {
		select {
		case <-p.waitDone:
			t.Fatalf("%s exited: %v\n%s", p.name, p.waitErr, lastLines(p.out.Bytes(), 20))
		default:
		}
		for _, u := range []string{p.liveURL, p.readyURL} {
			resp, err := hc.Get(u)
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	})
}

// stop sends SIGTERM, as the kubelet does, and waits (SIGKILL after 20 s).
func (p *proc) stop() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.waitDone:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.waitDone
		}
	})
}

// syncBuffer is a goroutine-safe output buffer.
type syncBuffer = testenv.Buffer
