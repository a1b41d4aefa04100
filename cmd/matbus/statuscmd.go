package main

import (
	"context"
	"fmt"
	"time"

	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/kubeconn"
	"github.com/matbus/matbus/internal/natsconn"
	"github.com/matbus/matbus/operator"
)

// runStatus is `matbus status`: package operator's status of the
// namespace's pipeline, read from NATS (instances stream, state bucket,
// error stream, job consumers), one LIST of Services and, with
// --sources-url, the sources API. It never asks a worker.
func runStatus(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("status", "One row per instance: MAT URL, in rotation or not (poll or probe interval), age of the last good sync, "+
		"its BMC and NVOS Services, last error kind and age, the worker that last synced it and whether the sources API publishes it; "+
		"then instances, Services, the job consumers' pending and ack-pending jobs and the discovery leader. "+
		"Reads what matbus publishes (NATS, one LIST of Services, the sources API); takes the flags and environment of `worker`.")
	var (
		n          natsOpts
		l          logOpts
		k          kubeOpts
		w          workerOpts
		sourcesURL string
		since      time.Duration
		timeout    time.Duration
		output     string
	)
	n.register(fs)
	n.AddTLSFlags(fs)
	l.registerQuiet(fs)
	k.register(fs)
	w.register(fs)
	fs.StringVar(&sourcesURL, "sources-url", "", "base URL of a discovery replica's sources API (its --source-list-addr, e.g. http://127.0.0.1:8090) for the PUBLISHED column; empty leaves it unknown")
	cliflag.DurationVar(fs, &since, "errors-since", time.Hour, "how far back the error stream is read for each instance's last error")
	cliflag.DurationVar(fs, &timeout, "timeout", 30*time.Second, "how long all reads together may take")
	validOutput := outputFlag(fs, &output)
	validSources := func() error {
		if sourcesURL == "" {
			return nil
		}
		return validURL("--sources-url", sourcesURL)
	}
	if err := parseAndValidate(fs, args, e.lookupEnv, n.validate, asUsage(k.Validate), w.validate, validOutput, validSources); err != nil {
		return err
	}
	log, err := l.logger(e.stderr)
	if err != nil {
		return err
	}
	log = log.With("component", "status")
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := natsconn.ConnectReachable(ctx, n.Config, "matbus-status", log, reachWait)
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := n.bus(nc, "status", log, &w)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg := operator.StatusConfig{Bus: bus, ManagedBy: w.managedBy, SourcesURL: sourcesURL, ErrorsSince: since}
	if rc, err := k.restConfig(ctx, log); err != nil {
		cfg.KubeErr = err
	} else if cfg.Kube, err = kubeconn.Client(rc); err != nil {
		cfg.KubeErr = err
	} else if err := kubeconn.Reachable(ctx, cfg.Kube, rc.Host, reachWait); err != nil {
		cfg.Kube, cfg.KubeErr = nil, err
	}
	st, err := operator.ReadStatus(ctx, cfg)
	if err != nil {
		return err
	}
	if output == "json" {
		return operator.WriteStatusJSON(e.stdout, st)
	}
	return operator.WriteStatusText(e.stdout, st)
}
