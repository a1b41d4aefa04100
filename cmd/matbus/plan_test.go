package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/operator"
	"github.com/matbus/matbus/plan"
)

// planGolden are the old controller's fixture run (plan/testdata/old-controller):
// discovered Service, pod-name label and Deployment, status fixture.
var planGolden = []struct{ service, pod, fixture string }{
	{"mat-0-bmc-mock", "mat-0", "../../matclient/testdata/v2-mixed.json"},
	{"mat-1-bmc-mock", "mat-1", "../../matclient/testdata/legacy-small.json"},
	{"mat-2-bmc-mock", "mat-2", "../../matclient/testdata/long-ids.json"},
}

const planNS = "golden"

// countingTransport counts the requests of a client by method.
type countingTransport struct {
	mu   sync.Mutex
	n    map[string]int
	next http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.Method]++
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

func (c *countingTransport) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// planNamespace starts an API server (service range 10.96.0.0/12, as in
// the old controller's run), creates namespace golden with the MAT
// Deployments and the old controller's own Services of services.json
// (owner UIDs of the Deployments), and starts matsim on the three
// fixtures. It returns the admin client, the kubeconfig and the static
// entries (with pod names and owners).
func planNamespace(t *testing.T) (kubernetes.Interface, *kubelocal.Cluster, []discovery.StaticEntry, map[string]*corev1.Service) {
	t.Helper()
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := kubelocal.Start(ctx, kubelocal.Config{ServiceCIDR: "10.96.0.0/12"})
	if err != nil {
		t.Fatalf("kubelocal: %v", err)
	}
	t.Cleanup(c.Stop)
	kube, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: planNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	uid := map[string]types.UID{}
	for _, g := range planGolden {
		labels := map[string]string{"app.kubernetes.io/name": "nico-machine-a-tron", plan.PodNameLabel: g.pod}
		d, err := kube.AppsV1().Deployments(planNS).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: g.pod},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mat", Image: "machine-a-tron:test"}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uid[g.pod] = d.UID
	}
	body, err := os.ReadFile("../../plan/testdata/old-controller/services.json")
	if err != nil {
		t.Fatal(err)
	}
	var list corev1.ServiceList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	old := map[string]*corev1.Service{}
	for i := range list.Items {
		s := list.Items[i].DeepCopy()
		s.Namespace = planNS
		for j := range s.OwnerReferences {
			s.OwnerReferences[j].UID = uid[s.OwnerReferences[j].Name]
		}
		got, err := kube.CoreV1().Services(planNS).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create the old controller's %s: %v", s.Name, err)
		}
		old[got.Name] = got
	}
	var entries []discovery.StaticEntry
	for _, g := range planGolden {
		sim, err := matsim.New(matsim.Options{FixturePath: g.fixture})
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithCancel(context.Background())
		url, err := sim.Start(sctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { scancel(); _ = sim.Close() })
		entries = append(entries, discovery.StaticEntry{Namespace: planNS, Name: g.service, URL: url, PodName: g.pod, Owner: g.pod})
	}
	return kube, c, entries, old
}

func writeStaticFile(t *testing.T, entries []discovery.StaticEntry) string {
	t.Helper()
	b, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "instances.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// liveState is every Service's and Deployment's name and resourceVersion.
func liveState(t *testing.T, kube kubernetes.Interface) map[string]string {
	t.Helper()
	out := map[string]string{}
	svcs, err := kube.CoreV1().Services(planNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		out["svc/"+s.Name] = s.ResourceVersion
	}
	ds, err := kube.AppsV1().Deployments(planNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds.Items {
		out["deploy/"+d.Name] = d.ResourceVersion
	}
	return out
}

func names[T any](xs []T, name func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = name(x)
	}
	return out
}

// TestPlanTakeover runs `matbus plan` against a namespace holding the old
// controller's own Services (services.json) and matsim serving the three
// fixtures, with static instances carrying pod names and owners.
func TestPlanTakeover(t *testing.T) {
	kube, c, entries, old := planNamespace(t)
	static := writeStaticFile(t, entries)
	args := func(file string, extra ...string) []string {
		return append([]string{"plan", "--kubeconfig", c.Kubeconfig, "--namespace", planNS, "--static-file", file,
			"--leader-elect=false", "--log-level", "error", "--timeout", "1m"}, extra...)
	}
	planJSON := func(file string) (int, operator.Report) {
		t.Helper()
		code, out, errOut := runArgs(t, nil, args(file, "-o", "json")...)
		var r operator.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("plan -o json: exit %d, not JSON: %v\n%s%s", code, err, out, errOut)
		}
		return code, r
	}

	before := liveState(t, kube)
	code, text, errOut := runArgs(t, nil, args(static)...)
	t.Logf("matbus plan: exit %d\n%s%s", code, text, errOut)
	jcode, r := planJSON(static)
	if after := liveState(t, kube); !maps.Equal(before, after) {
		t.Errorf("plan wrote: resourceVersions before %v, after %v", before, after)
	}
	if code != 2 || jcode != 2 {
		t.Errorf("exit %d (text), %d (json); want 2: something would change", code, jcode)
	}
	if len(r.Instances) != 3 || r.Errors != 0 {
		t.Fatalf("report: %d instances, %d errors; want 3, 0: %+v", len(r.Instances), r.Errors, r)
	}

	// Every old Service with a BMC IP is adopted: the additions only, or
	// (v2-mixed, which advertises SSH) an update adding the ssh port the
	// newer controller writes. The old Services of devices without a BMC
	// IP are left alone; nothing is recreated or deleted.
	adopted := map[string]bool{}
	for _, ip := range r.Instances {
		if len(ip.Recreate)+len(ip.Delete)+len(ip.Skipped) > 0 {
			t.Errorf("%s: recreates %v, deletes %v, skipped %v; want none", ip.Key, ip.Recreate, ip.Delete, ip.Skipped)
		}
		for _, a := range ip.Adopt {
			adopted[a.Name] = true
			if old[a.Name] == nil {
				t.Errorf("%s: adoption of %s, not an old controller's Service", ip.Key, a.Name)
			}
			keys := names(a.Fields, func(f operator.FieldChange) string { return f.Field + " " + f.Key })
			slices.Sort(keys)
			want := []string{"annotation matbus.io/mat-id", "label matbus.io/instance", "label matbus.io/machine-type", "label matbus.io/pod-name"}
			if !slices.Equal(keys, want) {
				t.Errorf("adoption %s changes %v, want exactly %v", a.Name, keys, want)
			}
		}
		for _, u := range ip.Update {
			if ip.Key != planNS+".mat-0-bmc-mock" || !u.Adopt || old[u.Name] == nil {
				t.Errorf("%s: update of %s (adopt %v): only v2-mixed's old Services get updates", ip.Key, u.Name, u.Adopt)
			}
			adopted[u.Name] = true
			var other []string
			sshPort := false
			for _, f := range u.Fields {
				switch {
				case f.Field == "port" && f.Key == plan.PortSSH && f.Op == "add":
					sshPort = true
				case f.Field == "annotation" && f.Key == plan.AnnotationSSHPort && f.Op == "add":
				case f.Op == "add" && (f.Key == plan.LabelInstance || f.Key == plan.LabelDeviceKind || f.Key == plan.LabelPodName || f.Key == plan.AnnotationMatID):
				default:
					other = append(other, fmt.Sprintf("%+v", f))
				}
			}
			if !sshPort || len(other) > 0 {
				t.Errorf("update %s: ssh port added %v, other changes %v; want the ssh port and its annotation (plus the additions)", u.Name, sshPort, other)
			}
		}
	}
	for name, o := range old {
		if hasIP := o.Annotations[plan.AnnotationBMCIP] != ""; hasIP != adopted[name] {
			t.Errorf("old %s: BMC IP %v, adopted %v; want every old Service with a BMC IP adopted, the others left alone", name, hasIP, adopted[name])
		}
	}
	// Exactly what else it lists, per instance: the creates are the Services
	// the old controller could not create (v2-mixed's NVOS Service, which it
	// did not know; legacy-small's BMCs at 192.0.2.x, outside its service
	// range; long-ids' ids that are no DNS label or label value); the updates
	// are v2-mixed's old Services whose devices advertise SSH (port and
	// annotation added beside the additions); the held devices are those
	// without a BMC IP, whose old Services stay as they are.
	type want struct {
		create, update, held []string
		adopt                int
	}
	wants := map[string]want{
		planNS + ".mat-0-bmc-mock": {
			create: []string{"mat-nvos-1a530254-57f-964ececc"},
			update: []string{"mat-bmc-dpu-2458e540-24e-879b716a", "mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50", "mat-bmc-dpu-a15919aa-572-726d4120",
				"mat-bmc-host-7ec7b7c3-126-c030b365", "mat-bmc-host-922f3d9b-20b-4da64654"},
			held:  []string{"mat-bmc-dpu-923c3a06-0b0-51bc17a6", "mat-bmc-host-d171a368-ea6-3f95c484"},
			adopt: 3,
		},
		planNS + ".mat-1-bmc-mock": {
			create: []string{"mat-bmc-dpu-329f1e51-a2e-1fb092ab", "mat-bmc-dpu-54592217-231-ba83b786", "mat-bmc-dpu-e87c7e19-87d-4670620d",
				"mat-bmc-host-9f48758c-53a-7a9f7464"},
			held: []string{"mat-bmc-host-db3205fc-c11-78bfbe2f"},
		},
		planNS + ".mat-2-bmc-mock": {
			create: []string{"mat-bmc-host-3f2b6c1e-8a4-f3c62d8062c59e54", "mat-bmc-host-h-te-mla-t-0-3231bca52db6a810", "mat-bmc-host-mat-switch-r-11524c59",
				"mat-bmc-host-node-7-cfa945d5fb439053", "mat-bmc-host-rack1-host-0-5566d572156e82b9", "mat-bmc-host-trailing-fe043b6eee4442a8"},
			adopt: 6,
		},
	}
	for _, ip := range r.Instances {
		w := wants[ip.Key]
		got := want{
			create: names(ip.Create, func(c operator.Created) string { return c.Name }),
			update: names(ip.Update, func(c operator.Changed) string { return c.Name }),
			held:   names(ip.Held, func(h operator.Held) string { return h.Name }),
			adopt:  len(ip.Adopt),
		}
		if !slices.Equal(got.create, w.create) || !slices.Equal(got.update, w.update) || !slices.Equal(got.held, w.held) || got.adopt != w.adopt {
			t.Errorf("%s lists %+v, want %+v", ip.Key, got, w)
		}
		for _, cr := range ip.Create {
			if old[cr.Name] != nil {
				t.Errorf("create of %s, which exists", cr.Name)
			}
		}
	}
	if r.Changes != 16 || r.Adoptions != 9 {
		t.Errorf("%d changes, %d adoptions; want 16 (11 creates, 5 updates), 9", r.Changes, r.Adoptions)
	}
	if !strings.Contains(text, "adopt     ") || !strings.Contains(text, "create    ") || !strings.Contains(text, "+ port ssh") {
		t.Errorf("text output lacks adopt/create/ssh port lines:\n%s", text)
	}

	// A failing instance: exit 1, the error named, the others still planned.
	t.Run("failing instance", func(t *testing.T) {
		bad := append(slices.Clone(entries), discovery.StaticEntry{Namespace: planNS, Name: "mat-9-bmc-mock", URL: "http://127.0.0.1:1", PodName: "mat-9", Owner: "mat-9"})
		file := writeStaticFile(t, bad)
		code, out, errOut := runArgs(t, nil, args(file)...)
		t.Logf("exit %d\n%s%s", code, out, errOut)
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if !strings.Contains(out, "instance golden.mat-9-bmc-mock") || !strings.Contains(out, "status fetch failed") || !strings.Contains(out, "127.0.0.1:1") {
			t.Errorf("the failing instance is not named with its error:\n%s", out)
		}
		jcode, jr := planJSON(file)
		if jcode != 1 || jr.Errors != 1 || len(jr.Instances) != 4 {
			t.Fatalf("json: exit %d, %d errors, %d instances; want 1, 1, 4", jcode, jr.Errors, len(jr.Instances))
		}
		for _, ip := range jr.Instances {
			if ip.Key == planNS+".mat-9-bmc-mock" {
				if !strings.Contains(ip.Error, "127.0.0.1:1") {
					t.Errorf("error %q does not name the URL", ip.Error)
				}
				continue
			}
			if ip.Error != "" || ip.Changes()+len(ip.Adopt) == 0 {
				t.Errorf("%s not planned beside the failing instance: %+v", ip.Key, ip)
			}
		}
	})

	// Apply the plan as a worker would (operator.Plan with a client that
	// counts its requests: reads only), then plan again: no change.
	t.Run("applied then no change", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// legacy-small's BMC IPs (192.0.2.x) lie outside 10.96.0.0/12, so the
		// API server refuses their creates (as it did the old controller's):
		// a second service range takes them.
		if _, err := kube.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "bmc-test"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"192.0.2.0/24"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cfg := rest.CopyConfig(c.RESTConfig())
		ct := &countingTransport{n: map[string]int{}}
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { ct.next = rt; return ct }
		ro, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		insts := make([]events.Instance, len(entries))
		for i, e := range entries {
			insts[i] = events.Instance{Key: e.Namespace + "." + e.Name, URL: e.URL, PodName: e.PodName, Owner: e.Owner}
		}
		k, v, _ := strings.Cut(plan.DefaultTargetSelector, "=")
		opts := plan.Options{Namespace: planNS, TargetSelector: map[string]string{k: v}, StateAnnotations: true}
		rep, err := operator.Plan(ctx, operator.PlanConfig{Kube: ro, Options: opts,
			NewClient: func(url string) (operator.StatusClient, error) { return matclient.New(url, matclient.Config{}) }}, insts)
		if err != nil {
			t.Fatal(err)
		}
		if got := ct.counts(); len(got) != 1 || got["GET"] == 0 {
			t.Errorf("operator.Plan requests by method %v, want GET only", got)
		}
		if rep.Changes != r.Changes || rep.Adoptions != r.Adoptions {
			t.Errorf("operator.Plan: %d changes, %d adoptions; matbus plan said %d, %d", rep.Changes, rep.Adoptions, r.Changes, r.Adoptions)
		}
		svcs := kube.CoreV1().Services(planNS)
		for _, ip := range rep.Instances {
			p := ip.Plan
			for _, s := range p.Create {
				// Retried until the API server's allocator has the new range.
				deadline := time.Now().Add(30 * time.Second)
				for {
					_, err := svcs.Create(ctx, s, metav1.CreateOptions{})
					if err == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("create %s: %v", s.Name, err)
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
			for _, u := range p.Update {
				if _, err := svcs.Update(ctx, u.New, metav1.UpdateOptions{}); err != nil {
					t.Fatalf("update %s: %v", u.New.Name, err)
				}
			}
			for _, u := range p.Recreate {
				if err := svcs.Delete(ctx, u.Old.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &u.Old.UID}}); err != nil {
					t.Fatalf("recreate %s: delete: %v", u.Old.Name, err)
				}
				if _, err := svcs.Create(ctx, u.New, metav1.CreateOptions{}); err != nil {
					t.Fatalf("recreate %s: create: %v", u.New.Name, err)
				}
			}
			for _, s := range p.Delete {
				if err := svcs.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}}); err != nil {
					t.Fatalf("delete %s: %v", s.Name, err)
				}
			}
		}
		before := liveState(t, kube)
		code, out, errOut := runArgs(t, nil, args(static)...)
		t.Logf("after applying: exit %d\n%s%s", code, out, errOut)
		if code != 0 || !strings.Contains(out, "\nno change") {
			t.Errorf("exit %d, want 0 and \"no change\"", code)
		}
		if after := liveState(t, kube); !maps.Equal(before, after) {
			t.Errorf("plan wrote: resourceVersions before %v, after %v", before, after)
		}
	})
}

// TestPlanChecksFlagsFirst: plan reads --static and --static-file before it
// contacts anything, so a bad one gives check's message (exit 1, plan's
// status for invalid flags; check's is 2), not an unreachable API server.
func TestPlanChecksFlagsFirst(t *testing.T) {
	kc := deadKubeconfig(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad --static", []string{"--static", "mat-0"}, `static instance "mat-0": want [namespace/]name=url`},
		{"--static in another namespace", []string{"--static", "other/mat-0=https://x:1"}, `static instance other/mat-0 is not in --namespace "x"`},
		{"missing --static-file", []string{"--static-file", "/nonexistent/instances.yaml"}, "--static-file /nonexistent/instances.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range []struct {
				name string
				code int
			}{{"check", 2}, {"plan", 1}} {
				if cmd.name == "check" && strings.HasPrefix(tc.args[0], "--static-file") {
					cmd.code = 1 // an unreadable file is not a usage error
				}
				args := append([]string{cmd.name, "--kubeconfig", kc, "--namespace", "x", "--leader-elect=false", "--timeout", "20s"}, tc.args...)
				start := time.Now()
				code, out, errOut := runArgs(t, nil, args...)
				if code != cmd.code || !strings.Contains(errOut, tc.want) || strings.Contains(out+errOut, "127.0.0.1:1") || time.Since(start) > 3*time.Second {
					t.Errorf("%s: exit %d after %v, want %d and %q at once, nothing contacted\n%s%s", cmd.name, code, time.Since(start).Round(time.Millisecond), cmd.code, tc.want, out, errOut)
				}
			}
		})
	}
}
