package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

func runErrors(ctx context.Context, args []string, e env) error {
	fs := newFlagSet("errors", "Print error events as they arrive (and recent ones with --since).", e.stderr)
	var n natsOpts
	var since time.Duration
	var kinds listFlag
	var asJSON, follow bool
	var healthAddr string
	n.register(fs)
	n.registerTLS(fs)
	fs.DurationVar(&since, "since", 0, "also print events of this long ago (e.g. 1h); 0 prints only new ones")
	fs.Var(&kinds, "kind", "only these kinds (delete, fetch, create, update, close, event, discovery, plan, watch); repeatable")
	fs.BoolVar(&asJSON, "json", false, "print each event as its JSON envelope")
	fs.BoolVar(&follow, "follow", true, "keep printing new events; false exits after the backlog")
	fs.StringVar(&healthAddr, "health-addr", "", "address of /healthz and /readyz (ready while connected to NATS and reading the error stream), e.g. :8080 for a container healthcheck; empty disables")
	if err := parseWithEnv(fs, args, e.lookupEnv); err != nil {
		return usageErr(err)
	}
	if err := n.validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if since < 0 {
		return fmt.Errorf("%w: --since must not be negative", errUsage)
	}
	subj := events.Subjects{Prefix: n.prefix}
	filters := []string{subj.Errors()}
	if len(kinds) > 0 {
		filters = nil
		for _, k := range kinds {
			ok := false
			for _, known := range events.ErrorKinds {
				ok = ok || string(known) == k
			}
			if !ok {
				return fmt.Errorf("%w: --kind %q is not an error kind", errUsage, k)
			}
			filters = append(filters, subj.Error(events.ErrorKind(k)))
		}
	}
	if !follow && since == 0 {
		return fmt.Errorf("%w: --follow=false needs --since", errUsage)
	}
	log, _ := (&logOpts{level: "warn", format: "text", fs: fs}).logger(e.stderr)
	nc, err := n.connect("matbus-errors", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := n.bus(nc, "errors", log, nil)
	if err != nil {
		return err
	}
	var reading atomic.Bool
	ready := readiness{natsCheck(nc), {name: "error stream", check: func() error {
		if !reading.Load() {
			return errors.New("not reading yet (waiting for the stream)")
		}
		return nil
	}}}
	if err := serveHealth(ctx, healthAddr, ready.err, nil, log); err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverNewPolicy}
	if since > 0 {
		start := time.Now().Add(-since)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	// Reading never creates streams: wait for them to exist.
	var cons jetstream.Consumer
	for {
		cons, err = bus.JS.OrderedConsumer(ctx, bus.StreamName("ERRORS"), cfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("read error events: %w", err)
		}
		if !follow {
			return fmt.Errorf("stream %s does not exist: no matbus component has started on this NATS server with --subject-prefix %q", bus.StreamName("ERRORS"), n.prefix)
		}
		fmt.Fprintf(e.stderr, "waiting for stream %s (no matbus component has started yet)\n", bus.StreamName("ERRORS"))
		if !sleepCtx(ctx, 2*time.Second) {
			return nil
		}
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read error events: %w", err)
	}
	defer it.Stop()
	reading.Store(true)
	printed := 0
	for {
		nctx := ctx
		var cancel context.CancelFunc = func() {}
		if !follow {
			nctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		}
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if !follow && printed == 0 && ctx.Err() == nil {
				fmt.Fprintf(e.stderr, "no error events in the last %s\n", since)
			}
			if ctx.Err() != nil || !follow {
				return nil
			}
			return fmt.Errorf("read error events: %w", err)
		}
		printed++
		printError(e.stdout, m.Subject(), m.Data(), asJSON)
		if !follow {
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				return nil
			}
		}
	}
}

// printError writes one error event as a line: time, kind, target and message.
func printError(w io.Writer, subject string, data []byte, asJSON bool) {
	if asJSON {
		fmt.Fprintln(w, strings.TrimSpace(string(data)))
		return
	}
	env, err := events.Decode(data)
	if err == nil {
		var ev events.Error
		if ev, err = events.Into[events.Error](env, events.TypeError); err == nil {
			var b strings.Builder
			fmt.Fprintf(&b, "%s %-9s", env.Time.Format(time.RFC3339), ev.Kind)
			for _, kv := range [][2]string{{"instance", ev.Instance}, {"service", ev.Service}, {"url", ev.URL}, {"mat_id", ev.MatID}, {"subject", ev.Subject}, {"worker", ev.Worker}} {
				if kv[1] != "" {
					fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
				}
			}
			if ev.Permanent {
				b.WriteString(" permanent")
			}
			if ev.Attempts > 0 {
				fmt.Fprintf(&b, " attempts=%d", ev.Attempts)
			}
			if ev.Suppressed > 0 {
				fmt.Fprintf(&b, " suppressed=%d", ev.Suppressed)
			}
			fmt.Fprintf(&b, ": %s", ev.Message)
			fmt.Fprintln(w, b.String())
			return
		}
	}
	raw, _ := json.Marshal(string(data))
	fmt.Fprintf(w, "unreadable error event on %s (%v): %s\n", subject, err, raw)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
