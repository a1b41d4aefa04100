package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/kubeconn"
	"github.com/matbus/matbus/internal/natsconn"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/operator"
)

// outputFlag registers --output and its shorthand -o (text or json, into
// output) and returns their check.
func outputFlag(fs *flag.FlagSet, output *string) func() error {
	fs.StringVar(output, "output", "text", "output format: text or json")
	fs.StringVar(output, "o", "text", "shorthand for --output")
	return func() error {
		if *output != "text" && *output != "json" {
			return fmt.Errorf("%w: --output %q: want text or json", errUsage, *output)
		}
		return nil
	}
}

// runPlan is `matbus plan`: the takeover dry run of package operator,
// wired to the worker's and discovery's flags. Exit 0: no change; 2:
// something would change; 1: an error, invalid flags included (as
// terraform plan -detailed-exitcode, so 2 never means a typo).
func runPlan(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("plan", "Dry run: what a worker would do to the Services of the namespace (the old controller's included) — creates, updates with the fields that change, recreates, deletes and adoptions. "+
		"Takes the flags and environment of `worker` and `discovery`, fetches each status once and writes nothing; exits 0 when nothing would change, 2 when something would, 1 on an error (invalid flags included).")
	var (
		o       toolOpts
		timeout time.Duration
		output  string
	)
	o.register(fs)
	cliflag.DurationVar(fs, &timeout, "timeout", time.Minute, "how long discovery, the fetches and the Service list together may take")
	log, err := o.parse(fs, args, e, "plan", outputFlag(fs, &output))
	if err != nil {
		return err
	}
	n, k, w, d := &o.n, &o.k, &o.w, &o.d
	// A bad static list is reported before anything is contacted.
	var src discovery.Source
	if d.isStatic() {
		if src, err = d.source(nil, w.namespace, log, nil); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cfg, err := k.restConfig(ctx, log)
	if err != nil {
		return err
	}
	kube, err := kubeconn.Client(cfg)
	if err != nil {
		return err
	}
	if err := kubeconn.Reachable(ctx, kube, cfg.Host, reachWait); err != nil {
		return err
	}
	if src == nil {
		if src, err = d.source(kube, w.namespace, log, nil); err != nil {
			return err
		}
	}
	insts, err := operator.Instances(ctx, src)
	if err != nil {
		return err
	}
	mcfg := w.matConfig("matbus-plan/" + version)
	pcfg := operator.PlanConfig{
		Kube:      kube,
		Options:   w.planOptions(),
		NewClient: func(url string) (operator.StatusClient, error) { return matclient.New(url, mcfg) },
		Fetches:   w.fetches,
		Hold:      w.holdRule(),
	}
	pcfg.Holds, pcfg.HoldsErr = readHolds(ctx, fs, n, w, log)
	r, err := operator.Plan(ctx, pcfg, insts)
	if err != nil {
		return err
	}
	if output == "json" {
		err = operator.WriteJSON(e.stdout, r)
	} else {
		err = operator.WriteText(e.stdout, r)
	}
	if err != nil {
		return err
	}
	if c := r.ExitCode(); c != 0 {
		return exitCode(c)
	}
	return nil
}

// readHolds reads the hold records of the namespace from the state bucket
// when a NATS URL was given (flag or environment), for plan to show the
// holds in force; otherwise, or when they cannot be read within reachWait,
// it returns why (an unreachable NATS named within reachWait).
func readHolds(ctx context.Context, fs *flag.FlagSet, n *natsOpts, w *workerOpts, log *slog.Logger) (map[string]events.HoldRecord, error) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "nats-url" })
	if !given {
		return nil, errors.New("no --nats-url given, so a hold in force is not known")
	}
	nc, err := natsconn.ConnectReachable(ctx, n.Config, "matbus-plan", log, reachWait)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	bus, err := n.bus(nc, "plan", log, w)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, reachWait)
	defer cancel()
	holds, err := bus.ReadHolds(rctx, w.namespace)
	if errors.Is(err, events.ErrNoState) {
		return map[string]events.HoldRecord{}, nil
	}
	return holds, err
}
