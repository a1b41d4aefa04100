package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubewatch"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// TestInformerFailureInReadyz: while the worker's Service informer cannot
// watch, /readyz is 503 with the watch's reason (ahead of the worker's own
// state) and matbus_informer_healthy is 0; once a watch succeeds the
// informer is no cause any more and the gauge is 1. The worker package's
// TestMissingServiceVerbs makes the same failure with a real API server.
func TestInformerFailureInReadyz(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
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
	reg := newRegistry()
	workerMetrics(reg, w)
	r := workerReadiness(nc, startAPIProbe(ctx, kube, 20*time.Millisecond, time.Second, log), w)
	addr := freeAddr(t)
	if err := serveHealth(ctx, addr, r.err, reg, log); err != nil {
		t.Fatal(err)
	}
	waitReason(t, r, "worker: ")

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
}
