package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/internal/natsconn"
	"github.com/matbus/matbus/operator"
)

func runErrors(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("errors", "Print error events as they arrive (and recent ones with --since).")
	var n natsOpts
	var since time.Duration
	var kinds cliflag.List
	var asJSON, follow bool
	var healthAddr string
	n.register(fs)
	n.AddTLSFlags(fs)
	fs.DurationVar(&since, "since", 0, "also print events of this long ago (e.g. 1h); 0 prints only new ones")
	fs.Var(&kinds, "kind", "only these kinds (delete, fetch, create, update, close, event, discovery, plan, watch); repeatable")
	fs.BoolVar(&asJSON, "json", false, "print each event as its JSON envelope")
	fs.BoolVar(&follow, "follow", true, "keep printing new events; false exits after the backlog")
	fs.StringVar(&healthAddr, "health-addr", "", "address of /healthz and /readyz (ready while connected to NATS and reading the error stream), e.g. :8080 for a container healthcheck; empty disables")
	if err := cliflag.Parse(fs, args, e.lookupEnv); err != nil {
		return usageErr(err)
	}
	if err := n.validate(); err != nil {
		return err // a usage error already
	}
	if since < 0 {
		return fmt.Errorf("%w: --since must not be negative", errUsage)
	}
	if _, err := operator.ErrorFilters(events.Subjects{Prefix: n.prefix}, kinds); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if !follow && since == 0 {
		return fmt.Errorf("%w: --follow=false needs --since", errUsage)
	}
	log, _ := (&logOpts{level: "warn", format: "text", fs: fs}).logger(e.stderr)
	// Run by hand, a NATS that cannot be reached is said within seconds; as a
	// service (--health-addr) it is waited for, and /readyz says why.
	var (
		nc  *nats.Conn
		err error
	)
	if healthAddr == "" {
		nc, err = natsconn.ConnectReachable(ctx, n.Config, "matbus-errors", log, reachWait)
	} else {
		nc, err = n.connect("matbus-errors", log)
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := n.bus(nc, "errors", log, nil)
	if err != nil {
		return err
	}
	var reading atomic.Bool
	ready := health.Readiness{health.NATS(nc), {Name: "error stream", Check: func() error {
		if !reading.Load() {
			return errors.New("not reading yet (waiting for the stream)")
		}
		return nil
	}}}
	if err := health.Serve(ctx, healthAddr, ready.Err, nil, false, log); err != nil {
		return err
	}
	return operator.TailErrors(ctx, operator.ErrorsConfig{Bus: bus, Kinds: kinds, Since: since, Follow: follow,
		JSON: asJSON, Out: e.stdout, Notes: e.stderr, Reading: func() { reading.Store(true) }})
}
