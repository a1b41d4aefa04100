package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/kubelocal"
)

// config is the harness's command line.
type config struct {
	Services      int           `json:"services"`
	Simulators    int           `json:"simulators"`
	Workers       []int         `json:"workers"`
	Reactions     int           `json:"reactions"`
	Steady        time.Duration `json:"steady_ns"`
	Idle          time.Duration `json:"idle_ns"`
	Timeout       time.Duration `json:"timeout_ns"`
	SyncInterval  time.Duration `json:"sync_interval_ns,omitempty"`
	WorkerArgs    []string      `json:"worker_args,omitempty"`
	DiscoveryArgs []string      `json:"discovery_args,omitempty"`
	InFlight      int           `json:"floor_in_flight"`
	FloorAsWorker bool          `json:"floor_as_worker,omitempty"`
	Repeat        int           `json:"repeat"`
	Seed          int64         `json:"seed"`
	Neighbour     bool          `json:"neighbour"`
	NeighbourRate float64       `json:"neighbour_rate"`
	MATNoETag     bool          `json:"mat_no_etag,omitempty"`
	PinControl    bool          `json:"pin_control_plane"`
	PprofDir      string        `json:"-"`
	PprofLength   time.Duration `json:"-"`
	PprofDelay    time.Duration `json:"-"` // < 0: profileDelay(PprofLength)
	Matbus        string        `json:"-"`
	NATSServer    string        `json:"-"`
	JSON          string        `json:"-"`
	LogDir        string        `json:"-"`
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("e2e", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	var workers, workerArgs, discoveryArgs string
	fs.IntVar(&c.Services, "services", 2000, "BMC Services in total, spread over --simulators (each simulator serves services/simulators BMCs)")
	fs.IntVar(&c.Simulators, "simulators", 0, fmt.Sprintf("MAT simulators (instances), in-process over HTTPS; 0 picks %d, or more so that none serves more than %d BMCs "+
		"(2,000 Services: 5 × 400; 20,000: 40 × 500)", minSimulators, bmcsPerSimulator))
	fs.StringVar(&workers, "workers", "1,3", "worker counts, comma separated: the whole scenario runs once per count, each on a fresh namespace and nats-server")
	fs.IntVar(&c.Reactions, "reactions", 40, "single-BMC changes of the reaction row (alternately add and remove)")
	fs.DurationVar(&c.Steady, "steady", 60*time.Second, "steady window of the API-request and MAT-GET rows (nothing changes)")
	fs.DurationVar(&c.Idle, "idle", 30*time.Second, "window in which the API server's own requests are counted with no matbus process running (the floor of the API-request row); 0 skips it")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "bound of each wait; a wait that runs out prints \"timeout\" in its row")
	fs.DurationVar(&c.SyncInterval, "sync-interval", 0, "pass --sync-interval to discovery (default: discovery's own default)")
	fs.StringVar(&workerArgs, "worker-args", "", "extra flags for every `matbus worker`, space separated")
	fs.StringVar(&discoveryArgs, "discovery-args", "", "extra flags for `matbus discovery`, space separated")
	fs.IntVar(&c.InFlight, "floor-in-flight", 50, "calls in flight of the raw client-go floor")
	fs.BoolVar(&c.FloorAsWorker, "floor-as-worker", false, "the floor sends its requests as a worker does (protobuf; each delete with its Service's UID and "+
		"resourceVersion as preconditions) while two Service watches follow its namespace (the harness's and one like a worker's informer), as in a round")
	fs.IntVar(&c.Repeat, "repeat", 1, "run the floor and the rounds this many times, alternating (floor, rounds, floor, rounds, …); "+
		"each cell is then the median over the repetitions and its ratio the median of each repetition's value ÷ that repetition's floor")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of the fleets and of the reaction changes")
	fs.BoolVar(&c.Neighbour, "neighbour", true, "measure a noisy neighbour's latency alone, during a QPS-100 client's converge and during matbus's (bench/e2e/neighbour.go)")
	fs.Float64Var(&c.NeighbourRate, "neighbour-rate", 40, "requests per second of the noisy neighbour (ConfigMap PUT, GET and LIST in turn)")
	matETag := fs.Bool("mat-etag", true, "the MAT simulators send ETags and answer If-None-Match with 304 (false: a MAT without conditional requests)")
	fs.BoolVar(&c.PinControl, "pin-control-plane", true, "give kube-apiserver and etcd the first half of the CPUs this process may use and everything else (the floor's client, nats-server, matbus, the simulators) the rest, "+
		"as on a cluster whose control plane has its own cores (bench/e2e/pin.go); skipped, and the run says so, when the process may use fewer than 2 CPUs; false: every process may run on any CPU")
	fs.StringVar(&c.Matbus, "matbus", "bin/matbus", "the matbus binary (make build)")
	fs.StringVar(&c.NATSServer, "nats-server", "", "the nats-server binary (default: nats-server beside kube-apiserver, e.g. .bin/)")
	fs.StringVar(&c.JSON, "json", "", "also write the table and the details as JSON to this file")
	fs.StringVar(&c.PprofDir, "pprof-dir", "", "save CPU profiles to this folder: kube-apiserver's during the floor's creates and its deletes, and kube-apiserver's, nats-server's, discovery's and each worker's during each round's converge and delete fan-out "+
		"(discovery and workers get --profiling; summarize with go tool pprof -top)")
	fs.DurationVar(&c.PprofLength, "pprof-seconds", 20*time.Second, "length of each --pprof-dir profile; it starts --pprof-delay into its phase")
	fs.DurationVar(&c.PprofDelay, "pprof-delay", -1, "how long into its phase each --pprof-dir profile starts (default: 3 s, or a quarter of --pprof-seconds if less; 0: at the phase's start, so a profile at least as long as the phase holds all of it)")
	fs.StringVar(&c.LogDir, "log-dir", "", "keep the processes' logs in this folder (default: a temporary folder, removed)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c.MATNoETag = !*matETag
	var err error
	if c.Workers, err = parseWorkers(workers); err != nil {
		return nil, err
	}
	c.WorkerArgs, c.DiscoveryArgs = strings.Fields(workerArgs), strings.Fields(discoveryArgs)
	if c.Simulators == 0 {
		c.Simulators = autoSimulators(c.Services)
	}
	switch {
	case c.Simulators < 1:
		return nil, errors.New("--simulators must be at least 1")
	case c.Services < c.Simulators:
		return nil, errors.New("--services must be at least --simulators")
	case c.Reactions < 0:
		return nil, errors.New("--reactions must be >= 0")
	case c.NeighbourRate <= 0:
		return nil, errors.New("--neighbour-rate must be positive")
	case c.InFlight < 1:
		return nil, errors.New("--floor-in-flight must be >= 1")
	case c.Repeat < 1:
		return nil, errors.New("--repeat must be >= 1")
	case c.Steady <= 0 || c.Timeout <= 0 || c.Idle < 0:
		return nil, errors.New("--steady and --timeout must be positive, --idle >= 0")
	case c.SyncInterval < 0:
		return nil, errors.New("--sync-interval must be positive")
	case c.PprofLength < time.Second:
		return nil, errors.New("--pprof-seconds must be at least 1s")
	}
	return c, nil
}

// minSimulators and bmcsPerSimulator shape the default --simulators: at
// least 5 MAT instances, and at most 500 BMCs each, as MAT deployments of
// users' sites are (20,000 Services: 40 instances).
const (
	minSimulators    = 5
	bmcsPerSimulator = 500
)

// autoSimulators is the default --simulators for n Services (never more
// than n, at least 1).
func autoSimulators(n int) int {
	return max(1, min(n, max(minSimulators, (n+bmcsPerSimulator-1)/bmcsPerSimulator)))
}

func main() {
	if code, ran := simHostMain(); ran {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { // a second Ctrl-C ends the harness at once
		<-ctx.Done()
		stop()
	}()
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/e2e:", err)
		os.Exit(2)
	}
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench/e2e:", err)
		os.Exit(1)
	}
}

// bench is one run: the shared API server, the admin client and what the
// harness measured so far.
type bench struct {
	cfg     *config
	stderr  io.Writer
	start   time.Time
	dir     string // process logs and NATS stores
	cluster *kubelocal.Cluster
	audit   auditLog             // the API server's audit log
	kube    kubernetes.Interface // admin, counted in reqs
	raw     kubernetes.Interface // admin without a client-side rate limit (the floor)
	// watch is the tracker's client: protobuf, the cheapest encoding of
	// the watch events it costs the API server in the pipeline's phases
	// (the floor's phases have no watch).
	watch  kubernetes.Interface
	reqs   atomic.Int64 // requests the harness itself sent to the API server
	roles  roles        // the matbus processes running, for the CPU rows
	fleets *fleets
	result *result
	mu     sync.Mutex
	dirty  []string // namespaces cleanNamespace could not empty
}

func run(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	b := &bench{cfg: cfg, stderr: stderr, start: time.Now()}
	pin, unpinned, err := choosePin(cfg.PinControl)
	if err != nil {
		return err
	}
	b.logf("%s", cpusLine(pin, unpinned))
	tmp, err := os.MkdirTemp("", "matbus-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b.dir = tmp
	if cfg.LogDir != "" {
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			return err
		}
		b.dir = cfg.LogDir
	}
	if cfg.PprofDir != "" {
		if err := os.MkdirAll(cfg.PprofDir, 0o755); err != nil {
			return err
		}
	}
	binDir, err := kubelocal.FindBinaries()
	if err != nil {
		return err
	}
	if cfg.NATSServer == "" {
		cfg.NATSServer = filepath.Join(binDir, "nats-server")
	}
	for _, p := range []string{cfg.Matbus, cfg.NATSServer} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (run `make tools build`)", err)
		}
	}
	b.result = &result{Config: cfg, Machine: machine(), Pinned: pin, Unpinned: unpinned}
	if err := b.readDefaults(ctx); err != nil {
		return err
	}
	if b.fleets, err = makeFleets(splitSizes(cfg.Services, cfg.Simulators), cfg.Reactions, cfg.Seed); err != nil {
		return err
	}

	t := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	b.cluster, err = kubelocal.Start(sctx, kubelocal.Config{BinDir: binDir, Audit: true})
	cancel()
	if err != nil {
		return err
	}
	defer b.cluster.Stop()
	ready := ""
	if pin != nil {
		if err := pin.apply(); err != nil {
			return fmt.Errorf("%w (--pin-control-plane=false runs unpinned)", err)
		}
		ready = fmt.Sprintf(", pinned to CPU %v", pin.Control)
	}
	b.audit = auditLog{path: b.cluster.AuditLog}
	b.logf("kube-apiserver + etcd ready at %s in %s%s", b.cluster.URL, since(t), ready)
	if err := b.clients(); err != nil {
		return err
	}

	err = b.scenario(ctx)
	if ctx.Err() != nil {
		b.result.Interrupted = context.Cause(ctx).Error()
	}
	table := b.result.table()
	fmt.Fprint(stdout, table)
	if cfg.JSON != "" {
		b.result.Markdown = table
		js, jerr := json.MarshalIndent(b.result, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(cfg.JSON, append(js, '\n'), 0o644)
		}
		err = errors.Join(err, jerr)
	}
	return err
}

// scenario runs --repeat repetitions of: the floor, then one round per
// worker count. The idle API server is measured once, after the first
// floor (by then the API server's start-up work is over). It stops early
// (without an error) when ctx ends.
func (b *bench) scenario(ctx context.Context) error {
	for rep := 1; rep <= b.cfg.Repeat; rep++ {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if b.cfg.Repeat > 1 {
			b.logf("repetition %d of %d", rep, b.cfg.Repeat)
		}
		if err := b.clean(); err != nil {
			return err
		}
		if err := b.floor(ctx, rep); err != nil {
			return err
		}
		if err := b.neighbourFloor(ctx, rep); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if rep == 1 && b.cfg.Idle > 0 {
			t := time.Now()
			w, err := b.apiWindow(ctx, b.cfg.Idle, nil)
			if err != nil {
				return err
			}
			b.result.Idle = &w
			b.logf("idle API server: %.1f requests/min over %s (%s)", w.PerMinute, since(t), orNone(w.Raw.String()))
		}
		for col, n := range b.cfg.Workers {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if err := b.clean(); err != nil {
				return err
			}
			r := &roundResult{Workers: n, Repeat: rep, Column: col}
			b.result.Rounds = append(b.result.Rounds, r)
			if err := b.round(ctx, r); err != nil {
				return fmt.Errorf("%d worker(s): %w", n, err)
			}
		}
	}
	return context.Cause(ctx)
}

// clean fails when an earlier phase left Services behind (cleanNamespace):
// their cluster IPs are those the next phase creates.
func (b *bench) clean() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.dirty) > 0 {
		return fmt.Errorf("namespace(s) %v still hold Services after --timeout %s: the next phase would find their cluster IPs taken (raise --timeout)", b.dirty, b.cfg.Timeout)
	}
	return nil
}

// countingTransport counts the harness's own API requests, except GET
// /metrics, which the API server does not count in apiserver_request_total.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path != "/metrics" {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

func (b *bench) clients() error {
	wrap := func(cfg *rest.Config) *rest.Config {
		cfg.UserAgent = "matbus-bench-e2e"
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &b.reqs} }
		return cfg
	}
	cfg := wrap(b.cluster.RESTConfig())
	cfg.QPS, cfg.Burst = 500, 1000
	var err error
	if b.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	watch := wrap(b.cluster.RESTConfig())
	watch.QPS, watch.Burst = 500, 1000
	watch.ContentType = "application/vnd.kubernetes.protobuf"
	watch.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	if b.watch, err = kubernetes.NewForConfig(watch); err != nil {
		return err
	}
	raw := wrap(b.cluster.RESTConfig())
	raw.QPS = -1 // no client-side rate limit
	if b.cfg.FloorAsWorker {
		raw.ContentType = watch.ContentType
		raw.AcceptContentTypes = watch.AcceptContentTypes
	}
	b.raw, err = kubernetes.NewForConfig(raw)
	return err
}

// readDefaults reads the flag defaults of `matbus worker` and `matbus
// discovery` from their --help, so the table says what it ran with.
func (b *bench) readDefaults(ctx context.Context) error {
	b.result.Defaults = map[string]map[string]string{}
	for _, sub := range []string{"worker", "discovery"} {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := exec.CommandContext(cctx, b.cfg.Matbus, sub, "--help").CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("%s %s --help: %w\n%s", b.cfg.Matbus, sub, err, out)
		}
		b.result.Defaults[sub] = parseHelpDefaults(string(out))
	}
	out, err := exec.CommandContext(ctx, b.cfg.Matbus, "version").Output()
	if err == nil {
		b.result.Version = strings.TrimSpace(string(out))
	}
	return nil
}

// floor measures repetition rep's (from 1) floor: raw creates, then raw deletes of
// the same Services, in a namespace of its own.
func (b *bench) floor(ctx context.Context, rep int) error {
	ns := fmt.Sprintf("bench-floor-r%d", rep)
	if err := b.createNamespace(ctx, ns); err != nil {
		return err
	}
	defer b.cleanNamespace(ns)
	svcs := floorServices(ns, b.fleets.base)
	f := &floorResult{Services: len(svcs), Repeat: rep}
	b.result.Floors = append(b.result.Floors, f)
	if b.cfg.FloorAsWorker {
		wctx, stop := context.WithCancel(ctx)
		defer stop() // ends both watches
		for _, kube := range []kubernetes.Interface{b.watch, b.raw} {
			if _, err := startTracker(wctx, kube, ns); err != nil {
				return err
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	ccpu, _ := b.sampleCPU()
	prof := b.profile(cctx, fmt.Sprintf("r%d floor create", rep))
	f.Create = floorCreate(cctx, b.raw, svcs, b.cfg.InFlight)
	f.CreateCPU = ccpu.Since(f.Create.Seconds)
	prof()
	cancel()
	b.logf("floor: %d raw creates, %d in flight: %.2fs (%d failed)", len(svcs), b.cfg.InFlight, f.Create.Seconds, f.Create.Failed)
	if ctx.Err() != nil {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	req0, _ := b.scrape(ctx)
	cpu0, _ := b.sampleCPU()
	prof = b.profile(dctx, fmt.Sprintf("r%d floor delete", rep))
	f.Delete = floorDelete(dctx, b.raw, svcs, b.cfg.InFlight, b.cfg.FloorAsWorker)
	f.DeleteCPU = cpu0.Since(f.Delete.Seconds)
	prof()
	cancel()
	if req1, err := b.scrape(ctx); err == nil && req0 != nil {
		f.DeleteAPI = req1.Sub(req0)
	}
	b.logf("floor: %d raw deletes, %d in flight: %.2fs (%d failed); CPU: %s; API requests: %s", len(svcs), b.cfg.InFlight, f.Delete.Seconds, f.Delete.Failed, f.DeleteCPU, f.DeleteAPI)
	return nil
}

func (b *bench) createNamespace(ctx context.Context, ns string) error {
	_, err := b.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

// cleanNamespace deletes every Service left in ns (no controller-manager
// runs to empty a terminating namespace, and the cluster IPs must be free
// for the next round), then ns. It gives up after --timeout (20,000 deletes
// take minutes at 20,000 Services) and then records ns in b.dirty: the
// next phase would find its cluster IPs taken, so the run stops there.
func (b *bench) cleanNamespace(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	defer cancel()
	svcs := b.raw.CoreV1().Services(ns)
	for ctx.Err() == nil {
		list, err := svcs.List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			break
		}
		if err == nil {
			items := make([]*corev1.Service, len(list.Items))
			for i := range list.Items {
				items[i] = &list.Items[i]
			}
			floorDelete(ctx, b.raw, items, b.cfg.InFlight, false)
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		b.logf("cleanup: Services of %s not all gone after %s", ns, b.cfg.Timeout)
		b.mu.Lock()
		b.dirty = append(b.dirty, ns)
		b.mu.Unlock()
	}
	if err := b.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		b.logf("cleanup: delete namespace %s: %v", ns, err)
	}
}

// apiWindow counts the API server's requests over d: the difference of
// apiserver_request_total between two scrapes (which it does not count),
// less the requests the harness itself sent in between. during,
// if not nil, is called right after the first scrape and again right
// before the second with false.
func (b *bench) apiWindow(ctx context.Context, d time.Duration, during func(start bool)) (apiWindow, error) {
	before := b.reqs.Load()
	offset := b.audit.Offset()
	c1, err := b.scrape(ctx)
	if err != nil {
		return apiWindow{}, err
	}
	t1 := time.Now()
	if during != nil {
		during(true)
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	if during != nil {
		during(false)
	}
	own := b.reqs.Load() - before
	t2 := time.Now()
	elapsed := t2.Sub(t1)
	c2, err := b.scrape(context.WithoutCancel(ctx))
	if err != nil {
		return apiWindow{}, err
	}
	raw := c2.Sub(c1)
	w := apiWindow{Seconds: elapsed.Seconds(), Raw: raw, Harness: own, Interrupted: ctx.Err() != nil}
	w.PerMinute = (raw.Total() - float64(own)) / elapsed.Minutes()
	if b.audit.path != "" {
		time.Sleep(auditGrace)
		if w.Audit, err = b.audit.Window(offset, t1, t2); err != nil {
			b.logf("%v", err)
		}
	}
	return w, nil
}

func (b *bench) scrape(ctx context.Context) (requestCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body, err := b.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-apiserver /metrics: %w", err)
	}
	return parseRequestTotal(string(body))
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.stderr, "[%7s] %s\n", since(b.start), fmt.Sprintf(format, args...))
}

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }

// machine describes where the run happened.
func machine() string {
	return fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
}
