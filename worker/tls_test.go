package worker_test

import (
	"net"
	"net/url"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
)

// TestTLSAsInProduction: MAT Services discovered from the API server by
// the default host mode give URLs with the Services' DNS names
// (https://<service>.<namespace>.svc.cluster.local:1266). Each simulator
// serves a certificate with DNS names only, issued by a CA made here; the
// worker's clients verify against that CA (as --mat-ca-file gives it) and
// reach the simulators through a dial hook standing in for cluster DNS.
// mat-a's certificate names mat-a's Service: its Services are created.
// mat-b's names another Service: its fetch fails on the mat.errors.fetch
// subject with Go's x509 message naming both names, as permanent, and
// nothing is created for it.
func TestTLSAsInProduction(t *testing.T) {
	e := newEnv(t)
	ca := testenv.NewCA(t, "cluster CA "+e.ns)
	nameA := discovery.ServiceDNSName("mat-a-bmc-mock", e.ns, "")
	nameB := discovery.ServiceDNSName("mat-b-bmc-mock", e.ns, "")
	wrong := discovery.ServiceDNSName("mat-z-bmc-mock", e.ns, "")
	certA, certB := ca.Issue(nameA), ca.Issue(wrong)
	fleetA := generatedFleet(t, "10.96.130.0/24", 21)
	simA := e.startSim(matsim.Options{Fleet: fleetA, TLSCertificate: &certA})
	simB := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.131.0/24", 22), TLSCertificate: &certB})

	// The MAT API Services, headless (no cluster IP to collide with a BMC
	// IP); no URL annotation: discovery computes the URL.
	for _, name := range []string{"mat-a-bmc-mock", "mat-b-bmc-mock"} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia-infra-controller/mat-service": "true"}},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "bmc-mock", Port: 1266}}},
		}
		if _, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := discovery.NewKube(e.kube, discovery.KubeConfig{Namespace: e.ns}, e.log, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.startPublisher(src)

	urlA, urlB := "https://"+nameA+":1266", "https://"+nameB+":1266"
	roots, err := matclient.LoadRootCAs(ca.WriteFile())
	if err != nil {
		t.Fatal(err)
	}
	dial := testenv.DialRoutes(map[string]string{
		nameA + ":1266": hostOf(t, simA.URL()),
		nameB + ":1266": hostOf(t, simB.URL()),
	})
	w := e.startWorker(workerOpts{Mat: matclient.Config{RootCAs: roots, DialContext: dial}})

	// Verified: mat-a's Services, and its client is for the DNS URL.
	e.waitServices(append(wantServiceNames(fleetA), "mat-a-bmc-mock", "mat-b-bmc-mock")...)
	if len(w.clients.For(urlA)) != 1 {
		t.Errorf("clients for %s: %d, want 1 (discovered URLs: a client per URL)", urlA, len(w.clients.For(urlA)))
	}

	// Refused: one fetch event for mat-b, naming both names.
	var ev events.Error
	waitFor(t, "a fetch error event for mat-b", func() (bool, string) {
		for _, x := range e.errs.Of(errKind("fetch")) {
			if x.Instance == e.key("mat-b-bmc-mock") {
				ev = x
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	want := "x509: certificate is valid for " + wrong + ", not " + nameB
	if ev.URL != urlB || !ev.Permanent || !strings.Contains(ev.Message, want) || !strings.Contains(ev.Message, "no Service changed") {
		t.Errorf("fetch event = %+v\nwant url %s, permanent, a message containing %q", ev, urlB, want)
	}
	for _, x := range e.errs.Of(errKind("fetch")) {
		if x.Instance == e.key("mat-a-bmc-mock") {
			t.Errorf("fetch event for the verified instance: %+v", x)
		}
	}
	// More syncs: still only mat-a's Services.
	waitSyncs(t, w, 4)
	e.waitServices(append(wantServiceNames(fleetA), "mat-a-bmc-mock", "mat-b-bmc-mock")...)
	if simB.Requests() != 0 {
		t.Errorf("mat-b's simulator answered %d requests: a refused handshake sends none", simB.Requests())
	}
}

// hostOf returns the host:port of a URL.
func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		t.Fatal(err)
	}
	return u.Host
}
