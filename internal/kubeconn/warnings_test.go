package kubeconn

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
)

// TestRequestVerbAndResource names requests as RBAC does.
func TestRequestVerbAndResource(t *testing.T) {
	for _, tc := range []struct {
		method, url, verb, resource string
	}{
		{"GET", "/api/v1/namespaces/ns/services/x", "get", "services"},
		{"GET", "/api/v1/namespaces/ns/services?limit=500", "list", "services"},
		{"GET", "/api/v1/namespaces/ns/services?watch=true", "watch", "services"},
		{"POST", "/api/v1/namespaces/ns/services", "create", "services"},
		{"PUT", "/api/v1/namespaces/ns/services/x", "update", "services"},
		{"PUT", "/api/v1/namespaces/ns/services/x/status", "update", "services/status"},
		{"DELETE", "/api/v1/namespaces/ns/services/x", "delete", "services"},
		{"DELETE", "/api/v1/namespaces/ns/services", "deletecollection", "services"},
		{"PATCH", "/apis/events.k8s.io/v1/namespaces/ns/events/e", "patch", "events.events.k8s.io"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "update", "leases.coordination.k8s.io"},
		{"GET", "/api/v1/namespaces/ns", "get", "namespaces"},
		{"GET", "/apis/networking.k8s.io/v1/servicecidrs", "list", "servicecidrs.networking.k8s.io"},
		{"GET", "/version", "get", "/version"},
	} {
		r, err := http.NewRequest(tc.method, "https://h"+tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v, res := RequestVerb(r), RequestResource(r.URL.Path); v != tc.verb || res != tc.resource {
			t.Errorf("%s %s: %s %s, want %s %s", tc.method, tc.url, v, res, tc.verb, tc.resource)
		}
	}
}

var binDir, binErr = kubelocal.FindBinaries()

// TestWarningsOfARealAPIServer: the API server (v1.36 and later) warns on
// every create and update of a Service with spec.externalIPs. A client
// configured by Apply with Warnings logs that warning once per verb and
// resource, counts every one, lists it in Seen, and prints nothing itself.
func TestWarningsOfARealAPIServer(t *testing.T) {
	if binErr != nil {
		if os.Getenv("MATBUS_REQUIRE_K8S") != "" {
			t.Fatalf("MATBUS_REQUIRE_K8S is set but %v", binErr)
		}
		t.Skipf("needs the API server binaries: %v (set MATBUS_REQUIRE_K8S=1 to make this a failure)", binErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, err := kubelocal.Start(ctx, kubelocal.Config{BinDir: binDir})
	if err != nil {
		t.Fatalf("kubelocal: %v", err)
	}
	defer cluster.Stop()

	var logs testenv.Buffer
	w := NewWarnings(slog.New(slog.NewTextHandler(&logs, nil)))
	cfg := rest.CopyConfig(cluster.RESTConfig())
	Apply(cfg, Config{Rate: RateFixed, QPS: 100, Burst: 100, UserAgent: "matbus/test", Warnings: w})
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svcs := kube.CoreV1().Services("default")
	svc := func(name string, ext ...string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{ExternalIPs: ext, Ports: []corev1.ServicePort{{Port: 443}}}}
	}
	for _, s := range []*corev1.Service{svc("plain"), svc("ext-a", "192.0.2.10"), svc("ext-b", "192.0.2.11")} {
		if _, err := svcs.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := svcs.Get(ctx, "ext-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Labels = map[string]string{"x": "y"}
	if _, err := svcs.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	seen := w.Seen("create", "services")
	if len(seen) != 1 || !strings.Contains(seen[0], "spec.externalIPs") {
		t.Fatalf("Seen(create, services) = %q, want the externalIPs deprecation warning", seen)
	}
	if n := testutil.ToFloat64(w.count.WithLabelValues("create", "services")); n != 2 {
		t.Errorf("creates warned: %v, want 2 (the plain Service draws none)", n)
	}
	if n := testutil.ToFloat64(w.count.WithLabelValues("update", "services")); n != 1 {
		t.Errorf("updates warned: %v, want 1", n)
	}
	lines := slices.DeleteFunc(strings.Split(strings.TrimSpace(logs.String()), "\n"), func(l string) bool { return !strings.Contains(l, "Kubernetes API warning") })
	if len(lines) != 2 || !strings.Contains(lines[0], "verb=create resource=services") || !strings.Contains(lines[1], "verb=update resource=services") {
		t.Errorf("logged %d warning lines, want one for create and one for update:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}
