package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/kubewatch"
	"github.com/matbus/matbus/plan"
)

// Config tunes a Worker. Zero values mean the documented defaults.
type Config struct {
	// Name identifies this worker in logs and error events (e.g. the pod name).
	Name string
	// Plan holds the Service shape options; Plan.Namespace is where
	// Services are created and watched.
	Plan plan.Options
	// Jobs is how many sync jobs one worker plans and applies at once;
	// default 8. A job waiting for its MAT status holds no such slot (see
	// Fetches), so instances that hang cannot keep others from being applied.
	Jobs int
	// Fetches is how many sync jobs one worker takes from the sync
	// consumer at once, most of them waiting on MAT or finding the status
	// unchanged; default 32.
	Fetches int
	// DeleteJobs is how many delete jobs one worker runs at once, at
	// most; with Kube set they follow its in-flight limit (see
	// deleteWindow). Default: 2 × Kube.MaxInFlight() with Kube, else 32.
	DeleteJobs int
	// Concurrency bounds the Kubernetes writes this worker has started,
	// over all its jobs (with Kube, those beyond its in-flight limit wait
	// in it for a slot). Default: 2 × Kube.MaxInFlight() with Kube, else
	// 32.
	Concurrency int
	// Kube, when set, is the adaptive limit of the worker's Kubernetes
	// client (a *kuberate.Limiter): how many requests the API server takes
	// in flight now. The delete jobs a worker takes follow it, so one
	// worker keeps as many deletes in flight as the API server takes
	// rather than a fixed number.
	Kube KubeWindow
	// RetryMaxElapsed bounds the backoff of one API operation; default 60 s.
	RetryMaxElapsed time.Duration
	// OwnerTTL is how long the owner reference of an instance (one
	// Deployment GET) is reused; default 10 min. An appeared or start job
	// reads it again.
	OwnerTTL time.Duration
	// ShutdownGrace is how long in-flight jobs may run after shutdown
	// begins; unfinished ones are left for redelivery. Default 10 s.
	ShutdownGrace time.Duration
	// InstanceResync is how often the client cache is checked against the
	// instances stream, catching gone events a worker missed, and the
	// Services of instances gone for two such periods are cleaned up again
	// (see sweepGone); default 1 min.
	InstanceResync time.Duration
	// Classifier classifies API errors.
	Classifier Classifier
	// Metrics receives the worker's measurements (NewMetrics); nil records none.
	Metrics *Metrics
	// Events records Kubernetes Events on the MAT and BMC Services
	// (kubeevents.Start); nil records none.
	Events *kubeevents.Recorder
	// Hold is when the deletes of a status that takes many of an
	// instance's Services away at once are held for a confirmation window
	// (see plan.HoldRule); the zero value holds nothing (the CLI's
	// defaults are plan.DefaultHoldShare and plan.DefaultHoldWindow).
	Hold plan.HoldRule
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "worker"
	}
	if c.Jobs <= 0 {
		c.Jobs = 8
	}
	if c.Fetches <= 0 {
		c.Fetches = 32
	}
	if c.Fetches < c.Jobs {
		c.Fetches = c.Jobs
	}
	auto := 32
	if c.Kube != nil {
		auto = 2 * max(1, c.Kube.MaxInFlight())
	}
	if c.DeleteJobs <= 0 {
		c.DeleteJobs = auto
	}
	if c.Concurrency <= 0 {
		c.Concurrency = auto
	}
	if c.OwnerTTL <= 0 {
		c.OwnerTTL = 10 * time.Minute
	}
	if c.RetryMaxElapsed <= 0 {
		c.RetryMaxElapsed = time.Minute
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.InstanceResync <= 0 {
		c.InstanceResync = time.Minute
	}
	return c
}

// KubeWindow is an adaptive limit of Kubernetes API requests in flight
// (kuberate.Limiter implements it).
type KubeWindow interface {
	// InFlightLimit is how many requests may be in flight now (≥ 1).
	InFlightLimit() int
	// MaxInFlight is that limit's ceiling.
	MaxInFlight() int
}

// deleteWindow is how many delete jobs to keep running or requested: the
// API client's in-flight limit and a quarter more (at least 4), so a
// delete whose job is between its DELETE and its ack, or still being
// pulled, leaves no in-flight slot idle; nil without Config.Kube (the
// DeleteJobs slots alone).
func (c Config) deleteWindow() func() int {
	if c.Kube == nil {
		return nil
	}
	return func() int {
		n := c.Kube.InFlightLimit()
		return n + max(4, n/4)
	}
}

// Stats counts what a worker did since start.
type Stats struct {
	Syncs, Cleanups                      int64 // jobs completed
	Unchanged                            int64 // poll jobs that found status and Services unchanged
	Created, Updated, Recreated, Deleted int64 // Service writes that succeeded
	DeleteJobs                           int64 // delete jobs published
	DeletesKept                          int64 // delete jobs not run: the newest status still wants the Service
	Failed                               int64 // jobs that failed: a sync whose fetch or apply failed, a job that gave up or was refused
}

// Worker consumes instance events, sync and clean-up jobs, and delete jobs.
type Worker struct {
	cfg    Config
	bus    *events.Bus
	kube   kubernetes.Interface
	report *events.Reporter
	log    *slog.Logger

	services corelisters.ServiceLister
	byInst   cache.Indexer // the informer's store, with the byInstance index
	ready    atomic.Bool
	// watch observes the Service informer's list and watch calls and the
	// clean-up's lists.
	watch *kubewatch.Tracker

	applySlots chan struct{} // Jobs
	// applyWaiting counts sync jobs held here waiting for an apply slot;
	// while it is above 0 the sync consumer sends no pull request (see
	// pull), so other workers take the next jobs.
	applyWaiting  atomic.Int64
	writes        chan struct{} // Concurrency
	instanceState               // everything kept per instance, forgotten together
	// pendingDeletes: Service UID -> when its stale delete job was published.
	pendingDeletes sync.Map
	// pendingSwept: when pendingDeletes was last swept of expired entries
	// (Unix nanoseconds; 0: never).
	pendingSwept atomic.Int64
	fence        epochFence // the newest discovery leader epoch seen
	holds        *holdView  // the hold records of the namespace (watchHolds)
	kvMu         sync.Mutex
	kv           jetstream.KeyValue // the state bucket, once bound (stateKV)
	handover     *handover          // with workers of another configuration (handover.go)

	syncs, cleanups, unchanged, created, updated, recreated, deleted, deleteJobs, kept, failed atomic.Int64
}

// New returns a Worker. factory makes MAT clients on cache misses
// (normally a wrapper of matclient.New); report receives every failure.
// The bus's namespace (events.Config.Namespace) must be cfg.Plan.Namespace:
// the worker takes only the jobs and instance events of that namespace.
func New(cfg Config, bus *events.Bus, kube kubernetes.Interface, factory ClientFactory, report *events.Reporter, log *slog.Logger) (*Worker, error) {
	cfg = cfg.withDefaults()
	if cfg.Plan.Namespace == "" {
		return nil, errors.New("worker: no target namespace")
	}
	if !cfg.Hold.Off() {
		if err := cfg.Hold.Validate(); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	if ns := bus.Config().Namespace; ns != cfg.Plan.Namespace {
		return nil, fmt.Errorf("worker: the bus is for namespace %q, the worker for %q: a worker takes only its own namespace's jobs (set events.Config.Namespace)", ns, cfg.Plan.Namespace)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if report == nil {
		report = events.NewReporter(bus, log, cfg.Name, 0)
	}
	w := &Worker{cfg: cfg, bus: bus, kube: kube, report: report, log: log,
		applySlots: make(chan struct{}, cfg.Jobs), writes: make(chan struct{}, cfg.Concurrency),
		holds: newHoldView()}
	w.instanceState = instanceState{memo: newMemo(), desired: newDesiredCache(), metrics: cfg.Metrics,
		cache: NewClientCache(factory, func(ctx context.Context, e events.Error) { w.report.Report(ctx, e) })}
	w.watch = kubewatch.New("services", report, log)
	w.handover = newHandover(cfg.Name, cfg.Plan.Fingerprint(), cfg.Plan.Namespace, bus, w.stateKV, cfg.Metrics, log)
	return w, nil
}

// Cache returns the worker's client cache (for inspection).
func (w *Worker) Cache() *ClientCache { return w.cache }

// Ready reports whether the Service informer has synced and the consumers run.
// Whether its list and watch calls succeed now is WatchHealth's Err.
func (w *Worker) Ready() bool { return w.ready.Load() }

// TakesJobs returns nil while the worker takes jobs, else why not: it
// waits at start for workers of another configuration (another IP mode,
// say) to stand by, or it stands by for one that started later (see
// handover.go and docs/adr/0035-configuration-handover.md).
func (w *Worker) TakesJobs() error { return w.handover.err() }

// WatchHealth returns the tracker of the Service informer's list and watch
// calls and of the clean-up's Service lists: its Err is nil while they
// succeed, else the reason (e.g. "watch services: services is forbidden:
// …"), which makes the worker not ready.
func (w *Worker) WatchHealth() *kubewatch.Tracker { return w.watch }

// Stats returns the counters.
func (w *Worker) Stats() Stats {
	return Stats{Syncs: w.syncs.Load(), Cleanups: w.cleanups.Load(), Unchanged: w.unchanged.Load(),
		Created: w.created.Load(), Updated: w.updated.Load(), Recreated: w.recreated.Load(), Deleted: w.deleted.Load(),
		DeleteJobs: w.deleteJobs.Load(), DeletesKept: w.kept.Load(), Failed: w.failed.Load()}
}

// Run starts the Service informer and the three consumers and blocks until
// ctx ends. Then it stops fetching, lets in-flight jobs finish for up to
// ShutdownGrace (the rest are nak'ed for redelivery), closes every cached
// client and returns nil. It returns an error only when start-up fails.
func (w *Worker) Run(ctx context.Context) error {
	tweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labels.Set{plan.LabelManagedBy: w.managedBy()}.String()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(w.kube, 0,
		informers.WithNamespace(w.cfg.Plan.Namespace), informers.WithTweakListOptions(tweak))
	if _, err := w.watch.ServiceInformer(factory, w.cfg.Plan.Namespace, tweak); err != nil {
		return fmt.Errorf("worker: Service informer: %w", err)
	}
	inf := factory.Core().V1().Services()
	if err := inf.Informer().AddIndexers(cache.Indexers{byInstance: instanceIndex, byIP: ipIndex}); err != nil {
		return fmt.Errorf("worker: Service index: %w", err)
	}
	w.services, w.byInst = inf.Lister(), inf.Informer().GetIndexer()
	if _, err := inf.Informer().AddEventHandler(w.memo.handler()); err != nil {
		return fmt.Errorf("worker: Service event handler: %w", err)
	}
	informerCtx, stopInformers := context.WithCancel(context.WithoutCancel(ctx))
	factory.Start(informerCtx.Done())
	var recheck sync.WaitGroup
	recheck.Go(func() {
		w.watch.RecheckList(informerCtx, 5*time.Second, func(ctx context.Context) error {
			o := metav1.ListOptions{Limit: 1}
			tweak(&o)
			_, err := w.kube.CoreV1().Services(w.cfg.Plan.Namespace).List(ctx, o)
			return err
		})
	})
	defer func() {
		stopInformers()
		factory.Shutdown()
		recheck.Wait()
	}()
	w.log.Info("waiting for Service informer", "namespace", w.cfg.Plan.Namespace)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker: informer for %v did not sync", typ)
		}
	}
	if err := w.bus.EnsureStreams(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // shut down before NATS was reachable
		}
		w.log.Warn("streams not ready yet, retrying in the consumers", "error", err)
	}

	// hard ends the jobs' contexts ShutdownGrace after ctx ends.
	hard, cancelHard := jobs.Grace(ctx, w.cfg.ShutdownGrace)
	defer cancelHard()

	w.learnEpoch(ctx)
	w.handover.start(ctx)
	var wg sync.WaitGroup
	wg.Add(5)
	go func() { defer wg.Done(); w.handover.run(ctx) }()
	go func() { defer wg.Done(); w.watchHolds(ctx) }()
	go func() { defer wg.Done(); w.runInstances(ctx) }()
	go func() {
		defer wg.Done()
		jobs.Run(ctx, hard, w.handover.handler(w.handleSync), w.jobOptions(events.SyncConsumer, w.cfg.Fetches))
	}()
	go func() {
		defer wg.Done()
		jobs.Run(ctx, hard, w.handover.handler(w.handleDelete), w.jobOptions(events.DeleteConsumer, w.cfg.DeleteJobs))
	}()
	w.ready.Store(true)
	w.log.Info("worker running", "worker", w.cfg.Name, "namespace", w.cfg.Plan.Namespace,
		"jobs", w.cfg.Jobs, "fetches", w.cfg.Fetches, "delete_jobs", w.cfg.DeleteJobs, "concurrency", w.cfg.Concurrency,
		"delete_jobs_follow_kube_limit", w.cfg.Kube != nil)
	wg.Wait()
	w.ready.Store(false)
	w.cache.Close(hard)
	w.log.Info("worker stopped", "worker", w.cfg.Name)
	return nil
}

func (w *Worker) managedBy() string {
	if w.cfg.Plan.ManagedBy == "" {
		return "mat-k8s-controller"
	}
	return w.cfg.Plan.ManagedBy
}

// jobOptions are the runtime options of consumer (events.SyncConsumer
// or events.DeleteConsumer) with slots jobs at once. The sync consumer
// pulls one job at a time, runs one job per instance at a time, and
// pulls nothing while a sync job here waits for an apply slot (see
// acquireApplySlot), so other workers take the next jobs. The delete
// consumer keeps its jobs to deleteWindow.
func (w *Worker) jobOptions(consumer string, slots int) jobs.Options {
	o := jobs.Options{Name: consumer, Slots: slots, AckWait: w.bus.Config().AckWait, MaxDeliver: w.bus.Config().MaxDeliver,
		Attach: func(ctx context.Context) (jetstream.Consumer, error) { return w.attach(ctx, consumer) },
		Report: func(ctx context.Context, e events.Error) { w.report.Report(ctx, e) },
		Ended:  w.jobEnded, Cause: transientCause, Log: w.log, Paused: w.handover.paused}
	if consumer == events.SyncConsumer {
		o.OneAtATime, o.PerSubject, o.Superseded = true, true, w.superseded
		o.Backlogged = func() bool { return w.applyWaiting.Load() > 0 }
	} else {
		o.Window = w.cfg.deleteWindow()
	}
	return o
}

// attach returns the durable consumer, creating it, and its stream when
// that is missing.
func (w *Worker) attach(ctx context.Context, consumer string) (jetstream.Consumer, error) {
	cons, err := w.bus.EnsureConsumer(ctx, consumer)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if err = w.bus.EnsureStreams(ctx); err == nil {
			cons, err = w.bus.EnsureConsumer(ctx, consumer)
		}
	}
	return cons, err
}

// jobEnded counts a job's outcome in Stats (a job that gave up or was
// refused is failed; an undecodable message is not a job) and Metrics.
func (w *Worker) jobEnded(t events.Type, o jobs.Outcome, took time.Duration) {
	if o == jobs.Failed || o == jobs.Terminated {
		w.failed.Add(1)
	}
	w.cfg.Metrics.jobEnded(t, o, took)
}

func (w *Worker) rejectEvent(ctx context.Context, subject string, err error) {
	w.report.Report(ctx, jobs.Rejected(subject, err))
}

func keyOf(subject string) string {
	k, _ := events.KeyFromSubject(subject)
	return k
}

// superseded reports a sync job that the subject gate acknowledged unrun
// (a newer job of its instance arrived) as skipped, so the scheduler that
// sent it does not wait for its deadline.
func (w *Worker) superseded(msg jetstream.Msg) {
	env, err := events.Decode(msg.Data())
	if err != nil || env.Type != events.TypeSyncJob {
		return
	}
	job, err := events.Into[events.SyncJob](env, events.TypeSyncJob)
	if err != nil {
		return
	}
	res := events.SyncResult{Key: job.Key, JobID: env.ID, Outcome: events.OutcomeSkipped,
		Error: "superseded by a newer job of the instance", Worker: w.cfg.Name}
	if err := w.bus.PublishResult(env.ID+":result", res); err != nil {
		w.log.Debug("result of a superseded job not published", "instance", job.Key, "error", err)
	}
}
