package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/operator"
	"github.com/matbus/matbus/plan"
)

// devSummary is the final JSON line of `matbus dev --once`.
type devSummary struct {
	Converged      bool    `json:"converged"`
	Services       int     `json:"services"`
	Expected       int     `json:"expected"`
	Errors         int64   `json:"errors"`
	ElapsedSeconds float64 `json:"elapsed_seconds"` // to the millisecond
	NATSURL        string  `json:"nats_url"`
	Kubeconfig     string  `json:"kubeconfig,omitempty"`
	Namespace      string  `json:"namespace"`
	// Stopped says why --once ended: converged, timeout, permanent (every
	// remaining problem is a permanent error) or interrupted.
	Stopped string `json:"stopped"`
}

func runDev(ctx context.Context, args []string, e env) error {
	fs := newFlagSet("dev", "Run the whole pipeline in one process: embedded NATS, simulators, local kube-apiserver, discovery, workers.", e.stderr)
	var n natsOpts
	var l logOpts
	var k kubeOpts
	var w workerOpts
	var f fleetOpts
	var natsPort, sims, workers int
	var natsHost, stateDir, sourceListAddr string
	var verbose bool
	var once, tls bool
	var timeout, interval, poll, pollMax time.Duration
	var pollMaxGiven bool
	// dev runs its own NATS server: of the NATS flags only the prefix
	// applies (the URL and credentials flags are refused, see devFlagHint).
	fs.StringVar(&n.prefix, "subject-prefix", events.DefaultPrefix, "first token(s) of every matbus subject")
	l.register(fs)
	k.register(fs)
	w.register(fs)
	f.register(fs)
	fs.IntVar(&natsPort, "nats-port", 4222, "port of the embedded NATS server (0 picks a free one)")
	fs.StringVar(&natsHost, "nats-host", "127.0.0.1", "host of the embedded NATS server")
	fs.IntVar(&sims, "simulators", 2, "MAT simulators to start, each with its own fleet")
	fs.IntVar(&workers, "workers", 2, "workers to run in this process")
	fs.BoolVar(&once, "once", false, "exit 0 once every simulated BMC has its Service (1 on --timeout), printing a JSON summary")
	durationVar(fs, &timeout, "timeout", 3*time.Minute, "with --once: how long to wait for convergence")
	durationVar(fs, &interval, "sync-interval", 10*time.Second, "how often every instance gets a full resync")
	durationVar(fs, &poll, "poll-interval", time.Second, "how often every instance's status is polled (cheap when unchanged)")
	givenDurationVar(fs, &pollMax, &pollMaxGiven, "poll-max-interval", defaultPollMaxInterval, pollMaxUsage)
	fs.BoolVar(&tls, "tls", true, "simulators serve HTTPS with self-signed certificates (as MAT does)")
	fs.BoolVar(&verbose, "v", false, "show the process logs (every component's log lines) on stderr instead of writing them to a file")
	fs.StringVar(&stateDir, "state-dir", "", "folder of the local kube-apiserver's data and logs (default: a temporary one, removed on exit; those of killed runs are removed at the next start)")
	fs.StringVar(&sourceListAddr, "source-list-addr", "127.0.0.1:0", "address of the sources API (GET /v1/sources, as `discovery` serves it; port 0 picks a free one); empty disables")
	// dev's own defaults differ from the worker's.
	_ = fs.Set("namespace", "matbus-dev")
	fs.Lookup("namespace").DefValue = "matbus-dev"
	validPrefix := func() error {
		if err := events.ValidatePrefix(n.prefix); err != nil {
			return fmt.Errorf("%w: --subject-prefix: %v", errUsage, err)
		}
		return nil
	}
	if err := parseAndValidate(fs, args, e.lookupEnv, validPrefix, k.validate, w.validate); err != nil {
		return devFlagHint(err)
	}
	if sims < 1 || sims > 16 || workers < 1 {
		return fmt.Errorf("%w: --simulators must be 1..16 and --workers at least 1", errUsage)
	}
	if poll < 100*time.Millisecond || poll > interval {
		return fmt.Errorf("%w: --poll-interval must be at least 100ms and at most --sync-interval", errUsage)
	}
	if interval < time.Second {
		return fmt.Errorf("%w: --sync-interval must be at least 1s", errUsage)
	}
	pollMax, err := pollMaxInterval(poll, pollMax, pollMaxGiven, interval)
	if err != nil {
		return err
	}
	if natsPort < 0 || natsPort > 65535 {
		return fmt.Errorf("%w: --nats-port must be 0..65535 (0 picks a free port)", errUsage)
	}
	// The fleets are generated before anything starts, so a bad fleet flag
	// is a usage error, not a failure after the API server is up.
	base, err := netip.ParsePrefix(f.subnet)
	if err != nil || !base.Addr().Is4() {
		return fmt.Errorf("%w: --bmc-subnet %q: want an IPv4 CIDR such as 10.96.64.0/20", errUsage, f.subnet)
	}
	var nvosBase netip.Prefix
	if f.nvosSubnet != "" {
		if nvosBase, err = netip.ParsePrefix(f.nvosSubnet); err != nil || !nvosBase.Addr().Is4() {
			return fmt.Errorf("%w: --nvos-subnet %q: want an IPv4 CIDR such as 10.98.64.0/20", errUsage, f.nvosSubnet)
		}
	}
	var fleets []*matsim.Fleet
	for i := 0; i < sims; i++ {
		spec := f.spec()
		spec.Seed = f.seed + int64(i)
		spec.BMCSubnet = nthSubnet(base, i).String()
		if f.nvosSubnet != "" {
			spec.NVOSSubnet = nthSubnet(nvosBase, i).String()
		}
		fleet, err := matsim.Generate(spec)
		if err != nil {
			return fmt.Errorf("%w: fleet %d (--hosts, --dpus-per-host, --switches, --power-shelves, --bmc-subnet, --nvos-subnet): %v", errUsage, i, err)
		}
		fleets = append(fleets, fleet)
	}
	// Services, error events and status lines are printed from several goroutines.
	out := &syncWriter{w: e.stdout}
	logTo, logPath, closeLog, err := devLogFile(verbose, e.stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	log, err := l.logger(logTo)
	if err != nil {
		return err
	}
	if logPath != "" {
		fmt.Fprintf(out, "Process logs             %s   (-v shows them here instead)\n", logPath)
	}
	start := time.Now()
	// TLS is verified as in production: the simulators' self-signed
	// certificates are trusted as they start (besides the system roots and
	// --mat-ca-file), unless --insecure-skip-verify.
	if err := w.loadMatRoots(log); err != nil {
		return err
	}
	n.memory = true

	// 1. NATS.
	ns, err := natsserver.Start(natsserver.Options{Host: natsHost, Port: natsPort})
	if err != nil {
		return fmt.Errorf("embedded NATS on port %d: %w (is another one running? try --nats-port 0)", natsPort, err)
	}
	defer ns.Shutdown()
	n.url = ns.ClientURL()
	watch := "bin/matbus errors --nats-url " + n.url
	if n.prefix != events.DefaultPrefix {
		watch += " --subject-prefix " + n.prefix
	}
	fmt.Fprintf(out, "NATS with JetStream      %s   (watch errors: %s)\n", n.url, watch)

	// 2. Kubernetes.
	var cfg *rest.Config
	kubeconfig := k.kubeconfig
	if kubeconfig != "" {
		if cfg, err = k.restConfig(ctx, log); err != nil {
			return err
		}
		fmt.Fprintf(out, "Kubernetes               %s (from %s)\n", cfg.Host, kubeconfig)
	} else {
		fmt.Fprintf(out, "Kubernetes               starting a local etcd + kube-apiserver ...\n")
		dir := stateDir
		if dir == "" {
			// State of runs killed with SIGKILL goes first; this run's goes on exit.
			removed, err := removeStaleDevState(os.TempDir())
			if err != nil {
				log.Warn("stale state of earlier runs not removed", "error", err)
			}
			for _, d := range removed {
				fmt.Fprintf(out, "Removed the state of a killed run: %s\n", d)
			}
			var remove func()
			if dir, remove, err = newDevState(os.TempDir()); err != nil {
				return err
			}
			defer remove()
		}
		cl, err := kubelocal.Start(ctx, kubelocal.Config{Dir: dir, Log: log})
		if err != nil {
			return fmt.Errorf("local Kubernetes: %w", err)
		}
		defer cl.Stop()
		cfg = cl.RESTConfig()
		k.apply(cfg)
		kubeconfig = cl.Kubeconfig
		if len(w.serviceCIDRs) == 0 {
			w.serviceCIDRs = listFlag{cl.ServiceCIDR}
		}
		fmt.Fprintf(out, "Kubernetes               %s (service range %s)\n", cl.URL, cl.ServiceCIDR)
	}
	kube, err := kubeClient(cfg)
	if err != nil {
		return err
	}
	if err := ensureNamespace(ctx, kube, w.namespace); err != nil {
		return err
	}
	fmt.Fprintf(out, "Services                 KUBECONFIG=%s kubectl get svc -n %s -l %s=%s\n", kubeconfig, w.namespace, plan.LabelManagedBy, w.managedBy)

	runCtx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// The discovery and worker connections close only after every
	// goroutine has stopped: discovery marks its leader entry ended and
	// workers settle their jobs on the way out, over those connections.
	var conns []*nats.Conn
	defer func() {
		stopAll()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	}()

	// 3. Simulators.
	var entries []discovery.StaticEntry
	expected := 0
	for i, fleet := range fleets {
		spec := f.spec()
		spec.BMCSubnet = nthSubnet(base, i).String()
		sim, err := matsim.New(matsim.Options{Fleet: fleet, TLS: tls, FaultControl: true})
		if err != nil {
			return err
		}
		url, err := sim.Start(runCtx, "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer sim.Close()
		if c := sim.Certificate(); c != nil {
			w.trustMatCerts(c)
		}
		expected += sim.BMCs() + fleet.NVOSIPs()
		entries = append(entries, discovery.StaticEntry{Namespace: w.namespace, Name: fmt.Sprintf("mat-%d", i), URL: url})
		fmt.Fprintf(out, "MAT simulator mat-%d      %s/machines/status  (%d devices, %d BMCs with an IP, BMC subnet %s)\n", i, url, sim.Devices(), sim.BMCs(), spec.BMCSubnet)
	}

	// 4. Error events and Services, printed as they happen.
	var errCount atomic.Int64
	var ipHinted atomic.Bool                      // ipTakenHint printed
	var lastPermanent, lastTransient atomic.Int64 // unix nanoseconds of the newest error event of each kind
	seen := map[string]bool{}                     // event ids printed (a re-published event arrives twice)
	nc, err := n.connect("matbus-dev-watch", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	sub, err := nc.Subscribe(events.Subjects{Prefix: n.prefix}.Errors(), func(m *nats.Msg) {
		env, derr := events.Decode(m.Data)
		if derr == nil {
			if seen[env.ID] {
				return
			}
			if len(seen) > 10000 {
				clear(seen)
			}
			seen[env.ID] = true
			if ev, err := events.Into[events.Error](env, events.TypeError); err == nil && ev.Permanent {
				lastPermanent.Store(time.Now().UnixNano())
			} else {
				lastTransient.Store(time.Now().UnixNano())
			}
		}
		errCount.Add(1)
		var b bytes.Buffer
		b.WriteString("ERROR ")
		operator.WriteErrorEvent(&b, m.Subject, m.Data, false)
		if ipTaken(m.Data) && !ipHinted.Swap(true) {
			b.WriteString(ipTakenHint)
		}
		_, _ = out.Write(b.Bytes())
	})
	if err != nil {
		return fmt.Errorf("subscribe to error events: %w", err)
	}
	defer sub.Unsubscribe()
	mine := map[string]bool{}
	for _, en := range entries {
		mine[plan.LabelValue(en.Namespace+"."+en.Name)] = true
	}
	count := watchServices(runCtx, kube, w.namespace, w.managedBy, mine, out, &wg)

	// 5. Discovery publisher (static source; one process, no election).
	pubNC, err := n.connect("matbus-dev-discovery", log)
	if err != nil {
		return err
	}
	conns = append(conns, pubNC)
	n.namespace = w.namespace
	pubBus, err := n.bus(pubNC, "discovery/dev", log, nil)
	if err != nil {
		return err
	}
	if err := pubBus.EnsureStreams(ctx); err != nil {
		return err
	}
	src, err := discovery.NewStatic("dev", entries)
	if err != nil {
		return err
	}
	rep := events.NewReporter(pubBus, log.With("component", "discovery"), "dev-discovery", 0)
	// The publisher and the sources API's passes share the source, as in
	// `matbus discovery`.
	shared := discovery.Share(src)
	if err := shared.Start(runCtx); err != nil {
		return err
	}
	sourcesURL := ""
	if sourceListAddr != "" {
		sources := discovery.NewSourceList(time.Second, log.With("component", "discovery"))
		addr, _, err := discovery.ServeSources(runCtx, sourceListAddr, sources, log.With("component", "discovery"))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "Sources API              http://%s%s\n", addr, discovery.SourcesPath)
		sourcesURL = "http://" + addr.String()
		wg.Add(1)
		go func() { defer wg.Done(); _ = sources.Run(runCtx, shared) }()
	}
	pub := discovery.NewPublisher(pubBus, shared, discovery.PublisherConfig{SyncInterval: interval, Scheduler: discovery.SchedulerConfig{PollInterval: poll, PollMaxInterval: pollMax}}, rep, log.With("component", "discovery"))
	wg.Add(1)
	go func() { defer wg.Done(); _ = pub.Run(runCtx) }()

	// 6. Workers.
	for i := 0; i < workers; i++ {
		o := w
		o.name = fmt.Sprintf("dev-worker-%d", i)
		wnc, err := n.connect("matbus-"+o.name, log)
		if err != nil {
			return err
		}
		conns = append(conns, wnc)
		wlog := log.With("component", "worker")
		bus, err := n.bus(wnc, "worker/"+o.name, wlog, &o)
		if err != nil {
			return err
		}
		wk, _, err := o.build(ctx, bus, kube, wlog)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = wk.Run(runCtx) }()
	}
	stopHint := " Ctrl-C stops."
	if once {
		stopHint = " Exits when they exist (--once)."
	}
	fmt.Fprintf(out, "Pipeline                 1 discovery publisher, %d workers, sync every %s; expecting %d Services.%s\n", workers, interval, expected, stopHint)

	summary := func(stopped string) devSummary {
		return devSummary{Converged: stopped == "converged", Services: count(), Expected: expected, Errors: errCount.Load(),
			ElapsedSeconds: time.Since(start).Round(time.Millisecond).Seconds(), NATSURL: n.url, Kubeconfig: kubeconfig, Namespace: w.namespace, Stopped: stopped}
	}
	next := devNextSteps(devRun{natsURL: n.url, namespace: w.namespace, kubeconfig: kubeconfig, sourcesURL: sourcesURL,
		entries: entries, flags: devPassedFlags(fs, n.prefix)})
	// One line when every expected Service exists, then (without --once)
	// the commands to look at the running pipeline.
	// A run whose Services are not all in place after devNextStepsAfter
	// (an IP taken on a shared cluster, a refused create) prints how far
	// it got and the next steps then, to look at it with.
	inPlace, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		var late <-chan time.Time
		if !once {
			lt := time.NewTimer(devNextStepsAfter)
			defer lt.Stop()
			late = lt.C
		}
		for {
			select {
			case <-runCtx.Done():
				return
			case <-late:
				fmt.Fprintf(out, "%d of %d Services in place after %.0fs (the ERROR lines say why)\n%s", count(), expected, time.Since(start).Seconds(), next)
				next = ""
			case <-t.C:
				if count() >= expected {
					msg := fmt.Sprintf("All %d Services in place after %.1fs\n", expected, time.Since(start).Seconds())
					if !once {
						msg += next
					}
					_, _ = io.WriteString(out, msg)
					close(inPlace)
					return
				}
			}
		}
	}()
	defer func() { <-watched }()
	if !once {
		<-ctx.Done()
		stopAll()
		return nil
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// Every remaining problem is permanent when Services stopped changing,
	// permanent errors came and no transient one, for two sync intervals.
	settle := 2*interval + 5*time.Second
	check := time.NewTicker(500 * time.Millisecond)
	defer check.Stop()
	lastCount, lastChange := count(), time.Now()
	for {
		select {
		case <-ctx.Done():
			stopAll()
			return writeSummary(out, summary("interrupted"), 1)
		case <-deadline.C:
			stopAll()
			return writeSummary(out, summary("timeout"), 1)
		case <-inPlace:
			s := summary("converged")
			stopAll()
			return writeSummary(out, s, 0)
		case now := <-check.C:
			if c := count(); c != lastCount {
				lastCount, lastChange = c, now
			}
			p, tr := lastPermanent.Load(), lastTransient.Load()
			if p != 0 && now.Sub(lastChange) > settle && now.Sub(time.Unix(0, tr)) > settle {
				fmt.Fprintf(out, "Stopping: %d of %d Services in place and every remaining problem is permanent (the ERROR lines above)\n", lastCount, expected)
				s := summary("permanent")
				stopAll()
				return writeSummary(out, s, 1)
			}
		}
	}
}

// devNextStepsAfter is how long a run without --once waits for every
// Service before it prints the next steps anyway (a variable for tests).
var devNextStepsAfter = 30 * time.Second

// devRun is what the next-step commands of a dev run need to know.
type devRun struct {
	natsURL, namespace, kubeconfig string
	// sourcesURL is the sources API's base URL; empty when it is off.
	sourcesURL string
	entries    []discovery.StaticEntry
	// flags are the flags of dev that status, plan and check take too,
	// ready to append (see devPassedFlags).
	flags []string
}

// devNextSteps returns the "Next steps" block dev prints once its
// Services are in place: status, errors, plan, check and kubectl, and a
// curl that makes the last simulator fail (matsim.FaultPath), each a
// command line with this run's addresses that can be pasted as it is
// (run from the repository root, where `make build` puts bin/matbus).
// The README shows the same block.
func devNextSteps(r devRun) string {
	kc := shellQuote(r.kubeconfig)
	var static []string
	for _, e := range r.entries {
		static = append(static, e.Name+"="+e.URL)
	}
	instances := "--namespace " + shellQuote(r.namespace) + " --static " + shellQuote(strings.Join(static, ","))
	extra := ""
	for _, f := range r.flags {
		extra += " " + shellQuote(f)
	}
	status := "bin/matbus status --nats-url " + r.natsURL + " --namespace " + shellQuote(r.namespace) + " --kubeconfig " + kc + extra
	if r.sourcesURL != "" {
		status += " --sources-url " + r.sourcesURL
	}
	var b strings.Builder
	b.WriteString("Next steps (in another terminal, from this folder; Ctrl-C here stops the pipeline):\n")
	for _, c := range []struct{ what, cmd string }{
		{"one row per instance, the Services, the jobs, the discovery leader", status},
		{"error events of the last hour, then new ones as they come (Ctrl-C stops)", "bin/matbus errors --nats-url " + r.natsURL + " --since 1h" + prefixFlag(r.flags)},
		{"what a worker would change (nothing, once in step); writes nothing", "bin/matbus plan --kubeconfig " + kc + " " + instances + " --insecure-skip-verify" + extra},
		{"pre-flight: NATS, Kubernetes API, RBAC, MAT status, IP ranges", "bin/matbus check --nats-url " + r.natsURL + " --kubeconfig " + kc + " " + instances + " --insecure-skip-verify" + extra},
		{"the Services themselves", "KUBECONFIG=" + kc + " kubectl get svc -n " + shellQuote(r.namespace) + " -l " + plan.LabelManagedBy + "=" + devManagedBy(r.flags)},
	} {
		fmt.Fprintf(&b, "  # %s\n  %s\n", c.what, c.cmd)
	}
	if n := len(r.entries); n > 0 {
		last := r.entries[n-1]
		fmt.Fprintf(&b, "  # make %s fail (its status requests answer 500), then run status again; --data none heals it\n  curl -sSk -X PUT --data 500 %s\n",
			last.Name, last.URL+matsim.FaultPath)
	}
	return b.String()
}

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

// prefixFlag returns " --subject-prefix=X" when flags hold one, else "".
func prefixFlag(flags []string) string {
	for _, f := range flags {
		if strings.HasPrefix(f, "--subject-prefix=") {
			return " " + shellQuote(f)
		}
	}
	return ""
}

// devManagedBy returns the --managed-by value in flags, else the default.
func devManagedBy(flags []string) string {
	for _, f := range flags {
		if v, ok := strings.CutPrefix(f, "--managed-by="); ok {
			return shellQuote(v)
		}
	}
	return plan.DefaultManagedBy
}

// shellQuote returns s as one POSIX shell word: as it is when it holds
// only characters no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func writeSummary(out io.Writer, s devSummary, code int) error {
	b, _ := json.Marshal(s)
	fmt.Fprintln(out, string(b))
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

// nthSubnet returns the i-th block of base's size after base (a /20 base
// gives 10.96.64.0/20, 10.96.80.0/20, ...).
// devLogFile returns where dev's process logs go: stderr when verbose,
// else a new file in the temporary folder, which is kept after the run
// (its path is returned, to be printed) so that a failed run can be read;
// closeFn removes it when nothing was logged.
// The output stays for what dev prints itself: each Service change and
// each error event, once.
func devLogFile(verbose bool, stderr io.Writer) (w io.Writer, path string, closeFn func(), err error) {
	if verbose {
		return stderr, "", func() {}, nil
	}
	f, err := os.CreateTemp("", "matbus-dev-*.log")
	if err != nil {
		return nil, "", nil, fmt.Errorf("process log file (or run with -v): %w", err)
	}
	return f, f.Name(), func() {
		// A run that logged nothing (e.g. a refused flag) leaves no file.
		if fi, err := f.Stat(); err == nil && fi.Size() == 0 {
			_ = os.Remove(f.Name())
		}
		_ = f.Close()
	}, nil
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

// ipTakenHint follows the first error event of a BMC or NVOS IP that
// another Service holds: on a cluster shared with another fleet (another
// `dev`, or real BMCs), the fix is another subnet.
const ipTakenHint = "HINT  another Service on this cluster holds that IP (another dev fleet, or real BMCs?): " +
	"start this one with other --bmc-subnet and --nvos-subnet (e.g. --bmc-subnet 10.104.64.0/20, whose NVOS IPs are 10.106.64.0/20) and another --seed\n"

// ipTaken reports whether error event data says that a cluster IP is
// allocated to another Service.
func ipTaken(data []byte) bool {
	return bytes.Contains(data, []byte("already allocated")) || bytes.Contains(data, []byte("is allocated to another"))
}

func nthSubnet(base netip.Prefix, i int) netip.Prefix {
	a := base.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i) << (32 - base.Bits())
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), base.Bits())
}

func ensureNamespace(ctx context.Context, kube kubernetes.Interface, ns string) error {
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

// watchServices prints our Services as they are created, changed and
// deleted, and returns a function counting those of instances (by their
// instance label), so Services of other pipelines in the namespace are not
// counted.
func watchServices(ctx context.Context, kube kubernetes.Interface, ns, managedBy string, instances map[string]bool, out io.Writer, wg *sync.WaitGroup) func() int {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{plan.LabelManagedBy: managedBy}.String()
		}))
	inf := f.Core().V1().Services()
	line := func(op string, s *corev1.Service) {
		ip := s.Spec.ClusterIP
		if len(s.Spec.ExternalIPs) > 0 {
			ip = "external " + s.Spec.ExternalIPs[0]
		}
		fmt.Fprintf(out, "%s service %-42s %-11s %-16s %s\n", op, s.Name, s.Labels[plan.LabelDeviceKind], ip, s.Labels[plan.LabelInstance])
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if s, ok := o.(*corev1.Service); ok {
				line("+", s)
			}
		},
		UpdateFunc: func(a, b any) {
			x, ok1 := a.(*corev1.Service)
			y, ok2 := b.(*corev1.Service)
			if ok1 && ok2 && x.ResourceVersion != y.ResourceVersion {
				line("~", y)
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if s, ok := o.(*corev1.Service); ok {
				line("-", s)
			}
		},
	})
	lister := inf.Lister()
	f.Start(ctx.Done())
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		f.Shutdown()
	}()
	return func() int {
		if !inf.Informer().HasSynced() {
			return 0
		}
		l, _ := lister.Services(ns).List(labels.Everything())
		n := 0
		for _, s := range l {
			if instances[s.Labels[plan.LabelInstance]] {
				n++
			}
		}
		return n
	}
}

// syncWriter serialises writes from several goroutines to one writer.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
