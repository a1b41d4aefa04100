package main

import (
	"cmp"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
)

// checkCluster starts a kube-apiserver with service range 10.96.0.0/16
// and extra flags, stopped when the test ends. Without binaries it skips
// (fails with MATBUS_REQUIRE_K8S set).
func checkCluster(t *testing.T, args ...string) *kubelocal.Cluster {
	t.Helper()
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := kubelocal.Start(ctx, kubelocal.Config{ServiceCIDR: "10.96.0.0/16", APIServerArgs: args})
	if err != nil {
		t.Fatalf("kubelocal: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// deadKubeconfig writes a kubeconfig whose API server is not there
// (https://127.0.0.1:1) and returns its path.
func deadKubeconfig(t *testing.T) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

// checkRow returns the result column of the row named name, "" if absent.
func checkRowResult(out, name string) (result, line string) {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name+"  ") {
			f := strings.Fields(strings.TrimPrefix(l, name))
			if len(f) > 0 {
				return f[0], l
			}
		}
	}
	return "", ""
}

// TestCheck runs `matbus check` against real API servers started with and
// without the DenyServiceExternalIPs admission plugin, a real NATS with
// JetStream and a simulated MAT whose BMC IPs (192.168.50.0/24) and NVOS
// IPs (10.98.50.x) lie outside the service range 10.96.0.0/16.
func TestCheck(t *testing.T) {
	open := checkCluster(t)
	deny := checkCluster(t, "--enable-admission-plugins=DenyServiceExternalIPs")
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 1, PowerShelves: 1, BMCSubnet: "192.168.50.0/24", Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := matsim.New(matsim.Options{Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, err := sim.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })

	check := func(c *kubelocal.Cluster, natsURL, mode, namespace string) (int, string) {
		t.Helper()
		code, out, errOut := runArgs(t, nil, "check", "--kubeconfig", c.Kubeconfig, "--nats-url", natsURL,
			"--namespace", namespace, "--static", "mat-a="+url, "--leader-elect=false", "--bmc-ip-mode", mode,
			"--log-level", "error", "--timeout", "1m")
		t.Logf("check %s %s: exit %d\n%s%s", c.URL, mode, code, out, errOut)
		return code, out
	}
	type want struct{ row, result, contains string }
	tests := []struct {
		name     string
		cluster  *kubelocal.Cluster
		nats     string
		mode     string
		wantCode int
		rows     []want
		ns       string // "" is default
	}{
		{"external-ip, externalIPs admitted", open, ns.ClientURL(), "external-ip", 0, []want{
			{"NATS", "ok", "JetStream"},
			{"Kubernetes API", "ok", ""},
			{"namespace", "ok", "default exists"},
			{"RBAC worker", "ok", ""},
			{"RBAC Kubernetes Events", "ok", "every call allowed"},
			{"service range", "ok", "10.96.0.0/16"},
			{"MAT status default.mat-a", "ok", "6 BMC and 1 NVOS Services"},
			{"IPs vs service range (external-ip)", "ok", "all 7 IPs outside"},
			{"externalIPs admitted", "ok", ""},
			// The API server of the tests (v1.37) deprecates the field.
			{"externalIPs deprecation", "warn", "spec.externalIPs is deprecated"},
		}, ""},
		{"external-ip, DenyServiceExternalIPs", deny, ns.ClientURL(), "external-ip", 1, []want{
			{"IPs vs service range (external-ip)", "ok", ""},
			{"externalIPs admitted", "FAIL", "DenyServiceExternalIPs"},
		}, ""},
		{"cluster-ip, IPs outside the range, DenyServiceExternalIPs", deny, ns.ClientURL(), "cluster-ip", 1, []want{
			{"IPs vs service range (cluster-ip)", "FAIL", "7 of 7 IPs outside"},
			{"IPs vs service range (cluster-ip)", "FAIL", "create a ServiceCIDR"},
			{"externalIPs admitted", "warn", "not needed in cluster-ip mode"},
		}, ""},
		{"NATS unreachable", open, "nats://127.0.0.1:1", "external-ip", 1, []want{
			{"NATS", "FAIL", "127.0.0.1:1"},
			{"externalIPs admitted", "ok", ""},
		}, ""},
		// The create of a Service in a namespace that does not exist is
		// refused; that is not the admission plugin's doing.
		{"namespace missing", open, ns.ClientURL(), "external-ip", 1, []want{
			{"namespace", "FAIL", "kubectl create namespace ghost"},
			{"externalIPs admitted", "warn", `namespace "ghost" does not exist`},
		}, "ghost"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := check(tc.cluster, tc.nats, tc.mode, cmp.Or(tc.ns, "default"))
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d", code, tc.wantCode)
			}
			for _, w := range tc.rows {
				got, line := checkRowResult(out, w.row)
				if got != w.result || !strings.Contains(line, w.contains) {
					t.Errorf("row %q = %q, want %s containing %q", w.row, line, w.result, w.contains)
				}
			}
		})
	}
}

// TestCheckRBAC: as a user that may only read Services, `matbus check`
// names every call the worker cannot make (and the Kubernetes Events'
// create and patch, unless --kube-events=false), and does not take the
// refused dry-run create for an admission refusal.
func TestCheckRBAC(t *testing.T) {
	c := checkCluster(t)
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	const user = "reader"
	if _, err := admin.RbacV1().Roles("default").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The admin's kubeconfig, impersonating the reader.
	kc, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range kc.AuthInfos {
		a.Impersonate = user
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runArgs(t, nil, "check", "--kubeconfig", path, "--nats-url", ns.ClientURL(), "--namespace", "default",
		"--static", "mat-a=http://127.0.0.1:1", "--leader-elect=true", "--bmc-ip-mode", "external-ip", "--log-level", "error", "--timeout", "1m")
	t.Logf("exit %d\n%s%s", code, out, errOut)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, w := range []struct{ row, result, contains string }{
		{"RBAC worker", "FAIL", "create services, update services, delete services, get deployments.apps"},
		{"RBAC discovery", "FAIL", "create leases.coordination.k8s.io, get leases.coordination.k8s.io/matbus-discovery"},
		{"RBAC Kubernetes Events", "FAIL", "create events.events.k8s.io, patch events.events.k8s.io"},
		{"MAT status default.mat-a", "FAIL", "127.0.0.1:1"},
		{"externalIPs admitted", "warn", "cannot tell"},
		{"namespace", "warn", "could not verify that default exists"},
	} {
		got, line := checkRowResult(out, w.row)
		if got != w.result || !strings.Contains(line, w.contains) {
			t.Errorf("row %q = %q, want %s containing %q", w.row, line, w.result, w.contains)
		}
	}
	if got, line := checkRowResult(out, "RBAC worker"); got == "FAIL" && strings.Contains(line, "list services") {
		t.Errorf("a granted verb reported denied: %s", line)
	}

	// Without Kubernetes Events their RBAC is not checked.
	code, out, errOut = runArgs(t, nil, "check", "--kubeconfig", path, "--nats-url", ns.ClientURL(), "--namespace", "default",
		"--static", "mat-a=http://127.0.0.1:1", "--leader-elect=true", "--kube-events=false", "--log-level", "error", "--timeout", "1m")
	if got, line := checkRowResult(out, "RBAC Kubernetes Events"); code != 1 || got != "" {
		t.Errorf("--kube-events=false: exit %d, row %q, want no such row\n%s%s", code, line, out, errOut)
	}
	if got, _ := checkRowResult(out, "RBAC worker"); got != "FAIL" {
		t.Errorf("--kube-events=false: RBAC worker %q, want FAIL\n%s", got, out)
	}
}

// TestCheckStreamReplicas: --stream-replicas above 1 against a single NATS
// server is reported as a failure naming the cause; 1 adds no row.
func TestCheckStreamReplicas(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	// An API server that is not there: the Kubernetes rows fail, the NATS
	// rows are what this test reads.
	kc := deadKubeconfig(t)
	row := func(replicas string) string {
		t.Helper()
		code, out, errOut := runArgs(t, nil, "check", "--kubeconfig", kc, "--nats-url", ns.ClientURL(), "--namespace", "default",
			"--static", "mat-a=http://127.0.0.1:1", "--leader-elect=false", "--stream-replicas", replicas,
			"--log-level", "error", "--timeout", "20s")
		if code != 1 {
			t.Fatalf("check --stream-replicas %s: exit %d, want 1 (no API server)\n%s%s", replicas, code, out, errOut)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "stream replicas") {
				return l
			}
		}
		return ""
	}
	if l := row("3"); !strings.Contains(l, "FAIL") || !strings.Contains(l, "needs a JetStream cluster") || !strings.Contains(l, "single server") {
		t.Errorf("--stream-replicas 3 on one server: row %q, want FAIL naming the missing cluster", l)
	}
	if l := row("1"); l != "" {
		t.Errorf("--stream-replicas 1: row %q, want none", l)
	}
}
