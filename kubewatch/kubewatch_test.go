package kubewatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubewatch"
)

// watchEvents collects the error events of kind watch on nc.
type watchEvents struct {
	mu   sync.Mutex
	list []events.Error
}

func subscribe(t *testing.T, nc *nats.Conn, bus *events.Bus) *watchEvents {
	t.Helper()
	w := &watchEvents{}
	_, err := nc.Subscribe(bus.Subjects().Error(events.ErrorWatch), func(m *nats.Msg) {
		env, err := events.Decode(m.Data)
		if err != nil {
			t.Errorf("undecodable error event: %v", err)
			return
		}
		var e events.Error
		if err := json.Unmarshal(env.Data, &e); err != nil {
			t.Errorf("error event data: %v", err)
			return
		}
		w.mu.Lock()
		w.list = append(w.list, e)
		w.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// wait returns the events once there are n, failing t after 10 s.
func (w *watchEvents) wait(t *testing.T, n int) []events.Error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		got := append([]events.Error(nil), w.list...)
		w.mu.Unlock()
		if len(got) >= n || time.Now().After(deadline) {
			if len(got) != n {
				t.Fatalf("got %d watch events, want %d: %+v", len(got), n, got)
			}
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func forbidden(verb string) error {
	return apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "",
		errors.New(`User "matbus" cannot `+verb+` resource "services" in API group "" in the namespace "team-a"`))
}

// TestTrackerReportsStartAndEndOnce: a verb that keeps failing is one
// event, one reason in Err and one metric state, however many calls fail;
// a second verb failing meanwhile adds its reason but no event; once no
// verb fails, one more event, and Err is nil; a canceled call counts as
// nothing.
func TestTrackerReportsStartAndEndOnce(t *testing.T) {
	nc := testenv.NATS(t)
	log := slog.New(slog.DiscardHandler)
	bus, err := events.New(nc, events.Config{Memory: true, Namespace: "team-a"}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	seen := subscribe(t, nc, bus)
	tr := kubewatch.New("services", events.NewReporter(bus, log, "worker-0", 0), log)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(kubewatch.NewCollector(tr, nil))
	healthy := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "matbus_informer_healthy" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no matbus_informer_healthy")
		return 0
	}

	tr.Observe(ctx, kubewatch.VerbList, nil)
	tr.Observe(ctx, kubewatch.VerbWatch, nil)
	if err := tr.Err(); err != nil || healthy() != 1 {
		t.Fatalf("after successful calls: Err %v, healthy %v", err, healthy())
	}

	for range 5 {
		tr.Observe(ctx, kubewatch.VerbWatch, forbidden("watch"))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	tr.Observe(cctx, kubewatch.VerbList, context.Canceled) // shutdown, not a failure
	err = tr.Err()
	if err == nil || !strings.HasPrefix(err.Error(), "watch services: ") || !strings.Contains(err.Error(), "cannot watch resource") {
		t.Fatalf("Err while watch fails = %v, want the watch verb and the API server's reason", err)
	}
	if !apierrors.IsForbidden(err) {
		t.Errorf("Err %v does not wrap the API error", err)
	}
	if got := tr.Failing(); len(got) != 1 || got[0] != kubewatch.VerbWatch {
		t.Errorf("Failing = %v, want [watch]", got)
	}
	if healthy() != 0 {
		t.Errorf("matbus_informer_healthy = %v while watch fails, want 0", healthy())
	}
	start := seen.wait(t, 1)[0]
	if start.Kind != events.ErrorWatch || start.Worker != "worker-0" || start.Permanent || start.Resolved ||
		!strings.Contains(start.Message, "watch services: ") || !strings.Contains(start.Message, "cannot watch resource") {
		t.Errorf("start event = %+v", start)
	}

	// A second verb fails too: no event, both in Err, list first.
	tr.Observe(ctx, kubewatch.VerbList, forbidden("list"))
	if err := tr.Err(); err == nil || !strings.HasPrefix(err.Error(), "list services: ") || !strings.Contains(err.Error(), "; watch services: ") {
		t.Errorf("Err with both failing = %v", err)
	}
	tr.Observe(ctx, kubewatch.VerbList, nil)
	if err := tr.Err(); err == nil || !strings.HasPrefix(err.Error(), "watch services: ") {
		t.Errorf("Err after list works again, watch not = %v", err)
	}
	if healthy() != 0 {
		t.Errorf("matbus_informer_healthy = %v while watch fails, want 0", healthy())
	}

	tr.Observe(ctx, kubewatch.VerbWatch, nil)
	tr.Observe(ctx, kubewatch.VerbWatch, nil)
	if err := tr.Err(); err != nil {
		t.Errorf("Err after the watch works again = %v", err)
	}
	if healthy() != 1 {
		t.Errorf("matbus_informer_healthy = %v after recovery, want 1", healthy())
	}
	end := seen.wait(t, 2)[1]
	if end.Kind != events.ErrorWatch || end.Attempts != 6 || !end.Resolved || !strings.HasPrefix(end.Message, "list and watch services work again after ") ||
		!strings.Contains(end.Message, "6 failed calls") {
		t.Errorf("end event = %+v, want list and watch work again after 6 failed calls", end)
	}
	if got := failuresOf(t, reg, "watch"); got != 5 {
		t.Errorf("matbus_informer_failures_total{verb=watch} = %v, want 5", got)
	}
}

// failuresOf returns matbus_informer_failures_total of verb from reg.
func failuresOf(t *testing.T, reg *prometheus.Registry, verb string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "matbus_informer_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "verb" && l.GetValue() == verb {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no matbus_informer_failures_total{verb=%q}", verb)
	return 0
}
