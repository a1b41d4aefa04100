package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/natsserver"
)

// TestPlanReadsHolds: plan reads the hold records of its namespace from the
// state bucket when a NATS URL is given, none when the bucket does not
// exist yet, and says why it knows no hold without a NATS URL.
func TestPlanReadsHolds(t *testing.T) {
	srv, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	log := slog.New(slog.DiscardHandler)
	parse := func(args ...string) (*natsOpts, *workerOpts, func() (map[string]events.HoldRecord, error)) {
		fs := cliflag.NewFlagSet("plan", "")
		var n natsOpts
		var w workerOpts
		n.register(fs)
		w.register(fs)
		if err := parseAndValidate(fs, args, func(string) (string, bool) { return "", false }, n.validate, w.validate); err != nil {
			t.Fatal(err)
		}
		return &n, &w, func() (map[string]events.HoldRecord, error) { return readHolds(context.Background(), fs, &n, &w, log) }
	}

	_, _, read := parse("--namespace", "team-a")
	if _, err := read(); err == nil || !strings.Contains(err.Error(), "no --nats-url") {
		t.Errorf("without a NATS URL: %v, want why no hold is known", err)
	}
	_, _, read = parse("--namespace", "team-a", "--nats-url", srv.ClientURL())
	if holds, err := read(); err != nil || len(holds) != 0 {
		t.Errorf("no state bucket yet: %v, %v; want none and no error", holds, err)
	}

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bus, err := events.New(nc, events.Config{Namespace: "team-a"}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := bus.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"team-a.mat", "team-b.mat"} {
		b, _ := json.Marshal(events.HoldRecord{Key: key, Reason: "all", Held: 3, Since: time.Now(), Until: time.Now().Add(time.Minute)})
		if _, err := kv.Put(ctx, events.StateHoldKey(key), b); err != nil {
			t.Fatal(err)
		}
	}
	holds, err := read()
	if err != nil || len(holds) != 1 || holds["team-a.mat"].Held != 3 {
		t.Errorf("holds %v, %v; want team-a.mat's only", holds, err)
	}
}
