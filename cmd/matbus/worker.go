package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/internal/kubeconn"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// workerOpts are the worker's flags; `dev` shares them.
type workerOpts struct {
	namespace, targetSelector, managedBy, ipMode, name string
	serviceCIDRs                                       cliflag.List
	insecure, stateAnnotations, kubeEvents             bool
	matTimeout, retryMaxElapsed, grace, ackWait        time.Duration
	matBodyMaxAge                                      time.Duration
	instanceResync                                     time.Duration
	jobs, fetches, deleteJobs, concurrency, maxDeliver int
	errorWindow                                        time.Duration
	// holdShare and holdWindow are the mass-disappearance rule
	// (--delete-hold-share, --delete-hold-window).
	holdShare  float64
	holdWindow time.Duration
	// matCAFile is --mat-ca-file: a PEM bundle of CAs MAT certificates are
	// verified against, besides the system roots.
	matCAFile string
	// matTrust is what MAT certificates are verified against (loadMatRoots:
	// the system roots, --mat-ca-file kept current, and dev's simulators).
	matTrust *matclient.Trust
	// metrics, when set (runWorker), receives the worker's measurements.
	metrics *worker.Metrics
	// kube is the adaptive Kubernetes limit (runWorker; nil when fixed).
	kube worker.KubeWindow
}

func (o *workerOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.namespace, "namespace", "default", "namespace of the BMC Services (and of discovered MAT Services)")
	fs.StringVar(&o.targetSelector, "target-selector", plan.DefaultTargetSelector, "selector of the MAT pods the BMC Services point at, key=value[,key=value] (the old controller's default; the pod name is added)")
	fs.StringVar(&o.managedBy, "managed-by", plan.DefaultManagedBy, "value of app.kubernetes.io/managed-by on our Services (the old controller's value, so its Services are adopted)")
	fs.StringVar(&o.ipMode, "bmc-ip-mode", string(plan.IPModeClusterIP), "where the BMC IP goes: cluster-ip (spec.clusterIP) or external-ip (spec.externalIPs)")
	fs.StringVar(&o.name, "worker-name", "", "name of this worker in logs and error events (default: $POD_NAME or the host name)")
	fs.Var(&o.serviceCIDRs, "service-cidr", "the cluster's service IP range(s), to tell an allocated cluster IP (retried) from one out of range (permanent); repeatable")
	fs.BoolVar(&o.insecure, "insecure-skip-verify", false, "do not verify MAT's TLS certificates (for MAT instances serving self-signed ones); by default they are verified against the URL's host name, the system roots and --mat-ca-file")
	fs.StringVar(&o.matCAFile, "mat-ca-file", "", "PEM bundle of the CA(s) that issue MAT's certificates (e.g. a cert-manager CA's ca.crt), trusted besides the system roots; re-read when it changes (a mounted Secret's update included), and at once when a MAT certificate's issuer is unknown; a missing or broken file keeps the last good bundle, with a warning")
	fs.BoolVar(&o.stateAnnotations, "enable-state-annotations", true, "write the mat-api-state and mat-power-state annotations, as the old controller does (each power flip costs a Service write); false removes them at the next sync")
	cliflag.DurationVar(fs, &o.matTimeout, "mat-timeout", 10*time.Second, "timeout of one MAT status request")
	cliflag.OffDurationVar(fs, &o.matBodyMaxAge, "mat-body-max-age", defaultMATBodyMaxAge, matBodyMaxAgeUsage)
	cliflag.DurationVar(fs, &o.retryMaxElapsed, "retry-max-elapsed", time.Minute, "how long one Kubernetes write is retried with backoff")
	cliflag.DurationVar(fs, &o.grace, "shutdown-grace", 10*time.Second, "how long in-flight jobs may finish after SIGTERM; the rest are redelivered")
	cliflag.DurationVar(fs, &o.instanceResync, "instance-resync", time.Minute, "how often the client cache is checked against the instances stream, and the Services of instances gone for two such periods are cleaned up again")
	cliflag.DurationVar(fs, &o.ackWait, "ack-wait", 30*time.Second, "JetStream AckWait of the job consumers (progress is reported at a third of it)")
	fs.IntVar(&o.jobs, "jobs", 8, "sync jobs one worker plans and applies at once (a job waiting for MAT holds no such slot)")
	fs.IntVar(&o.fetches, "fetches", 32, "sync jobs one worker takes at once, most of them waiting for a MAT status or finding it unchanged")
	fs.IntVar(&o.deleteJobs, "delete-jobs", 0, "delete jobs one worker runs at once, at most; with --kube-rate=adaptive they follow the API server: its current in-flight limit and a quarter more. 0: 2 × --kube-max-inflight with adaptive, 32 with fixed")
	fs.IntVar(&o.concurrency, "concurrency", 0, "Kubernetes writes one worker has started, over all its jobs (with --kube-rate=adaptive those beyond its in-flight limit wait for a slot). 0: 2 × --kube-max-inflight with adaptive, 32 with fixed")
	fs.IntVar(&o.maxDeliver, "max-deliver", 5, "deliveries of one job before it becomes an error event")
	cliflag.DurationVar(fs, &o.errorWindow, "error-window", 30*time.Second, "error events for the same kind and target are limited to one per window")
	fs.BoolVar(&o.kubeEvents, "kube-events", true, kubeEventsUsage)
	fs.Float64Var(&o.holdShare, "delete-hold-share", plan.DefaultHoldShare, "share of an instance's Services (0 < share <= 1) that one status must take away at once, at least 2 of them, "+
		"for their deletes to be held for --delete-hold-window; a status that takes all of them, or comes with a new epoch_id and takes 2 or more, is held too")
	cliflag.OffDurationVar(fs, &o.holdWindow, "delete-hold-window", plan.DefaultHoldWindow, holdWindowUsage)
}

const holdWindowUsage = "how long the deletes of a mass disappearance (see --delete-hold-share) wait before a status fetched after it confirms them; a device that comes back in time keeps its Service. " +
	"A restarting MAT serves an empty inventory under a new epoch_id and then registers its machines one by one, which takes seconds to minutes for hundreds of them: " +
	"the default covers that with a margin (the Kubernetes node lifecycle controller's eviction grace); 0 deletes at once (off)"

// holdRule is the worker's plan.HoldRule.
func (o *workerOpts) holdRule() plan.HoldRule {
	return plan.HoldRule{Share: o.holdShare, Window: o.holdWindow}
}

// defaultMATBodyMaxAge is --mat-body-max-age's default: ten full resyncs
// at the default --sync-interval revalidate the kept body, the eleventh
// fetches it whole (ADR 23).
const defaultMATBodyMaxAge = 5 * time.Minute

const matBodyMaxAgeUsage = "how long a full resync may revalidate the status body this worker holds (If-None-Match; MAT answers 304 and sends no body) instead of fetching it whole; a MAT whose ETag failed to change is still read whole this often; 0 fetches every full resync whole. Only MATs that send strong ETags are affected"

// validNamespace checks --namespace: a DNS label, as Kubernetes wants of
// a namespace's name and events.Key of an instance key's namespace part.
func validNamespace(ns string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("%w: --namespace %q is not a DNS label: %s", errUsage, ns, strings.Join(errs, "; "))
	}
	return nil
}

func (o *workerOpts) validate() error {
	if o.jobs <= 0 || o.fetches <= 0 || o.maxDeliver <= 0 || o.deleteJobs < 0 || o.concurrency < 0 {
		return fmt.Errorf("%w: --jobs, --fetches and --max-deliver must be positive; --delete-jobs and --concurrency positive, or 0 for the default", errUsage)
	}
	if _, err := plan.ParseIPMode(o.ipMode); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := validNamespace(o.namespace); err != nil {
		return err
	}
	if _, err := worker.ParseCIDRs(o.serviceCIDRs); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	sel, err := plan.ParseTargetSelector(o.targetSelector)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if len(sel) == 0 {
		return fmt.Errorf("%w: --target-selector is empty: name the MAT pods' labels, key=value[,key=value] (the old controller's is %s)", errUsage, plan.DefaultTargetSelector)
	}
	if err := o.holdRule().Validate(); err != nil {
		return fmt.Errorf("%w: --delete-hold-share, --delete-hold-window: %v", errUsage, err)
	}
	if errs := validation.IsValidLabelValue(o.managedBy); o.managedBy == "" || len(errs) > 0 {
		return fmt.Errorf("%w: --managed-by %q is not a valid label value: %s", errUsage, o.managedBy, strings.Join(errs, "; "))
	}
	return nil
}

// loadMatRoots reads --mat-ca-file at start (matclient.OpenTrust), so
// that a bad file is one clear error naming it; from then on it is
// re-read when it changes.
func (o *workerOpts) loadMatRoots(log *slog.Logger) (err error) {
	o.matTrust, err = matclient.OpenTrust(o.matCAFile, "--mat-ca-file "+o.matCAFile+" ("+cliflag.EnvName("mat-ca-file")+")", log)
	return err
}

// matConfig is the MAT client configuration of the flags, after
// loadMatRoots: every client verifies MAT's certificate against matTrust
// as they are at each handshake.
func (o *workerOpts) matConfig(userAgent string) matclient.Config {
	cfg := matclient.Config{Timeout: o.matTimeout, InsecureSkipVerify: o.insecure, UserAgent: userAgent}
	o.matTrust.Configure(&cfg)
	return cfg
}

func (o *workerOpts) workerName() string {
	if o.name != "" {
		return o.name
	}
	return hostname()
}

// build returns the worker for bus and kube. When --service-cidr is not
// given it asks the API server for its ServiceCIDR objects (it may be
// forbidden; then allocation failures are treated as transient).
func (o *workerOpts) build(ctx context.Context, bus *events.Bus, kube kubernetes.Interface, log *slog.Logger) (*worker.Worker, *events.Reporter, error) {
	var cls worker.Classifier
	if cidrs, _ := worker.ParseCIDRs(o.serviceCIDRs); len(cidrs) > 0 {
		cls.ServiceCIDRs = cidrs
	} else {
		cls.Ranges = worker.ListServiceRanges(ctx, kube, log)
	}
	rep := events.NewReporter(bus, log, o.workerName(), o.errorWindow)
	kev, err := startKubeEvents(ctx, o.kubeEvents, kube, kubeevents.ControllerWorker, log)
	if err != nil {
		return nil, nil, err
	}
	mcfg := o.matConfig("matbus/" + version)
	mcfg.BodyMaxAge = o.matBodyMaxAge
	factory := func(url string) (worker.StatusClient, error) { return matclient.New(url, mcfg) }
	w, err := worker.New(o.config(cls, kev), bus, kube, factory, rep, log)
	if err == nil {
		// A changed CA bundle has discovery probe the instances whose
		// certificate was refused at once.
		go o.matTrust.Follow(ctx, func(ctx context.Context) { w.RetryRefused(ctx) })
	}
	return w, rep, err
}

// config is the worker's configuration from the flags (after validate):
// cls classifies API errors by the service range, kev (may be nil) records
// Kubernetes Events.
func (o *workerOpts) config(cls worker.Classifier, kev *kubeevents.Recorder) worker.Config {
	return worker.Config{
		Name: o.workerName(),
		Plan: o.planOptions(),
		Jobs: o.jobs, Fetches: o.fetches, DeleteJobs: o.deleteJobs, Concurrency: o.concurrency, RetryMaxElapsed: o.retryMaxElapsed, ShutdownGrace: o.grace,
		InstanceResync: o.instanceResync,
		Classifier:     cls,
		Metrics:        o.metrics,
		Kube:           o.kube,
		Events:         kev,
		Hold:           o.holdRule(),
	}
}

// planOptions are the plan options of the flags (after validate), as
// worker, check and plan use them.
func (o *workerOpts) planOptions() plan.Options {
	mode, _ := plan.ParseIPMode(o.ipMode)
	sel, _ := plan.ParseTargetSelector(o.targetSelector)
	return plan.Options{Namespace: o.namespace, ManagedBy: o.managedBy, IPMode: mode, TargetSelector: sel, StateAnnotations: o.stateAnnotations}
}

func runWorker(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("worker", "Consume instance events, sync jobs and delete jobs; keep BMC Services in step.")
	var b baseOpts
	var o workerOpts
	var h health.Options
	b.register(fs)
	o.register(fs)
	h.AddFlags(fs)
	log, err := b.parse(fs, args, e, "worker", o.validate, asUsage(h.Validate))
	if err != nil {
		return err
	}
	n, k := &b.n, &b.k
	if err := o.loadMatRoots(log); err != nil {
		return err
	}
	cfg, err := k.restConfig(ctx, log)
	if err != nil {
		return err
	}
	cfg.UserAgent = kubeconn.UserAgent(version, "worker", o.workerName())
	if k.limiter != nil {
		o.kube = k.limiter
	}
	reg := health.NewRegistry(version, health.Revision(commit))
	k.registerMetrics(reg)
	// The readiness probe's GET /version gets its own client, left out of
	// matbus_kube_requests_total, which counts the work's requests only.
	probeCfg := rest.CopyConfig(cfg)
	probeCfg.UserAgent = kubeconn.UserAgent(version, "worker", o.workerName(), "readiness")
	probeKube, err := kubeconn.Client(probeCfg)
	if err != nil {
		return err
	}
	health.CountKubeRequests(cfg, reg)
	kube, err := kubeconn.Client(cfg)
	if err != nil {
		return err
	}
	nc, err := n.connect("matbus-worker-"+o.workerName(), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := n.bus(nc, "worker/"+o.workerName(), log, &o)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.metrics, err = worker.NewMetrics(reg); err != nil {
		return err
	}
	w, rep, err := o.build(ctx, bus, kube, log)
	if err != nil {
		return err
	}
	health.WorkerMetrics(reg, w)
	health.EventMetrics(reg, bus, rep)
	reg.MustRegister(health.NewConsumerCollector(bus))
	informerUp := func() bool { return w.Ready() && w.WatchHealth().Err() == nil }
	ready := health.WorkerReadiness(nc, health.StartAPIProbe(ctx, probeKube, 5*time.Second, 5*time.Second, informerUp, log), w)
	if err := health.Start(ctx, h, "worker", ready, reg, log); err != nil {
		return err
	}
	return w.Run(ctx)
}
