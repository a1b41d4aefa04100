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
	// DeleteJobs is how many delete jobs one worker runs at once; default 32.
	DeleteJobs int
	// Concurrency bounds the Kubernetes writes in flight in this worker,
	// over all its jobs; default 32.
	Concurrency int
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
	if c.DeleteJobs <= 0 {
		c.DeleteJobs = 32
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 32
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
	cache  *ClientCache
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
	applyWaiting atomic.Int64
	writes       chan struct{} // Concurrency
	memo         *memo
	desired      *desiredCache
	warned       sync.Map // warnings already reported: "<key>\x00<mat_id>\x00<detail>" -> struct{}
	// pendingDeletes: Service UID -> when its stale delete job was published.
	pendingDeletes sync.Map
	// pendingSwept: when pendingDeletes was last swept of expired entries
	// (Unix nanoseconds; 0: never).
	pendingSwept atomic.Int64
	fence        epochFence // the newest discovery leader epoch seen
	holds        *holdView  // the hold records of the namespace (watchHolds)
	kvMu         sync.Mutex
	kv           jetstream.KeyValue // the state bucket, once bound (stateKV)
	refused      refusedSet         // instances whose last fetch refused MAT's certificate

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
		memo: newMemo(), desired: newDesiredCache(), holds: newHoldView()}
	w.cache = NewClientCache(factory, func(ctx context.Context, e events.Error) { w.report.Report(ctx, e) })
	w.watch = kubewatch.New("services", report, log)
	return w, nil
}

// Cache returns the worker's client cache (for inspection).
func (w *Worker) Cache() *ClientCache { return w.cache }

// Ready reports whether the Service informer has synced and the consumers run.
// Whether its list and watch calls succeed now is WatchHealth's Err.
func (w *Worker) Ready() bool { return w.ready.Load() }

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
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	go func() {
		select {
		case <-ctx.Done():
		case <-hard.Done():
			return
		}
		t := time.NewTimer(w.cfg.ShutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelHard()
		case <-hard.Done():
		}
	}()

	w.learnEpoch(ctx)
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); w.watchHolds(ctx) }()
	go func() { defer wg.Done(); w.runInstances(ctx) }()
	go func() { defer wg.Done(); w.runJobs(ctx, hard, events.SyncConsumer, w.cfg.Fetches, w.handleSync) }()
	go func() { defer wg.Done(); w.runJobs(ctx, hard, events.DeleteConsumer, w.cfg.DeleteJobs, w.handleDelete) }()
	w.ready.Store(true)
	w.log.Info("worker running", "worker", w.cfg.Name, "namespace", w.cfg.Plan.Namespace,
		"jobs", w.cfg.Jobs, "fetches", w.cfg.Fetches, "delete_jobs", w.cfg.DeleteJobs, "concurrency", w.cfg.Concurrency)
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

// jobHandler handles one decoded job message. It returns nil when the job
// is done (ack), or an error: a *jobError says whether to retry.
type jobHandler func(ctx context.Context, env events.Envelope, subject string) error

// Pull timing of the job consumers: a pull request waits at most
// pullWait for messages, and the server sends heartbeats every
// pullHeartbeat (a missing one means the server or consumer is gone).
const (
	pullWait      = 10 * time.Second
	pullHeartbeat = 2 * time.Second
	// backlogPoll is how often a backlogged sync consumer checks whether
	// it may pull again.
	backlogPoll = 50 * time.Millisecond
)

// runJobs consumes one durable pull consumer until ctx ends, re-creating the
// consumer (and its stream) whenever it is lost: deleted, stream
// re-created, or heartbeats missing after a server restart.
//
// It keeps exactly `slots` messages either running or requested: whenever
// slots free up it sends a new pull request for just that many, without
// waiting for earlier requests to fill or expire, so a job that ends frees
// its slot for the next message at once (pull requests overlap). A message
// is never held in a client-side buffer behind slow jobs, where AckWait
// would run out without progress and JetStream would redeliver it. On the
// sync consumer a subjectGate lets at most one job per instance run at a
// time here.
func (w *Worker) runJobs(ctx, hard context.Context, consumer string, slots int, h jobHandler) {
	log := w.log.With("consumer", consumer)
	sem := make(chan struct{}, slots)
	var gate *subjectGate
	if consumer == events.SyncConsumer {
		gate = newSubjectGate(w.bus.Config().AckWait / 3)
		gate.superseded = w.superseded
		defer gate.release() // jobs still waiting are left for redelivery
	}
	var inflight sync.WaitGroup
	defer inflight.Wait()
	free := func(n int) {
		for range n {
			<-sem
		}
	}
	dispatch := func(msg jetstream.Msg) {
		if ctx.Err() != nil {
			_ = msg.Nak()
			free(1)
			return
		}
		if gate != nil && !gate.admit(msg) {
			free(1) // held until its instance's running job ends
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer free(1)
			w.runJob(hard, msg, h)
			if gate == nil {
				return
			}
			// Then the jobs of this instance that arrived meanwhile (at
			// most one waits); at shutdown they are left for redelivery.
			for next := gate.done(msg.Subject()); next != nil; next = gate.done(msg.Subject()) {
				if ctx.Err() != nil {
					_ = next.Nak()
					continue
				}
				w.runJob(hard, next, h)
			}
		}()
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		cons, err := w.bus.EnsureConsumer(ctx, consumer)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = w.bus.EnsureStreams(ctx)
			if err == nil {
				cons, err = w.bus.EnsureConsumer(ctx, consumer)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("consumer not available, retrying", "error", err, "retry_in", delay)
			if !sleep(ctx, delay) {
				return
			}
			delay = min(delay*2, 5*time.Second)
			continue
		}
		delay = 100 * time.Millisecond
		batch := slots
		var backlogged func() bool
		if consumer == events.SyncConsumer {
			batch = 1
			backlogged = func() bool { return w.applyWaiting.Load() > 0 }
		}
		w.pull(ctx, log, cons, sem, slots, batch, backlogged, dispatch)
	}
}

// pull sends pull requests on cons for free slots of sem until ctx ends or
// a request fails (the consumer is then re-attached by the caller).
//
// With batch 1 (the sync consumer) it keeps one pull request for one
// message open at a time, sending the next as soon as a message arrives:
// the server serves waiting pull requests in arrival order, so jobs are
// spread over the workers in turn instead of filling the first worker's
// large request (a few big instances on one worker while others idle).
// Larger batches (delete jobs, which are many and small) may overlap.
//
// Overlapping requests that a burst split into one per freed slot are
// merged again when the queue runs dry: once a request ends short of its
// batch (it expired: nothing was left to deliver), no new request is sent
// until every open one has ended, and then one asks for all free slots.
// Otherwise each expiring fragment asked again for its own slot, and an
// idle worker kept one request (and two goroutines) per slot open.
//
// While backlogged (may be nil) reports true — a sync job here waits for
// an apply slot — no new request is sent (checked every backlogPoll):
// the jobs stay in the stream for workers that can start them, instead
// of queueing behind this worker's applies (at 40 instances and more,
// one worker had taken half of them and held some for minutes, until
// discovery gave up on their results and sent them to another worker).
func (w *Worker) pull(ctx context.Context, log *slog.Logger, cons jetstream.Consumer, sem chan struct{}, slots, batchMax int,
	backlogged func() bool, dispatch func(jetstream.Msg)) {
	actx, cancel := context.WithCancel(ctx)
	broken := make(chan error, 1)
	var batches sync.WaitGroup
	defer func() {
		cancel() // ends the open pull requests
		batches.Wait()
	}()
	var (
		mu    sync.Mutex
		open  int  // pull requests not ended
		dry   bool // a request expired short of its batch
		ended = make(chan struct{}, 1)
	)
	var resume <-chan time.Time
	for {
		acquire := sem
		mu.Lock()
		if dry && open > 0 {
			acquire = nil // merge: wait for the open requests to end
		} else {
			dry = false
		}
		mu.Unlock()
		resume = nil
		if backlogged != nil && backlogged() {
			// Saturated: leave the next jobs to workers with a free apply slot.
			acquire, resume = nil, time.After(backlogPoll)
		}
		select {
		case acquire <- struct{}{}:
		case <-resume:
			continue
		case <-ended:
			continue
		case err := <-broken:
			log.Warn("consumer interrupted, re-attaching", "error", err)
			return
		case <-actx.Done():
			return
		}
		n := 1
	take:
		for n < min(slots, batchMax) {
			select {
			case sem <- struct{}{}:
				n++
			default:
				break take
			}
		}
		fctx, fcancel := context.WithTimeout(actx, pullWait)
		batch, err := cons.Fetch(n, jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(pullHeartbeat))
		if err != nil {
			fcancel()
			for range n {
				<-sem
			}
			if ctx.Err() == nil {
				log.Warn("pull failed, re-attaching", "error", err)
				sleep(ctx, 100*time.Millisecond)
			}
			return
		}
		batches.Add(1)
		mu.Lock()
		open++
		mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer batches.Done()
			defer fcancel()
			got := 0
			for msg := range batch.Messages() {
				got++
				dispatch(msg)
			}
			for range n - got {
				<-sem
			}
			mu.Lock()
			open--
			dry = dry || got < n
			mu.Unlock()
			select {
			case ended <- struct{}{}:
			default:
			}
			if err := batch.Error(); err != nil && actx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				select {
				case broken <- err:
				default:
				}
			}
		}()
		if batchMax == 1 {
			select {
			case <-done:
			case <-actx.Done():
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jobError is a job failure: Retry asks for redelivery, otherwise the job is
// terminated. Reported is true when an error event was already published.
type jobError struct {
	Retry    bool
	Reported bool
	Err      error
}

func (e *jobError) Error() string { return e.Err.Error() }
func (e *jobError) Unwrap() error { return e.Err }

// runJob decodes msg, runs h with progress reports, and acks, naks or
// terminates it.
func (w *Worker) runJob(ctx context.Context, msg jetstream.Msg, h jobHandler) {
	subject := msg.Subject()
	env, err := events.Decode(msg.Data())
	if err != nil {
		w.rejectEvent(ctx, subject, err)
		_ = msg.TermWithReason("undecodable event")
		w.cfg.Metrics.jobEnded("", JobTerminated, -1)
		return
	}
	delivered := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		delivered = md.NumDelivered
	}
	// Tell JetStream the job is alive while it runs (AckWait/3).
	progressEvery := w.bus.Config().AckWait / 3
	stop := make(chan struct{})
	var progress sync.WaitGroup
	progress.Add(1)
	go func() {
		defer progress.Done()
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	started := time.Now()
	err = h(ctx, env, subject)
	took := time.Since(started)
	close(stop)
	progress.Wait()

	var je *jobError
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			w.log.Debug("ack failed; the job will be redelivered and is idempotent", "subject", subject, "error", aerr)
		}
		w.cfg.Metrics.jobEnded(env.Type, JobOK, took)
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		// Shutdown: leave it for another worker, report nothing.
		_ = msg.Nak()
		w.cfg.Metrics.jobEnded(env.Type, JobRetried, took)
	case errors.As(err, &je) && je.Retry:
		if delivered >= uint64(w.bus.Config().MaxDeliver) {
			w.failed.Add(1)
			w.cfg.Metrics.jobEnded(env.Type, JobFailed, took)
			// The event names the cause, not the Service (that is in the log), so
			// the jobs one fault exhausts share one event per rate-limit window.
			w.log.Warn("job gave up", "subject", subject, "deliveries", delivered, "error", err)
			w.report.Report(ctx, events.Error{Kind: kindOf(env.Type), Instance: keyOf(subject), Subject: subject,
				Message: fmt.Sprintf("job gave up after %d deliveries: %s", delivered, transientCause(err)), Attempts: int(delivered)})
			_ = msg.TermWithReason("deliveries exhausted")
			return
		}
		_ = msg.NakWithDelay(time.Duration(delivered) * 2 * time.Second)
		w.cfg.Metrics.jobEnded(env.Type, JobRetried, took)
	default:
		w.failed.Add(1)
		w.cfg.Metrics.jobEnded(env.Type, JobTerminated, took)
		if !(errors.As(err, &je) && je.Reported) {
			w.report.Report(ctx, events.Error{Kind: kindOf(env.Type), Instance: keyOf(subject), Subject: subject,
				Message: err.Error(), Permanent: true, Attempts: int(delivered)})
		}
		_ = msg.TermWithReason("permanent failure")
	}
}

func (w *Worker) rejectEvent(ctx context.Context, subject string, err error) {
	w.report.Report(ctx, events.Error{Kind: events.ErrorEvent, Subject: subject, Instance: keyOf(subject),
		Message: fmt.Sprintf("rejected message: %v", err), Permanent: true})
}

func kindOf(t events.Type) events.ErrorKind {
	switch t {
	case events.TypeDeleteJob, events.TypeCleanupJob:
		return events.ErrorDelete
	default:
		return events.ErrorUpdate
	}
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
