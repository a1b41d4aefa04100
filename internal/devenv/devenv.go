package devenv

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// Config is one dev run, from cmd/matbus's flags.
type Config struct {
	// Fleets are the simulators' fleets (see Fleets), one simulator each.
	Fleets []Fleet
	// TLS has the simulators serve HTTPS with self-signed certificates.
	TLS bool
	// NATSHost and NATSPort are the embedded NATS server's address (port
	// 0 picks a free one); Prefix is the subject prefix.
	NATSHost string
	NATSPort int
	Prefix   string
	// Namespace holds the BMC Services, whose managed-by label is ManagedBy.
	Namespace, ManagedBy string
	// Kubeconfig names a cluster to use; empty starts a local etcd +
	// kube-apiserver whose data lives in StateDir (empty: a temporary
	// folder, removed on exit).
	Kubeconfig, StateDir string
	// SourceListAddr is the sources API's address; empty disables it.
	SourceListAddr string
	// Publisher is the discovery publisher's configuration (the same
	// conversion of the flags as `matbus discovery`'s).
	Publisher discovery.PublisherConfig
	// Workers is how many workers run.
	Workers int
	// Once stops the run when every Service is in place (or after
	// Timeout, or when every remaining problem is permanent), printing a
	// JSON Summary.
	Once    bool
	Timeout time.Duration
	// NextStepsAfter is how long a run without Once waits for every
	// Service before it prints the next steps anyway.
	NextStepsAfter time.Duration
	// PassedFlags are the flags status, plan and check must be given too,
	// as --name=value, for the next-step commands.
	PassedFlags []string
	// Out receives what dev prints (one writer; Run serialises its
	// goroutines' writes). Log receives the process logs.
	Out io.Writer
	Log *slog.Logger
}

// Parts builds what dev runs from cmd/matbus's flag conversions.
type Parts struct {
	// RESTConfig is the client configuration of Config.Kubeconfig.
	RESTConfig func(ctx context.Context) (*rest.Config, error)
	// LocalCluster is told the local API server's configuration (to set
	// the client-side limits on) and service range, once it runs.
	LocalCluster func(cfg *rest.Config, serviceCIDR string)
	// TrustMAT adds a simulator's self-signed certificate to the roots MAT
	// certificates are verified against.
	TrustMAT func(*x509.Certificate)
	// Connect dials the NATS server at url as name.
	Connect func(url, name string) (*nats.Conn, error)
	// DiscoveryBus is the publisher's bus on nc, in Config.Namespace.
	DiscoveryBus func(nc *nats.Conn) (*events.Bus, error)
	// Worker builds the worker called name on nc and kube; it runs until
	// the context given to Run ends.
	Worker func(ctx context.Context, name string, nc *nats.Conn, kube kubernetes.Interface) (Runner, error)
}

// Runner is a part that runs until its context ends (a worker).
type Runner interface {
	Run(ctx context.Context) error
}

// ErrStopped is Run's error when Once ended before every Service was in
// place (timeout, interrupted, permanent problems); the JSON summary says
// which.
var ErrStopped = errors.New("dev stopped before every Service was in place")

// Summary is the final JSON line of a run with Once.
type Summary struct {
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

// devRun is one run's state while it starts; its cleanups run in reverse.
type devRun struct {
	cfg   Config
	parts Parts
	out   io.Writer
	log   *slog.Logger
	start time.Time

	natsURL, kubeconfig string
	kube                kubernetes.Interface
	entries             []discovery.StaticEntry
	expected            int
	sourcesURL          string
	errs                *errorWatch
	count               func() int

	runCtx  context.Context
	stopAll context.CancelFunc
	wg      sync.WaitGroup
	// conns close only after every goroutine has stopped: discovery marks
	// its leader entry ended and workers settle their jobs on the way out,
	// over those connections.
	conns    []*nats.Conn
	cleanups []func()
}

// Run runs the pipeline until ctx ends (or, with Once, until it
// converges or gives up) and removes everything it started.
func Run(ctx context.Context, cfg Config, parts Parts) error {
	r := &devRun{cfg: cfg, parts: parts, out: &syncWriter{w: cfg.Out}, log: cfg.Log, start: time.Now()}
	defer func() {
		for i := len(r.cleanups) - 1; i >= 0; i-- {
			r.cleanups[i]()
		}
	}()
	for _, step := range []func(context.Context) error{r.startNATS, r.startKube, r.startSimulators, r.watch, r.startDiscovery, r.startWorkers} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return r.await(ctx)
}

func (r *devRun) defer_(f func()) { r.cleanups = append(r.cleanups, f) }

// startNATS starts the embedded NATS server.
func (r *devRun) startNATS(context.Context) error {
	ns, err := natsserver.Start(natsserver.Options{Host: r.cfg.NATSHost, Port: r.cfg.NATSPort})
	if err != nil {
		return fmt.Errorf("embedded NATS on port %d: %w (is another one running? try --nats-port 0)", r.cfg.NATSPort, err)
	}
	r.defer_(ns.Shutdown)
	r.natsURL = ns.ClientURL()
	watch := "bin/matbus errors --nats-url " + r.natsURL
	if r.cfg.Prefix != events.DefaultPrefix {
		watch += " --subject-prefix " + r.cfg.Prefix
	}
	fmt.Fprintf(r.out, "NATS with JetStream      %s   (watch errors: %s)\n", r.natsURL, watch)
	return nil
}

// startKube connects to Config.Kubeconfig's cluster or starts a local
// one, and creates the namespace.
func (r *devRun) startKube(ctx context.Context) error {
	var cfg *rest.Config
	var err error
	r.kubeconfig = r.cfg.Kubeconfig
	if r.kubeconfig != "" {
		if cfg, err = r.parts.RESTConfig(ctx); err != nil {
			return err
		}
		fmt.Fprintf(r.out, "Kubernetes               %s (from %s)\n", cfg.Host, r.kubeconfig)
	} else if cfg, err = r.startLocalKube(ctx); err != nil {
		return err
	}
	if r.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	_, err = r.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.cfg.Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", r.cfg.Namespace, err)
	}
	fmt.Fprintf(r.out, "Services                 KUBECONFIG=%s kubectl get svc -n %s -l %s=%s\n", r.kubeconfig, r.cfg.Namespace, plan.LabelManagedBy, r.cfg.ManagedBy)
	return nil
}

// startLocalKube starts a local etcd + kube-apiserver, in a temporary
// state folder unless Config.StateDir names one.
func (r *devRun) startLocalKube(ctx context.Context) (*rest.Config, error) {
	fmt.Fprintf(r.out, "Kubernetes               starting a local etcd + kube-apiserver ...\n")
	dir := r.cfg.StateDir
	if dir == "" {
		// State of runs killed with SIGKILL goes first; this run's goes on exit.
		removed, err := removeStaleDevState(os.TempDir())
		if err != nil {
			r.log.Warn("stale state of earlier runs not removed", "error", err)
		}
		for _, d := range removed {
			fmt.Fprintf(r.out, "Removed the state of a killed run: %s\n", d)
		}
		var remove func()
		if dir, remove, err = newDevState(os.TempDir()); err != nil {
			return nil, err
		}
		r.defer_(remove)
	}
	cl, err := kubelocal.Start(ctx, kubelocal.Config{Dir: dir, Log: r.log})
	if err != nil {
		return nil, fmt.Errorf("local Kubernetes: %w", err)
	}
	r.defer_(cl.Stop)
	cfg := cl.RESTConfig()
	r.parts.LocalCluster(cfg, cl.ServiceCIDR)
	r.kubeconfig = cl.Kubeconfig
	fmt.Fprintf(r.out, "Kubernetes               %s (service range %s)\n", cl.URL, cl.ServiceCIDR)
	return cfg, nil
}

// startSimulators starts one simulator per fleet. From here on the
// pipeline's goroutines run under runCtx.
func (r *devRun) startSimulators(ctx context.Context) error {
	r.runCtx, r.stopAll = context.WithCancel(ctx)
	r.defer_(func() {
		r.stopAll()
		r.wg.Wait()
		for _, c := range r.conns {
			c.Close()
		}
	})
	for i, f := range r.cfg.Fleets {
		sim, err := matsim.New(matsim.Options{Fleet: f.Fleet, TLS: r.cfg.TLS, FaultControl: true})
		if err != nil {
			return err
		}
		url, err := sim.Start(r.runCtx, "127.0.0.1:0")
		if err != nil {
			return err
		}
		r.defer_(func() { _ = sim.Close() })
		if c := sim.Certificate(); c != nil {
			r.parts.TrustMAT(c)
		}
		r.expected += sim.BMCs() + f.Fleet.NVOSIPs()
		r.entries = append(r.entries, discovery.StaticEntry{Namespace: r.cfg.Namespace, Name: fmt.Sprintf("mat-%d", i), URL: url})
		fmt.Fprintf(r.out, "MAT simulator mat-%d      %s/machines/status  (%d devices, %d BMCs with an IP, BMC subnet %s)\n", i, url, sim.Devices(), sim.BMCs(), f.BMCSubnet)
	}
	return nil
}

// watch prints error events and our Services as they happen.
func (r *devRun) watch(context.Context) error {
	nc, err := r.parts.Connect(r.natsURL, "matbus-dev-watch")
	if err != nil {
		return err
	}
	r.defer_(nc.Close)
	r.errs = &errorWatch{out: r.out, seen: map[string]bool{}}
	sub, err := nc.Subscribe(events.Subjects{Prefix: r.cfg.Prefix}.Errors(), r.errs.handle)
	if err != nil {
		return fmt.Errorf("subscribe to error events: %w", err)
	}
	r.defer_(func() { _ = sub.Unsubscribe() })
	mine := map[string]bool{}
	for _, en := range r.entries {
		mine[plan.LabelValue(en.Namespace+"."+en.Name)] = true
	}
	r.count = watchServices(r.runCtx, r.kube, r.cfg.Namespace, r.cfg.ManagedBy, mine, r.out, &r.wg)
	return nil
}

// startDiscovery runs the discovery publisher on a static source of the
// simulators (one process, no election) and the sources API.
func (r *devRun) startDiscovery(ctx context.Context) error {
	nc, err := r.parts.Connect(r.natsURL, "matbus-dev-discovery")
	if err != nil {
		return err
	}
	r.conns = append(r.conns, nc)
	bus, err := r.parts.DiscoveryBus(nc)
	if err != nil {
		return err
	}
	if err := bus.EnsureStreams(ctx); err != nil {
		return err
	}
	src, err := discovery.NewStatic("dev", r.entries)
	if err != nil {
		return err
	}
	log := r.log.With("component", "discovery")
	rep := events.NewReporter(bus, log, "dev-discovery", 0)
	// The publisher and the sources API's passes share the source, as in
	// `matbus discovery`.
	shared := discovery.Share(src)
	if err := shared.Start(r.runCtx); err != nil {
		return err
	}
	if r.cfg.SourceListAddr != "" {
		sources := discovery.NewSourceList(time.Second, log)
		addr, _, err := discovery.ServeSources(r.runCtx, r.cfg.SourceListAddr, sources, log)
		if err != nil {
			return err
		}
		fmt.Fprintf(r.out, "Sources API              http://%s%s\n", addr, discovery.SourcesPath)
		r.sourcesURL = "http://" + addr.String()
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = sources.Run(r.runCtx, shared) }()
	}
	pub := discovery.NewPublisher(bus, shared, r.cfg.Publisher, rep, log)
	r.wg.Add(1)
	go func() { defer r.wg.Done(); _ = pub.Run(r.runCtx) }()
	return nil
}

// startWorkers runs Config.Workers workers.
func (r *devRun) startWorkers(ctx context.Context) error {
	for i := 0; i < r.cfg.Workers; i++ {
		name := fmt.Sprintf("dev-worker-%d", i)
		nc, err := r.parts.Connect(r.natsURL, "matbus-"+name)
		if err != nil {
			return err
		}
		r.conns = append(r.conns, nc)
		wk, err := r.parts.Worker(ctx, name, nc, r.kube)
		if err != nil {
			return err
		}
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = wk.Run(r.runCtx) }()
	}
	stopHint := " Ctrl-C stops."
	if r.cfg.Once {
		stopHint = " Exits when they exist (--once)."
	}
	fmt.Fprintf(r.out, "Pipeline                 1 discovery publisher, %d workers, sync every %s; expecting %d Services.%s\n",
		r.cfg.Workers, r.cfg.Publisher.SyncInterval, r.expected, stopHint)
	return nil
}
