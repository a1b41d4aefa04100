package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
)

// TestErrorsSince prints recorded error events, filtered by kind, the end
// of a failure state marked resolved, and an unreadable message on the error subjects as such instead of failing.
func TestErrorsSince(t *testing.T) {
	s, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bus, err := events.New(nc, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	rep := events.NewReporter(bus, nil, "w-1", -1)
	rep.Report(ctx, events.Error{Kind: events.ErrorDelete, Instance: "ns.mat-0", Service: "ns/mat-bmc-host-a", Message: "forbidden", Permanent: true})
	rep.Report(ctx, events.Error{Kind: events.ErrorFetch, Instance: "ns.mat-1", URL: "https://h:1266", Message: "HTTP 500"})
	rep.Report(ctx, events.Error{Kind: events.ErrorWatch, Message: "list and watch services work again after 3s", Resolved: true})
	if err := bus.PublishRaw(ctx, "mat.errors.fetch", "", []byte("garbage")); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runArgs(t, nil, "errors", "--nats-url", s.ClientURL(), "--since", "1h", "--follow=false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "delete") || !strings.Contains(lines[0], "service=ns/mat-bmc-host-a") ||
		!strings.Contains(lines[0], "permanent") || !strings.Contains(lines[0], ": forbidden") ||
		!strings.Contains(lines[1], "url=https://h:1266") || !strings.HasSuffix(lines[2], " resolved: list and watch services work again after 3s") ||
		strings.Contains(lines[1], "resolved") || !strings.Contains(lines[3], "unreadable error event") {
		t.Fatalf("output:\n%s", out)
	}
	code, out, _ = runArgs(t, nil, "errors", "--nats-url", s.ClientURL(), "--since", "1h", "--follow=false", "--kind", "delete")
	if code != 0 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "delete") {
		t.Fatalf("--kind delete printed:\n%s", out)
	}
}

func TestProbe(t *testing.T) {
	sim, err := matsim.New(matsim.Options{Fixture: []byte(`{"machines":[]}`)})
	if err != nil {
		t.Fatal(err)
	}
	url, err := sim.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if code, _, errOut := runArgs(t, nil, "probe", "--url", url+"/healthz"); code != 0 {
		t.Fatalf("probe of /healthz: exit %d %s", code, errOut)
	}
	if code, _, errOut := runArgs(t, nil, "probe", "--url", url+"/nope"); code != 1 || !strings.Contains(errOut, "404") {
		t.Fatalf("probe of a 404: exit %d %s", code, errOut)
	}
	if code, _, _ := runArgs(t, nil, "probe", "--url", "http://127.0.0.1:1/", "--timeout", "1s"); code != 1 {
		t.Fatalf("probe of a closed port: exit %d", code)
	}
}

// TestErrorsHealth: with --health-addr, /readyz of `errors` (its compose
// healthcheck) answers 503 while the error stream is missing and 200 once
// the tail reads it.
func TestErrorsHealth(t *testing.T) {
	s, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	port, err := kubelocal.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	var o, e bytes.Buffer
	go func() {
		done <- run(ctx, []string{"errors", "--nats-url", s.ClientURL(), "--health-addr", addr}, envT(&o, &e, nil))
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("errors exited %d", code)
		}
	}()
	status := func() int {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	wait := func(want int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for status() != want {
			if time.Now().After(deadline) {
				t.Fatalf("/readyz never answered %d", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait(http.StatusServiceUnavailable) // no stream yet
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bus, err := events.New(nc, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	wait(http.StatusOK)
}
