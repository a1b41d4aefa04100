package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/internal/kubeconn"
	"github.com/matbus/matbus/internal/reload"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/kubewatch"
)

// discoveryOpts are the publisher's flags; `dev` shares some.
type discoveryOpts struct {
	selector, scheme, hostMode string
	clusterDomain              string
	static                     cliflag.GivenList
	staticFile, staticName     string
	schedOpts
	leaderElect                      bool
	leaseOwner                       string
	leaseName, leaseNamespace, ident string
	leaseDuration, renewDeadline     time.Duration
	retryPeriod                      time.Duration
	staleAfter                       time.Duration
	sourceListAddr                   string
	sourceListDebounce               time.Duration
	kubeEvents                       bool
}

func (o *discoveryOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.selector, "discovery-selector", discovery.DefaultSelector, "label selector of the MAT API Services to discover")
	fs.StringVar(&o.scheme, "mat-scheme", "https", "scheme of discovered MAT API URLs: https or http")
	fs.StringVar(&o.hostMode, "mat-host-mode", discovery.HostModeDNS, "host of discovered MAT API URLs: dns (<service>.<namespace>.svc.<cluster-domain>, the name the old controller connects to and cluster-issued certificates carry) or cluster-ip (the Service's cluster IP; TLS verification then needs a certificate with that IP)")
	fs.StringVar(&o.clusterDomain, "cluster-domain", discovery.DefaultClusterDomain, "the cluster's DNS domain, in MAT URLs <service>.<namespace>.svc.<domain>")
	fs.Var(&o.static, "static", "static instances instead of Kubernetes discovery: [namespace/]name=url, repeatable or comma separated")
	fs.StringVar(&o.staticFile, "static-file", "", "YAML/JSON list of static instances ({namespace, name, url, pod_name, owner})")
	fs.StringVar(&o.staticName, "static-name", "static", "scope name of the static source; publishers of different scopes never report each other's instances gone")
	o.schedOpts.register(fs, 30*time.Second, "how often every instance gets a full resync (plan and apply even when its status looks unchanged)",
		"how often every instance's status is polled; an unchanged status costs one GET and no Kubernetes request")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "campaign for a Lease so only one publisher runs at a time (needs the Kubernetes API)")
	fs.StringVar(&o.leaseName, "lease-name", "matbus-discovery", "name of the leader-election Lease")
	fs.StringVar(&o.leaseNamespace, "lease-namespace", "", "namespace of the Lease (default: --namespace)")
	fs.StringVar(&o.leaseOwner, "lease-owner-deployment", "", "Deployment (in the Lease's namespace) that owns the Lease: the Lease gets an owner reference to it, so deleting the Deployment (helm uninstall) deletes the Lease; empty: no owner (needs get on apps/v1 deployments)")
	fs.StringVar(&o.ident, "identity", "", "leader-election identity (default: $POD_NAME or the host name)")
	cliflag.DurationVar(fs, &o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a Lease is valid without renewal")
	cliflag.DurationVar(fs, &o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader tries to renew before giving up")
	cliflag.DurationVar(fs, &o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often candidates retry")
	fs.StringVar(&o.sourceListAddr, "source-list-addr", "127.0.0.1:8090", "address of the sources API (GET /v1/sources: the MAT instances this replica's source sees, for the MAT protocol gateway; every replica serves it); loopback only unless set, empty disables")
	fs.DurationVar(&o.sourceListDebounce, "source-list-debounce", 5*time.Second, "a change of the sources API's list is served only when a discovery pass at least this long after it was first seen confirms it (0: at once)")
	o.kubeEvents = true
	if fs.Lookup("kube-events") == nil { // check and plan register the worker's first: one flag for both
		fs.BoolVar(&o.kubeEvents, "kube-events", true, kubeEventsUsage)
	}
	cliflag.DurationVar(fs, &o.staleAfter, "health-stale-after", 10*time.Minute, "the leader is not ready (/readyz 503) when no sync tick read the instances stream and published its events for this long")
}

func (o *discoveryOpts) validate() error {
	if errs := validation.IsDNS1123Subdomain(o.clusterDomain); len(errs) > 0 {
		return fmt.Errorf("%w: --cluster-domain %q is not a DNS name (e.g. %s): %s", errUsage, o.clusterDomain, discovery.DefaultClusterDomain, strings.Join(errs, "; "))
	}
	if err := o.schedOpts.validate(); err != nil {
		return err
	}
	if o.renewDeadline >= o.leaseDuration {
		return fmt.Errorf("%w: --leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration", errUsage)
	}
	if o.staleAfter <= o.interval {
		return fmt.Errorf("%w: --health-stale-after must be longer than --sync-interval", errUsage)
	}
	if o.sourceListDebounce < 0 {
		return fmt.Errorf("%w: --source-list-debounce must not be negative", errUsage)
	}
	if o.static.Given && o.staticFile != "" {
		return fmt.Errorf("%w: give --static or --static-file, not both", errUsage)
	}
	return nil
}

func (o *discoveryOpts) isStatic() bool { return o.static.Given || o.staticFile != "" }

// source builds the static or Kubernetes source. A Kubernetes source
// reports an unusable MAT Service to rep, or as a warning to log without
// one (plan).
func (o *discoveryOpts) source(kube kubernetes.Interface, namespace string, log *slog.Logger, rep *events.Reporter) (discovery.Source, error) {
	if o.isStatic() {
		var entries []discovery.StaticEntry
		var err error
		if o.staticFile != "" {
			if err := reload.CheckReadable("--static-file "+o.staticFile, o.staticFile); err != nil {
				return nil, err
			}
			entries, err = discovery.LoadStaticFile(o.staticFile)
		} else {
			entries, err = discovery.ParseStatic(o.static.List)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		for i := range entries {
			if entries[i].Namespace == "" {
				entries[i].Namespace = namespace
			}
			if entries[i].Namespace != namespace {
				return nil, fmt.Errorf("%w: static instance %s/%s is not in --namespace %q: a pipeline handles the instances of its own namespace (run a publisher per namespace)",
					errUsage, entries[i].Namespace, entries[i].Name, namespace)
			}
		}
		src, err := discovery.NewStatic(o.staticName, entries)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		return src, nil
	}
	if kube == nil {
		return nil, fmt.Errorf("%w: Kubernetes discovery needs --kubeconfig or an in-cluster configuration (or use --static)", errUsage)
	}
	report := func(key, msg string) { log.Warn("discovery", "instance", key, "error", msg) }
	if rep != nil {
		report = func(key, msg string) {
			rep.Report(context.Background(), events.Error{Kind: events.ErrorDiscovery, Instance: key, Message: msg})
		}
	}
	src, err := discovery.NewKube(kube, discovery.KubeConfig{Namespace: namespace, Selector: o.selector,
		Scheme: o.scheme, HostMode: o.hostMode, ClusterDomain: o.clusterDomain, Report: rep}, log, report)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return src, nil
}

func runDiscovery(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("discovery", "Watch for MAT instances and publish instance and sync events (leader-elected).")
	var b baseOpts
	var o discoveryOpts
	var h health.Options
	var namespace string
	b.register(fs)
	o.register(fs)
	fs.StringVar(&namespace, "namespace", "default", "namespace to discover MAT Services in (and of the Lease)")
	h.AddFlags(fs)
	log, err := b.parse(fs, args, e, "discovery", o.validate, asUsage(h.Validate), func() error { return validNamespace(namespace) })
	if err != nil {
		return err
	}
	b.n.namespace = namespace
	kube, err := o.kubeClient(ctx, &b.k, log)
	if err != nil {
		return err
	}
	ident := cmp.Or(o.ident, hostname())
	// A static list is read before anything connects, so a bad one is a
	// usage error with nothing started.
	var src discovery.Source
	if o.isStatic() {
		if src, err = o.source(nil, namespace, log, nil); err != nil {
			return err
		}
	}
	nc, err := b.n.connect("matbus-discovery-"+ident, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := b.n.bus(nc, "discovery/"+ident, log, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	rep := events.NewReporter(bus, log, ident, 0)
	// Static instances have no MAT Service to record Events on.
	kev, err := startKubeEvents(ctx, o.kubeEvents && !o.isStatic(), kube, kubeevents.ControllerDiscovery, log)
	if err != nil {
		return err
	}
	// One source (one informer) for the process's lifetime: every replica,
	// leading or not, makes its own passes for the sources API, and each
	// term as leader publishes from the same source. It starts below and
	// stops when this function returns.
	if src == nil {
		if src, err = o.source(kube, namespace, log, rep); err != nil {
			return err
		}
	}
	d := &discoveryProc{bus: bus, rep: rep, log: log}
	if err := d.serveHealth(ctx, nc, kube, src, &b.k, &o, h); err != nil {
		return err
	}
	ctx, stopSource := context.WithCancel(ctx)
	defer stopSource()
	d.src = discovery.Share(src)
	if err := d.src.Start(ctx); err != nil {
		return err
	}
	if o.sourceListAddr != "" {
		defer discovery.RunSourcesAPI(ctx, o.sourceListAddr, o.sourceListDebounce, d.src, d.log)()
	}
	pcfg := o.publisherConfig(kev)
	if !o.leaderElect {
		return d.lead(ctx, nil, pcfg)
	}
	return discovery.RunElected(ctx, kube, o.leaderConfig(namespace, ident, bus), d.log, func(ctx context.Context, term *discovery.Term) error {
		return d.lead(ctx, term, pcfg)
	})
}

// kubeClient is discovery's Kubernetes client: nil for a static source
// without leader election, which needs none.
func (o *discoveryOpts) kubeClient(ctx context.Context, k *kubeOpts, log *slog.Logger) (kubernetes.Interface, error) {
	if o.isStatic() && !o.leaderElect {
		return nil, nil
	}
	cfg, err := k.restConfig(ctx, log)
	if err != nil {
		if o.leaderElect && o.isStatic() {
			// A kubeconfig that was given but cannot be read is a file
			// error (exit 1), not a usage error: only a missing
			// configuration is the flags' fault.
			if k.Kubeconfig != "" {
				return nil, fmt.Errorf("%v (leader election needs the Kubernetes API; pass --leader-elect=false to run a single publisher without it)", err)
			}
			return nil, fmt.Errorf("%w: %v (leader election needs the Kubernetes API; pass --leader-elect=false to run a single publisher without it)", errUsage, err)
		}
		return nil, err
	}
	cfg.UserAgent = kubeconn.UserAgent(version, "discovery", cmp.Or(o.ident, hostname()))
	return kubeconn.Client(cfg)
}

// leaderConfig is the leader election's configuration from the flags.
func (o *discoveryOpts) leaderConfig(namespace, ident string, bus *events.Bus) discovery.LeaderConfig {
	return discovery.LeaderConfig{Namespace: cmp.Or(o.leaseNamespace, namespace), LeaseName: o.leaseName, Identity: ident, OwnerDeployment: o.leaseOwner,
		LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod, Bus: bus}
}

// discoveryProc is a running discovery process: what it publishes with,
// and what its metrics and readiness read while it leads.
type discoveryProc struct {
	bus     *events.Bus
	rep     *events.Reporter
	log     *slog.Logger
	src     *discovery.SharedSource
	leading atomic.Bool
	sched   atomic.Pointer[discovery.Scheduler]
	cur     atomic.Pointer[health.Lead]
}

// serveHealth registers the process's metrics and serves them with
// /healthz and /readyz (--health-addr) until ctx ends.
func (d *discoveryProc) serveHealth(ctx context.Context, nc *nats.Conn, kube kubernetes.Interface, src discovery.Source, k *kubeOpts, o *discoveryOpts, h health.Options) error {
	var watch *kubewatch.Tracker // the informer's list and watch calls; nil for a static source
	if ks, ok := src.(*discovery.KubeSource); ok {
		watch = ks.WatchHealth()
	}
	reg := health.DiscoveryRegistry(version, health.Revision(commit), d.bus, d.rep, &d.leading, &d.sched, &d.cur, watch)
	k.registerMetrics(reg)
	var probe *health.APIProbe
	if kube != nil {
		probe = health.StartAPIProbe(ctx, kube, 5*time.Second, 5*time.Second, nil, d.log)
	}
	ready := health.DiscoveryReadiness(nc, probe, watch, &d.cur, o.staleAfter)
	if err := health.Start(ctx, h, "discovery", ready, reg, d.log); err != nil {
		return err
	}
	return nil
}

// lead publishes as the leader until ctx ends.
func (d *discoveryProc) lead(ctx context.Context, term *discovery.Term, cfg discovery.PublisherConfig) error {
	d.leading.Store(true)
	defer d.leading.Store(false)
	pub := discovery.NewPublisher(d.bus, d.src, cfg, d.rep, d.log)
	d.sched.Store(pub.Scheduler())
	d.cur.Store(&health.Lead{Publisher: pub, Source: d.src, Since: time.Now()})
	defer d.cur.Store(nil)
	return pub.Lead(ctx, term)
}

// schedOpts are the publisher's scheduling flags, which `discovery` and
// `dev` share (with their own --sync-interval default).
type schedOpts struct {
	interval, poll, probeMax time.Duration
	pollMax                  time.Duration
	pollMaxGiven             bool
}

// register adds the group to fs: --sync-interval (default sync, help
// syncUsage), --poll-interval (help pollUsage), --poll-max-interval and
// --probe-max-interval.
func (o *schedOpts) register(fs *flag.FlagSet, sync time.Duration, syncUsage, pollUsage string) {
	cliflag.DurationVar(fs, &o.interval, "sync-interval", sync, syncUsage)
	cliflag.DurationVar(fs, &o.poll, "poll-interval", time.Second, pollUsage)
	cliflag.GivenDurationVar(fs, &o.pollMax, &o.pollMaxGiven, "poll-max-interval", discovery.DefaultPollMaxInterval, pollMaxUsage)
	cliflag.DurationVar(fs, &o.probeMax, "probe-max-interval", 2*time.Minute, "longest wait between probes of an instance taken out of rotation after failed fetches")
}

// validate checks the intervals against each other and settles
// --poll-max-interval (discovery.PollMaxInterval).
func (o *schedOpts) validate() error {
	if o.interval < time.Second {
		return fmt.Errorf("%w: --sync-interval must be at least 1s", errUsage)
	}
	if o.poll < 100*time.Millisecond || o.poll > o.interval {
		return fmt.Errorf("%w: --poll-interval must be at least 100ms and at most --sync-interval", errUsage)
	}
	var err error
	if o.pollMax, err = discovery.PollMaxInterval(o.poll, o.pollMax, o.pollMaxGiven, o.interval); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.probeMax < o.poll {
		return fmt.Errorf("%w: --probe-max-interval must be at least --poll-interval", errUsage)
	}
	return nil
}

// publisherConfig is the publisher's configuration from the flags (after
// validate); kev (may be nil) records the scheduler's Kubernetes Events.
func (o *schedOpts) publisherConfig(kev *kubeevents.Recorder) discovery.PublisherConfig {
	return discovery.PublisherConfig{SyncInterval: o.interval,
		Scheduler: discovery.SchedulerConfig{PollInterval: o.poll, PollMaxInterval: o.pollMax, SyncInterval: o.interval, ProbeMaxInterval: o.probeMax, Events: kev}}
}

const pollMaxUsage = "longest interval at which an instance is polled while MAT answers its polls 304 Not Modified (it grows from --poll-interval and steps back to it after any change or failure); a MAT without ETags is polled every --poll-interval; equal to --poll-interval turns the stretch off; at most --sync-interval (not set: the default, or --poll-interval when that is longer)"
