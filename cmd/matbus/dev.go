package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/devenv"
)

// devOpts are dev's flags: the worker's, the fleet's and discovery's
// scheduling group, and dev's own.
type devOpts struct {
	n                                  natsOpts
	l                                  logOpts
	k                                  kubeOpts
	w                                  workerOpts
	f                                  fleetOpts
	s                                  schedOpts
	natsPort, sims, workers            int
	natsHost, stateDir, sourceListAddr string
	verbose, once, tls                 bool
	timeout                            time.Duration
	fs                                 *flag.FlagSet
}

func (o *devOpts) register(fs *flag.FlagSet) {
	o.fs = fs
	// dev runs its own NATS server: of the NATS flags only the prefix
	// applies (the URL and credentials flags are refused, see devFlagHint).
	fs.StringVar(&o.n.prefix, "subject-prefix", events.DefaultPrefix, "first token(s) of every matbus subject")
	o.l.register(fs)
	o.k.register(fs)
	o.w.register(fs)
	o.f.register(fs)
	fs.IntVar(&o.natsPort, "nats-port", 4222, "port of the embedded NATS server (0 picks a free one)")
	fs.StringVar(&o.natsHost, "nats-host", "127.0.0.1", "host of the embedded NATS server")
	fs.IntVar(&o.sims, "simulators", 2, "MAT simulators to start, each with its own fleet")
	fs.IntVar(&o.workers, "workers", 2, "workers to run in this process")
	fs.BoolVar(&o.once, "once", false, "exit 0 once every simulated BMC has its Service (1 on --timeout), printing a JSON summary")
	cliflag.DurationVar(fs, &o.timeout, "timeout", 3*time.Minute, "with --once: how long to wait for convergence")
	o.s.register(fs, 10*time.Second, "how often every instance gets a full resync", "how often every instance's status is polled (cheap when unchanged)")
	fs.BoolVar(&o.tls, "tls", true, "simulators serve HTTPS with self-signed certificates (as MAT does)")
	fs.BoolVar(&o.verbose, "v", false, "show the process logs (every component's log lines) on stderr instead of writing them to a file")
	fs.StringVar(&o.stateDir, "state-dir", "", "folder of the local kube-apiserver's data and logs (default: a temporary one, removed on exit; those of killed runs are removed at the next start)")
	fs.StringVar(&o.sourceListAddr, "source-list-addr", "127.0.0.1:0", "address of the sources API (GET /v1/sources, as `discovery` serves it; port 0 picks a free one); empty disables")
	// dev's own default (not fs.Set: NAMESPACE and the flag still override it).
	o.w.namespace = "matbus-dev"
	fs.Lookup("namespace").DefValue = "matbus-dev"
}

func (o *devOpts) validate() error {
	if o.sims < 1 || o.sims > 16 || o.workers < 1 {
		return fmt.Errorf("%w: --simulators must be 1..16 and --workers at least 1", errUsage)
	}
	if err := o.s.validate(); err != nil {
		return err
	}
	if o.natsPort < 0 || o.natsPort > 65535 {
		return fmt.Errorf("%w: --nats-port must be 0..65535 (0 picks a free port)", errUsage)
	}
	return nil
}

// parseDev parses and checks dev's flags.
func parseDev(args []string, e env) (*devOpts, error) {
	o := &devOpts{}
	o.register(cliflag.NewFlagSet("dev", "Run the whole pipeline in one process: embedded NATS, simulators, local kube-apiserver, discovery, workers."))
	validPrefix := func() error {
		if err := events.ValidatePrefix(o.n.prefix); err != nil {
			return fmt.Errorf("%w: --subject-prefix: %v", errUsage, err)
		}
		return nil
	}
	if err := parseAndValidate(o.fs, args, e.lookupEnv, validPrefix, asUsage(o.k.Validate), o.w.validate); err != nil {
		return nil, devFlagHint(err)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.n.memory, o.n.namespace = true, o.w.namespace
	return o, nil
}

func runDev(ctx context.Context, args []string, e env) error {
	o, err := parseDev(args, e)
	if err != nil {
		return err
	}
	fleets, err := devenv.Fleets(o.f.spec(), o.sims)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	logTo, logPath, closeLog, err := devenv.LogFile(o.verbose, e.stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	log, err := o.l.logger(logTo)
	if err != nil {
		return err
	}
	if logPath != "" {
		fmt.Fprintf(e.stdout, "Process logs             %s   (-v shows them here instead)\n", logPath)
	}
	// TLS is verified as in production: the simulators' self-signed
	// certificates are trusted as they start (besides the system roots and
	// --mat-ca-file), unless --insecure-skip-verify.
	if err := o.w.loadMatRoots(log); err != nil {
		return err
	}
	err = devenv.Run(ctx, o.config(fleets, e, log), o.parts(log))
	if errors.Is(err, devenv.ErrStopped) {
		return exitCode(1)
	}
	return err
}

// config is the run of the flags, on fleets.
func (o *devOpts) config(fleets []devenv.Fleet, e env, log *slog.Logger) devenv.Config {
	return devenv.Config{Fleets: fleets, TLS: o.tls, NATSHost: o.natsHost, NATSPort: o.natsPort, Prefix: o.n.prefix,
		Namespace: o.w.namespace, ManagedBy: o.w.managedBy, Kubeconfig: o.k.Kubeconfig, StateDir: o.stateDir,
		SourceListAddr: o.sourceListAddr,
		// A static source: no MAT Service to record Kubernetes Events on,
		// as for `matbus discovery --static`.
		Publisher: o.s.publisherConfig(nil),
		Workers:   o.workers, Once: o.once, Timeout: o.timeout, NextStepsAfter: devNextStepsAfter,
		PassedFlags: devPassedFlags(o.fs, o.n.prefix), Out: e.stdout, Log: log}
}

// parts builds dev's connections, discovery bus and workers as `discovery`
// and `worker` do from the same flags.
func (o *devOpts) parts(log *slog.Logger) devenv.Parts {
	return devenv.Parts{
		RESTConfig: func(ctx context.Context) (*rest.Config, error) { return o.k.restConfig(ctx, log) },
		LocalCluster: func(cfg *rest.Config, serviceCIDR string) {
			o.k.apply(cfg)
			if len(o.w.serviceCIDRs) == 0 {
				o.w.serviceCIDRs = cliflag.List{serviceCIDR}
			}
		},
		TrustMAT: func(c *x509.Certificate) { o.w.matTrust.Add(c) },
		Connect: func(url, name string) (*nats.Conn, error) {
			o.n.URL = url
			return o.n.connect(name, log)
		},
		DiscoveryBus: func(nc *nats.Conn) (*events.Bus, error) { return o.n.bus(nc, "discovery/dev", log, nil) },
		Worker: func(ctx context.Context, name string, nc *nats.Conn, kube kubernetes.Interface) (devenv.Runner, error) {
			w := o.w
			w.name = name
			wlog := log.With("component", "worker")
			bus, err := o.n.bus(nc, "worker/"+name, wlog, &w)
			if err != nil {
				return nil, err
			}
			wk, _, err := w.build(ctx, bus, kube, wlog)
			if err != nil {
				return nil, err
			}
			return wk, nil
		},
	}
}

// devNextStepsAfter is how long a run without --once waits for every
// Service before it prints the next steps anyway (a variable for tests).
var devNextStepsAfter = 30 * time.Second

// devPassedFlags returns, as --name=value, the flags of fs that status,
// plan and check must be given too so that they look at what this run
// does (the subject prefix and the worker flags that shape Services),
// when they differ from their defaults.
func devPassedFlags(fs *flag.FlagSet, prefix string) []string {
	var out []string
	if prefix != events.DefaultPrefix {
		out = append(out, "--subject-prefix="+prefix)
	}
	for _, name := range []string{"managed-by", "bmc-ip-mode", "target-selector", "enable-state-annotations", "mat-ca-file"} {
		if f := fs.Lookup(name); f != nil && f.Value.String() != f.DefValue {
			out = append(out, "--"+name+"="+f.Value.String())
		}
	}
	return out
}

// notDevFlags are flags of the commands that join an operator's NATS
// server, which dev (running its own) refuses instead of ignoring.
var notDevFlags = []string{"nats-url", "nats-creds", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "stream-replicas"}

// devFlagHint turns dev's "unknown flag" error for a flag of notDevFlags
// into one that says why and what to use instead; other errors are
// returned as they are.
func devFlagHint(err error) error {
	for _, f := range notDevFlags {
		if strings.Contains(err.Error(), "unknown flag --"+f) {
			return fmt.Errorf("%w: --%s is not a dev flag: dev runs its own embedded NATS server (set its address with --nats-host and --nats-port); "+
				"to run against a NATS server of yours, run `matbus discovery` and `matbus worker` with --%s", errUsage, f, f)
		}
	}
	return err
}
