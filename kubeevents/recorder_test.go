package kubeevents_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/kubelocal"
)

var (
	binDir, binErr = kubelocal.FindBinaries()
	clusterOnce    sync.Once
	cluster        *kubelocal.Cluster
	clusterErr     error
)

func TestMain(m *testing.M) {
	if binErr != nil && os.Getenv("MATBUS_REQUIRE_K8S") != "" {
		fmt.Fprintf(os.Stderr, "kubeevents tests: MATBUS_REQUIRE_K8S is set but %v\n", binErr)
		os.Exit(1)
	}
	code := m.Run()
	if cluster != nil {
		cluster.Stop()
	}
	os.Exit(code)
}

// apiServer returns a client of the package's real API server and a fresh
// namespace, deleted when t ends.
func apiServer(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	if binErr != nil {
		t.Skipf("needs the API server binaries: %v (set MATBUS_REQUIRE_K8S=1 to make this a failure)", binErr)
	}
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, clusterErr = kubelocal.Start(ctx, kubelocal.Config{BinDir: binDir})
	})
	if clusterErr != nil {
		t.Fatalf("kubelocal: %v", clusterErr)
	}
	cfg := rest.CopyConfig(cluster.RESTConfig())
	cfg.QPS, cfg.Burst = 200, 400
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Namespace("kev", t.Name())
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	return kube, ns
}

// matService creates a Service named name in ns, as discovery would find it.
func matService(t *testing.T, kube kubernetes.Interface, ns, name string) *corev1.Service {
	t.Helper()
	svc, err := kube.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"nvidia-infra-controller/mat-service": "true"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// eventsOf lists the events.k8s.io/v1 Events of ns; with regarding set,
// only those whose regarding.name is it (as `kubectl events --for` asks).
func eventsOf(t *testing.T, kube kubernetes.Interface, ns, regarding string) []eventsv1.Event {
	t.Helper()
	opts := metav1.ListOptions{}
	if regarding != "" {
		opts.FieldSelector = "regarding.name=" + regarding
	}
	l, err := kube.EventsV1().Events(ns).List(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitFor polls cond every 100 ms for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func start(t *testing.T, kube kubernetes.Interface, cfg kubeevents.Config) *kubeevents.Recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if cfg.Controller == "" {
		cfg.Controller = kubeevents.ControllerWorker
	}
	r, err := kubeevents.Start(ctx, kube, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestInstanceEventOnMATService: an instance's Event regards its MAT
// Service (namespace and name from the key, and the Service's UID, which
// `kubectl describe svc` matches on), with the reason's type and action,
// the reporting controller, and the note redacted and cut to what the API
// server accepts. An instance without a MAT Service (a static one) gets none.
func TestInstanceEventOnMATService(t *testing.T) {
	kube, ns := apiServer(t)
	svc := matService(t, kube, ns, "mat-0-bmc-mock")
	log := slog.New(redact.NewHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), redact.New([]string{"tok-5ecr3t"})))
	r := start(t, kube, kubeevents.Config{Log: log})

	r.Instance(ns+".mat-static", kubeevents.FetchFailed, "static instances have no MAT Service")
	long := `status fetch failed: Get "https://user:pw@mat-0:1266/machines/status" with Bearer tok-5ecr3t: ` + strings.Repeat("é", 800)
	r.Instance(ns+".mat-0-bmc-mock", kubeevents.FetchFailed, long)

	var got []eventsv1.Event
	waitFor(t, "the FetchFailed Event of the MAT Service", func() bool {
		got = eventsOf(t, kube, ns, svc.Name)
		return len(got) > 0
	})
	if len(got) != 1 {
		t.Fatalf("want 1 Event regarding %s, got %d", svc.Name, len(got))
	}
	ev := got[0]
	if ev.Reason != "FetchFailed" || ev.Type != corev1.EventTypeWarning || ev.Action != "Fetch" {
		t.Errorf("reason/type/action = %s/%s/%s, want FetchFailed/Warning/Fetch", ev.Reason, ev.Type, ev.Action)
	}
	if ev.Regarding.Kind != "Service" || ev.Regarding.Namespace != ns || ev.Regarding.Name != svc.Name || ev.Regarding.UID != svc.UID {
		t.Errorf("regarding %+v, want Service %s/%s uid %s", ev.Regarding, ns, svc.Name, svc.UID)
	}
	if ev.ReportingController != kubeevents.ControllerWorker || !strings.HasPrefix(ev.ReportingInstance, kubeevents.ControllerWorker+"-") {
		t.Errorf("reporting %s / %s, want %s and <controller>-<host>", ev.ReportingController, ev.ReportingInstance, kubeevents.ControllerWorker)
	}
	for _, secret := range []string{"pw@", "user:", "tok-5ecr3t"} {
		if strings.Contains(ev.Note, secret) {
			t.Errorf("the note shows %q: %s", secret, ev.Note[:200])
		}
	}
	if !strings.HasPrefix(ev.Note, `status fetch failed: Get "https://***@mat-0:1266/machines/status" with Bearer [redacted]: é`) {
		t.Errorf("note %q…: want the redacted message", ev.Note[:120])
	}
	if len(ev.Note) > kubeevents.MaxNote || !strings.HasSuffix(ev.Note, "é…") {
		t.Errorf("note of %d bytes ending %q: want at most %d, cut on a rune with …", len(ev.Note), ev.Note[len(ev.Note)-8:], kubeevents.MaxNote)
	}

	// The static instance's occurrence came first; its lookup is done by
	// now, so an Event of it would be listed.
	waitFor(t, "the Recorder to know mat-static is missing", func() bool {
		rec, _ := r.Stats()
		return rec[kubeevents.FetchFailed] == 2
	})
	if all := eventsOf(t, kube, ns, ""); len(all) != 1 {
		t.Errorf("want only the MAT Service's Event, got %d: %+v", len(all), all)
	}
}

// TestServiceEvents: an Event of an existing BMC Service regards it; one of
// a Service that does not exist (a refused create) regards the instance's
// MAT Service and names the Service.
func TestServiceEvents(t *testing.T) {
	kube, ns := apiServer(t)
	mat := matService(t, kube, ns, "mat-1-bmc-mock")
	bmc, err := kube.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "mat-bmc-host-a", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "redfish", Port: 443}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, kube, kubeevents.Config{})
	r.Service(bmc, ns+".mat-1-bmc-mock", kubeevents.Recreated, "cluster IP a -> b")
	want := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mat-bmc-host-b", Namespace: ns}}
	r.Service(want, ns+".mat-1-bmc-mock", kubeevents.CreateRefused, "forbidden")

	waitFor(t, "both Events", func() bool {
		return len(eventsOf(t, kube, ns, bmc.Name)) == 1 && len(eventsOf(t, kube, ns, mat.Name)) == 1
	})
	ev := eventsOf(t, kube, ns, bmc.Name)[0]
	if ev.Reason != "Recreated" || ev.Type != corev1.EventTypeNormal || ev.Regarding.UID != bmc.UID {
		t.Errorf("BMC Service Event %s/%s regarding uid %s, want Recreated/Normal on uid %s", ev.Reason, ev.Type, ev.Regarding.UID, bmc.UID)
	}
	ev = eventsOf(t, kube, ns, mat.Name)[0]
	if ev.Reason != "CreateRefused" || ev.Regarding.UID != mat.UID || ev.Note != "Service "+ns+"/mat-bmc-host-b: forbidden" {
		t.Errorf("refused create: %s on uid %s with note %q, want CreateRefused on the MAT Service (uid %s) naming the Service",
			ev.Reason, ev.Regarding.UID, ev.Note, mat.UID)
	}
}

// TestStormIsBounded drives the Recorder with an hour of failures of 20
// instances, one fetch failure per instance and second (the spam filter's
// clock is injected and moves one second per round; the broadcaster's
// series run on real time, here a few seconds): the spam filter passes the
// burst plus one per refill period per instance and reason, and the
// broadcaster's aggregation makes one Event object per instance and reason
// of the lot.
func TestStormIsBounded(t *testing.T) {
	kube, ns := apiServer(t)
	const instances, seconds = 20, 3600
	uids := map[string]bool{}
	for i := range instances {
		uids[string(matService(t, kube, ns, fmt.Sprintf("mat-%d-bmc-mock", i)).UID)] = true
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakePassiveClock(t0)
	r := start(t, kube, kubeevents.Config{Clock: clk})
	for s := range seconds {
		clk.SetTime(t0.Add(time.Duration(s) * time.Second))
		for i := range instances {
			key := fmt.Sprintf("%s.mat-%d-bmc-mock", ns, i)
			r.Instance(key, kubeevents.FetchFailed, fmt.Sprintf("status fetch failed, no Service changed: HTTP 500 after %d ms", s%997))
			if s == 3 {
				r.Instance(key, kubeevents.OutOfRotation, "instance taken out of rotation after 3 consecutive failed status fetches")
			}
		}
	}
	recorded, filtered := r.Stats()
	perInstance := kubeevents.SpamBurst + int64(seconds/kubeevents.SpamRefill.Seconds())
	if n := recorded[kubeevents.FetchFailed]; n < instances*(perInstance-1) || n > instances*perInstance {
		t.Errorf("the spam filter passed %d FetchFailed occurrences of %d, want %d per instance (burst %d + one per %v over %ds)",
			n, instances*seconds, perInstance, kubeevents.SpamBurst, kubeevents.SpamRefill, seconds)
	}
	if recorded[kubeevents.FetchFailed]+filtered[kubeevents.FetchFailed] != instances*seconds || recorded[kubeevents.OutOfRotation] != instances {
		t.Errorf("counts: recorded %v, filtered %v", recorded, filtered)
	}

	// Every instance gets its FetchFailed series (patched to count 2 on the
	// second occurrence) and its OutOfRotation Event; then the number stays.
	count := func() (objects, series int) {
		for _, ev := range eventsOf(t, kube, ns, "") {
			if !uids[string(ev.Regarding.UID)] {
				t.Fatalf("an Event regards uid %s, no MAT Service of the test", ev.Regarding.UID)
			}
			objects++
			if ev.Reason == "FetchFailed" && ev.Series != nil && ev.Series.Count >= 2 {
				series++
			}
		}
		return objects, series
	}
	waitFor(t, "a FetchFailed series and an OutOfRotation Event per instance", func() bool {
		o, s := count()
		return o >= 2*instances && s == instances
	})
	time.Sleep(2 * time.Second) // what is still queued would be written by now
	objects, _ := count()
	t.Logf("measured: %d failures of %d instances over %ds (injected clock): %d passed the spam filter, %d Event objects",
		instances*seconds, instances, seconds, recorded[kubeevents.FetchFailed]+recorded[kubeevents.OutOfRotation], objects)
	// One per instance and reason, or two where client-go's event cache had
	// not yet seen the first create when the next occurrence came (seen once
	// under -race on a loaded machine: 41 of 40).
	if objects < 2*instances || objects > 4*instances {
		t.Errorf("%d Event objects, want %d to %d: one, at most two, per instance and reason", objects, 2*instances, 4*instances)
	}
}

// TestNilRecorder: a nil Recorder (--kube-events=false) records nothing
// and does not fail.
func TestNilRecorder(t *testing.T) {
	var r *kubeevents.Recorder
	r.Instance("ns.mat-0", kubeevents.FetchFailed, "x")
	r.Service(&corev1.Service{}, "ns.mat-0", kubeevents.Adopted, "x")
	if rec, filt := r.Stats(); len(rec)+len(filt) != 0 {
		t.Errorf("a nil Recorder counted %v %v", rec, filt)
	}
}

// TestReasons: every reason is CamelCase with a valid type and an action.
func TestReasons(t *testing.T) {
	for _, r := range kubeevents.Reasons {
		s := string(r)
		if s == "" || s[0] < 'A' || s[0] > 'Z' || strings.ContainsAny(s, " -_.") {
			t.Errorf("reason %q is not CamelCase", s)
		}
		if r.Type() != corev1.EventTypeNormal && r.Type() != corev1.EventTypeWarning {
			t.Errorf("%s: type %q", s, r.Type())
		}
		if r.Action() == "" {
			t.Errorf("%s: no action", s)
		}
	}
}
