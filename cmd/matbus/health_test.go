package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubewatch"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// fakeAPI serves /version like a kube-apiserver; while down is true it
// closes every connection, like a server that is not there.
func fakeAPI(t *testing.T) (down *atomic.Bool, kube kubernetes.Interface) {
	t.Helper()
	down = &atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					_ = c.Close()
				}
			}
			return
		}
		if r.URL.Path != "/version" {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"major":"1","minor":"35","gitVersion":"v1.35.0"}`)
	}))
	t.Cleanup(srv.Close)
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return down, kube
}

// waitReason waits until r's error is nil (want "") or contains want.
func waitReason(t *testing.T, r health.Readiness, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := r.Err()
		if want == "" && err == nil || want != "" && err != nil && strings.Contains(err.Error(), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness: got %v, want %q", err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDiscoveryReadinessCauses flips each cause of a discovery process's
// unreadiness on and off, on real NATS, a real HTTP API endpoint and a
// real publisher: NATS down, the Kubernetes API unreachable, the source not
// synced, no successful sync tick within the staleness bound. The reason
// reaches /readyz's body with status 503.
func TestDiscoveryReadinessCauses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	port := ns.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	apiDown, kube := fakeAPI(t)
	probe := health.StartAPIProbe(ctx, kube, 20*time.Millisecond, time.Second, nil, log)
	var cur atomic.Pointer[health.Lead]
	const staleAfter = 1500 * time.Millisecond
	r := health.DiscoveryReadiness(nc, probe, nil, &cur, staleAfter)

	// A follower on a healthy NATS and API is ready; /readyz says so.
	waitReason(t, r, "")
	addr := freeAddr(t)
	if err := health.Serve(ctx, addr, r.Err, nil, false, log); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}

	// The Kubernetes API goes away, and comes back.
	apiDown.Store(true)
	waitReason(t, r, "Kubernetes API: unreachable")
	code, body := get(t, "http://"+addr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: Kubernetes API: unreachable") || strings.Count(body, "\n") != 1 {
		t.Fatalf("/readyz with the API away: %d %q", code, body)
	}
	if c, _ := get(t, "http://"+addr+"/healthz"); c != http.StatusOK {
		t.Errorf("/healthz is %d while unready: it is liveness only", c)
	}
	if c, _ := get(t, "http://"+addr+"/debug/pprof/"); c != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --profiling: %d, want 404", c)
	}
	apiDown.Store(false)
	waitReason(t, r, "")

	// NATS goes down, and comes back.
	ns.Shutdown()
	waitReason(t, r, "NATS: not connected")
	ns, err = natsserver.Start(natsserver.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	waitReason(t, r, "")

	// Leading with a source that has not synced (an informer on an API
	// that answers /version but no list).
	unsynced, err := discovery.NewKube(kube, discovery.KubeConfig{Namespace: "team-a"}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := events.New(nc, events.Config{Memory: true, Namespace: "team-a"}, log)
	if err != nil {
		t.Fatal(err)
	}
	cur.Store(&health.Lead{Publisher: discovery.NewPublisher(bus, unsynced, discovery.PublisherConfig{}, nil, log), Source: unsynced, Since: time.Now()})
	uctx, ucancel := context.WithCancel(ctx)
	defer ucancel()
	if err := unsynced.Run(uctx, func() {}); err != nil {
		t.Fatal(err)
	}
	waitReason(t, r, "informer not synced")

	// A synced source whose publisher has not ticked since the lead was
	// taken longer than staleAfter ago: stale. Once it runs, ready.
	static, err := discovery.NewStatic("t", []discovery.StaticEntry{{Namespace: "team-a", Name: "mat-0", URL: "https://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	pub := discovery.NewPublisher(bus, static, discovery.PublisherConfig{SyncInterval: 200 * time.Millisecond}, nil, log)
	cur.Store(&health.Lead{Publisher: pub, Source: static, Since: time.Now().Add(-2 * staleAfter)})
	waitReason(t, r, "discovery: no sync tick succeeded for")
	pctx, pcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(pctx) }()
	waitReason(t, r, "")
	// Its ticks stop: stale again after staleAfter.
	pcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitReason(t, r, "discovery: no sync tick succeeded for")
}

// TestWorkerReadinessCauses: a worker that is not running is not ready,
// and says why. While its Service informer cannot watch, /readyz is 503
// with the watch's reason (ahead of the worker's own state) and
// matbus_informer_healthy is 0; once a watch succeeds the informer is no
// cause any more and the gauge is 1. (The worker package's
// TestMissingServiceVerbs makes the same failure with a real API server.)
func TestWorkerReadinessCauses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, kube := fakeAPI(t)
	bus, err := events.New(nc, events.Config{Memory: true, Namespace: "team-a"}, log)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Plan: plan.Options{Namespace: "team-a"}}, bus, kube, nil, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	reg := health.NewRegistry(version, health.Revision(commit))
	health.WorkerMetrics(reg, w)
	r := health.WorkerReadiness(nc, health.StartAPIProbe(ctx, kube, 20*time.Millisecond, time.Second, nil, log), w)
	addr := freeAddr(t)
	if err := health.Serve(ctx, addr, r.Err, reg, true, log); err != nil {
		t.Fatal(err)
	}
	waitReason(t, r, "worker: the Service informer has not synced")
	if code, body := get(t, "http://"+addr+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ with --profiling: %d %q", code, body[:min(len(body), 200)])
	}
	if code, body := get(t, "http://"+addr+"/debug/pprof/heap"); code != http.StatusOK || len(body) == 0 {
		t.Errorf("/debug/pprof/heap with --profiling: %d, %d bytes", code, len(body))
	}
	if code, body := get(t, "http://"+addr+"/debug/pprof/cmdline"); code != http.StatusNotFound || strings.Contains(body, os.Args[0]) {
		t.Errorf("/debug/pprof/cmdline with --profiling: %d %q; the command line may hold a password", code, body)
	}

	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "",
		errors.New(`User "system:serviceaccount:team-a:matbus" cannot watch resource "services" in API group "" in the namespace "team-a"`))
	w.WatchHealth().Observe(ctx, kubewatch.VerbWatch, refused)
	code, body := get(t, "http://"+addr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: informer: watch services: services is forbidden: ") ||
		!strings.Contains(body, `cannot watch resource "services"`) || strings.Count(body, "\n") != 1 {
		t.Errorf("/readyz while the watch is refused: %d %q", code, body)
	}
	if _, m := get(t, "http://"+addr+"/metrics"); !strings.Contains(m, `matbus_informer_healthy{informer="services"} 0`) ||
		!strings.Contains(m, `matbus_informer_failures_total{informer="services",verb="watch"} 1`) {
		t.Errorf("/metrics while the watch is refused lacks the informer's state:\n%s", strings.Join(linesWith(m, "matbus_informer_"), "\n"))
	}
	w.WatchHealth().Observe(ctx, kubewatch.VerbWatch, nil)
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: worker: ") {
		t.Errorf("/readyz after the watch works again (the worker itself is not running): %d %q", code, body)
	}
	if _, m := get(t, "http://"+addr+"/metrics"); !strings.Contains(m, `matbus_informer_healthy{informer="services"} 1`) {
		t.Errorf("/metrics after recovery:\n%s", strings.Join(linesWith(m, "matbus_informer_"), "\n"))
	}

	ns.Shutdown()
	waitReason(t, r, "NATS: not connected")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	var resp *http.Response
	var err error
	for range 50 { // the listener may not be up yet
		if resp, err = http.Get(url); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWaitIsNeverSilent: while not ready, a WARN line with the reason is
// repeated; when ready again, one INFO line says so.
func TestWaitIsNeverSilent(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	r := health.Readiness{{Name: "Kubernetes API", Check: func() error {
		if down.Load() {
			return errors.New("unreachable: connection refused")
		}
		return nil
	}}}
	var out lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		health.WarnWhileUnready(ctx, r, time.Millisecond, 10*time.Millisecond, slog.New(slog.NewTextHandler(&out, nil)))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), "level=WARN") < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	down.Store(false)
	for !strings.Contains(out.String(), `level=INFO msg=ready`) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	s := out.String()
	if strings.Count(s, `level=WARN msg="not ready, still waiting" reason="Kubernetes API: unreachable: connection refused"`) < 3 ||
		strings.Count(s, "level=INFO msg=ready") != 1 {
		t.Fatalf("log:\n%s", s)
	}
}
