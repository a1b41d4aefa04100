package kubewatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/events"
)

// Verbs a Tracker records, as RBAC names them.
const (
	VerbList  = "list"
	VerbWatch = "watch"
)

// verbs is the order in which Err names failing verbs.
var verbs = []string{VerbList, VerbWatch}

// Tracker records whether the list and watch calls of one resource
// succeed. A verb fails from the first failed call until the next call of
// that verb succeeds; Err names the failing verbs for readiness. The
// tracker is failing while any verb fails: the start and the end of that
// state are one error event each (kind events.ErrorWatch) through the
// Reporter, which also logs them; the calls in between, of either verb,
// are only counted. Safe for concurrent use.
type Tracker struct {
	resource string
	report   *events.Reporter
	log      *slog.Logger
	now      func() time.Time

	// pub serialises the reports of transitions, so a start is never
	// published after the end that follows it.
	pub sync.Mutex

	mu       sync.Mutex
	failing  map[string]error // verb -> its last error, while it fails
	failures map[string]int64 // verb -> failed calls since New
	made     map[string]int64 // verb -> calls since New, failed or not
	since    time.Time        // when the failing state began
	calls    int              // failed calls, of either verb, since then

	events [4]atomic.Int64 // by eventKinds
}

// New returns a Tracker of resource (e.g. "services", the name used in
// reasons, log lines, events and the metrics' informer label). report
// (may be nil: log only) receives the start and end of each failure; log
// (may be nil) gets a debug line for the watch ends that are routine.
func New(resource string, report *events.Reporter, log *slog.Logger) *Tracker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if report == nil {
		report = events.NewReporter(nil, log, "", 0)
	}
	return &Tracker{resource: resource, report: report, log: log, now: time.Now,
		failing: map[string]error{}, failures: map[string]int64{}, made: map[string]int64{}}
}

// Resource returns the resource name given to New.
func (t *Tracker) Resource() string { return t.resource }

// Observe records the outcome of one call of verb (VerbList, VerbWatch):
// err nil is a success. A call ended by ctx or by a canceled context
// counts as neither. The first failure while no verb failed and the
// success that leaves no verb failing are reported (see Tracker) before
// Observe returns; publishing waits at most the Reporter's 5 s.
func (t *Tracker) Observe(ctx context.Context, verb string, err error) {
	t.mu.Lock()
	t.made[verb]++
	t.mu.Unlock()
	if err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)) {
		return
	}
	t.pub.Lock()
	defer t.pub.Unlock()
	now := t.now()
	t.mu.Lock()
	_, was := t.failing[verb]
	healthy := len(t.failing) == 0
	switch {
	case err != nil:
		t.failures[verb]++
		t.failing[verb] = err
		t.calls++
		if !healthy {
			t.mu.Unlock()
			return
		}
		t.since, t.calls = now, 1
		t.mu.Unlock()
		t.report.Report(ctx, events.Error{Kind: events.ErrorWatch,
			Message: fmt.Sprintf("%s %s: %v; not ready until list and watch work again", verb, t.resource, err), Attempts: 1})
	case was:
		delete(t.failing, verb)
		if len(t.failing) > 0 {
			t.mu.Unlock()
			return
		}
		since, calls := t.since, t.calls
		t.mu.Unlock()
		t.report.Report(ctx, events.Error{Kind: events.ErrorWatch,
			Message: fmt.Sprintf("list and watch %s work again after %v and %d failed calls", t.resource,
				now.Sub(since).Round(time.Millisecond), calls), Attempts: calls, Resolved: true})
	default:
		t.mu.Unlock()
	}
}

// Err returns nil while no verb fails, else "<verb> <resource>: <last
// error>" of each failing verb (list before watch), joined by "; ".
func (t *Tracker) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, v := range verbs {
		if err, ok := t.failing[v]; ok {
			errs = append(errs, fmt.Errorf("%s %s: %w", v, t.resource, err))
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return joined(errs)
}

// joined is errors.Join on one line.
type joined []error

func (j joined) Error() string {
	s := j[0].Error()
	for _, e := range j[1:] {
		s += "; " + e.Error()
	}
	return s
}

func (j joined) Unwrap() []error { return j }

// Failing returns the verbs that fail now, list before watch.
func (t *Tracker) Failing() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, v := range verbs {
		if _, ok := t.failing[v]; ok {
			out = append(out, v)
		}
	}
	return out
}

// Failures returns the failed calls of each verb since New.
func (t *Tracker) Failures() map[string]int64 { return t.byVerb(t.failures) }

// Calls returns the list and watch calls observed since New, failed or
// not, by verb: an informer's relists and re-opened watches show here.
func (t *Tracker) Calls() map[string]int64 { return t.byVerb(t.made) }

// byVerb copies counts of m (under t.mu) for every verb, 0 for none.
func (t *Tracker) byVerb(m map[string]int64) map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int64, len(verbs))
	for _, v := range verbs {
		out[v] = m[v]
	}
	return out
}

// Event kinds counted by Instrument (EventCounts): the objects of the
// informer's first list, and the adds, updates and deletes that followed
// (watch events, and the differences a relist found).
const (
	EventListed  = "listed"
	EventAdded   = "added"
	EventUpdated = "updated"
	EventDeleted = "deleted"
)

// eventKinds is the order of EventCounts and of the metric's series.
var eventKinds = []string{EventListed, EventAdded, EventUpdated, EventDeleted}

// EventCounts returns the objects the instrumented informers delivered to
// their handlers since New, by kind (EventListed, EventAdded, ...).
func (t *Tracker) EventCounts() map[string]int64 {
	out := make(map[string]int64, len(eventKinds))
	for i, k := range eventKinds {
		out[k] = t.events[i].Load()
	}
	return out
}

// ListerWatcher returns lw with every List and Watch call observed: a
// watch counts as working once the API server accepted it (a watch-list
// request, which streams the initial objects, is a watch call).
// The result implements both cache.ListerWatcher and
// cache.ListerWatcherWithContext, as informers want.
func (t *Tracker) ListerWatcher(lw cache.ListerWatcher) cache.ListerWatcher {
	return &observed{lw: cache.ToListerWatcherWithContext(lw), t: t}
}

type observed struct {
	lw cache.ListerWatcherWithContext
	t  *Tracker
}

func (o *observed) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := o.lw.ListWithContext(ctx, opts)
	o.t.Observe(ctx, VerbList, err)
	return obj, err
}

func (o *observed) List(opts metav1.ListOptions) (runtime.Object, error) {
	return o.ListWithContext(context.Background(), opts)
}

func (o *observed) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return o.WatchWithContext(context.Background(), opts)
}

func (o *observed) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := o.lw.WatchWithContext(ctx, opts)
	o.t.Observe(ctx, VerbWatch, err)
	return w, err
}

// HandleWatchError is the informer's watch error handler
// (cache.SharedIndexInformer.SetWatchErrorHandlerWithContext; see
// Instrument). It replaces client-go's default, which logs every retry at
// error level: the calls that fail were observed already (their start and
// end are reported once), routine ends of a watch (EOF, an expired
// resource version) are a debug line, and any other error ends a watch
// that was accepted, so it is a watch failure until the next watch call
// succeeds.
func (t *Tracker) HandleWatchError(ctx context.Context, _ *cache.Reflector, err error) {
	switch {
	case err == nil || errors.Is(err, context.Canceled) || ctx.Err() != nil:
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		t.log.Debug("watch ended; listing and watching again", "resource", t.resource, "error", err)
	case len(t.Failing()) > 0:
		// A failed call Observe has seen; reported when it started.
	default:
		t.Observe(ctx, VerbWatch, err)
	}
}

// Instrument makes inf report its watch errors to t (HandleWatchError).
// Call it before inf starts; it returns an error once inf has started.
// The list and watch calls themselves are observed only when inf was
// built on ListerWatcher.
func (t *Tracker) Instrument(inf cache.SharedIndexInformer) error {
	if err := inf.SetWatchErrorHandlerWithContext(t.HandleWatchError); err != nil {
		return fmt.Errorf("kubewatch: %s informer: %w", t.resource, err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(_ any, initial bool) {
			if initial {
				t.events[0].Add(1)
			} else {
				t.events[1].Add(1)
			}
		},
		UpdateFunc: func(_, _ any) { t.events[2].Add(1) },
		DeleteFunc: func(any) { t.events[3].Add(1) },
	}); err != nil {
		return fmt.Errorf("kubewatch: %s informer: %w", t.resource, err)
	}
	return nil
}

var errServiceInformerTaken = errors.New("kubewatch: the informer factory already holds a Service informer")

// RecheckList calls list every `every` while VerbList fails, observing
// each outcome, until ctx ends. A list failure seen outside the informer
// (a direct list of the resource) would otherwise last until something
// lists again; the informer retries its own lists. every <= 0 means 5 s.
func (t *Tracker) RecheckList(ctx context.Context, every time.Duration, list func(context.Context) error) {
	if every <= 0 {
		every = 5 * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		_, failing := t.failing[VerbList]
		t.mu.Unlock()
		if failing {
			t.Observe(ctx, VerbList, list(ctx))
		}
	}
}
