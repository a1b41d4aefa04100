package kubeevents

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	mbevents "github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/redact"
)

// Reporting controllers (the Event's reportingController; the
// reportingInstance is "<controller>-<host name>").
const (
	ControllerWorker    = "matbus.io/worker"
	ControllerDiscovery = "matbus.io/discovery"
)

// Spam filter defaults, those of client-go's EventCorrelator: per regarded
// object, reason and type, a burst of SpamBurst occurrences, then one per
// SpamRefill.
const (
	SpamBurst  = 25
	SpamRefill = 5 * time.Minute
)

// MaxNote is the longest note the API server accepts (events.k8s.io/v1
// validation), in bytes; longer notes are cut to it, ending in "…".
const MaxNote = 1024

// uidTTL is how long the UID of a MAT Service (or its absence) is reused
// before it is read again.
const uidTTL = time.Minute

// Config tunes a Recorder. Controller is required.
type Config struct {
	// Controller is the reportingController, a domain-prefixed path:
	// ControllerWorker or ControllerDiscovery.
	Controller string
	// Log receives the Recorder's own failures (debug level). When its
	// handler implements events.Redactor (matbus's redacting handler),
	// every note is passed through it, so an Event never shows what the
	// log would hide; URL user info is stripped regardless.
	Log *slog.Logger
	// Clock drives the spam filter; nil means the real clock.
	Clock clock.PassiveClock
}

// Recorder records Kubernetes Events through client-go's events.k8s.io/v1
// broadcaster. Each occurrence first passes the spam filter
// (record.EventSourceObjectSpamFilter: SpamBurst per regarded object,
// reason and type, refilled once per SpamRefill; the rest are dropped and
// counted), then the broadcaster's aggregation: occurrences with the same
// regarded object, reason, type, action and reporter form one Event object
// whose series count grows (the count is written on the second occurrence,
// every 30 min and when the series ends, 6 min after its last occurrence),
// so a failure that repeats every few minutes is one Event object however
// long it lasts. The series keeps the note of its first occurrence.
//
// A nil *Recorder records nothing (--kube-events=false). It is safe for
// concurrent use.
type Recorder struct {
	ctx   context.Context // Start's: owns the UID lookups
	rec   events.EventRecorder
	kube  kubernetes.Interface
	log   *slog.Logger
	clean func(string) string

	mu       sync.Mutex
	spam     *record.EventSourceObjectSpamFilter
	uids     map[string]uidEntry // "<namespace>/<name>" of MAT Services
	pending  map[string][]func(uidEntry)
	recorded map[Reason]int64
	filtered map[Reason]int64
	now      func() time.Time
}

type uidEntry struct {
	uid     types.UID // "" when not read
	missing bool      // the Service does not exist
	at      time.Time
}

// Start returns a Recorder writing Events through kube's events.k8s.io/v1
// client until ctx ends (then the broadcaster shuts down; Events still
// queued are dropped). It fails only when the configuration is invalid.
func Start(ctx context.Context, kube kubernetes.Interface, cfg Config) (*Recorder, error) {
	if cfg.Controller == "" {
		return nil, fmt.Errorf("kubeevents: no reporting controller")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	clean := redact.StripUserInfo
	if rd, ok := cfg.Log.Handler().(mbevents.Redactor); ok {
		clean = func(s string) string { return redact.StripUserInfo(rd.Redact(s)) }
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, fmt.Errorf("kubeevents: start the event broadcaster: %w", err)
	}
	go func() {
		<-ctx.Done()
		b.Shutdown()
	}()
	return &Recorder{
		ctx:  ctx,
		rec:  b.NewRecorder(scheme.Scheme, cfg.Controller),
		kube: kube, log: cfg.Log, clean: clean,
		spam:     record.NewEventSourceObjectSpamFilter(4096, SpamBurst, float32(1/SpamRefill.Seconds()), cfg.Clock, spamKey),
		uids:     map[string]uidEntry{},
		pending:  map[string][]func(uidEntry){},
		recorded: map[Reason]int64{}, filtered: map[Reason]int64{},
		now: time.Now,
	}, nil
}

// spamKey is the spam filter's key: the regarded object, the type and the
// reason (client-go's default leaves out the reason, so a noisy reason
// would use up the tokens of a rare one on the same object).
func spamKey(e *corev1.Event) string {
	o := e.InvolvedObject
	return strings.Join([]string{o.Kind, o.Namespace, o.Name, string(o.UID), e.Type, e.Reason}, "\x00")
}

// Stats returns, per reason, how many occurrences were handed to the
// broadcaster and how many the spam filter dropped since Start.
func (r *Recorder) Stats() (recorded, filtered map[Reason]int64) {
	if r == nil {
		return map[Reason]int64{}, map[Reason]int64{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	recorded, filtered = make(map[Reason]int64, len(r.recorded)), make(map[Reason]int64, len(r.filtered))
	for k, v := range r.recorded {
		recorded[k] = v
	}
	for k, v := range r.filtered {
		filtered[k] = v
	}
	return recorded, filtered
}

// Instance records reason with note on the MAT Service of instance key
// ("<namespace>.<name>", the discovered Service's namespace and name), in
// that namespace. The Service's UID (so `kubectl describe svc` lists the
// Event) is read with one GET per minute and instance at most, in the
// background: Instance never waits on the API server. When the Service
// does not exist (a static instance, or one being removed) nothing is
// recorded; when its UID cannot be read the Event names it without one.
func (r *Recorder) Instance(key string, reason Reason, note string) {
	if r == nil {
		return
	}
	ns, name, err := mbevents.SplitKey(key)
	if err != nil {
		r.log.Debug("no Kubernetes Event: not an instance key", "instance", key, "reason", reason)
		return
	}
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: ns, Name: name}
	if !r.admit(ref, reason) {
		return
	}
	r.withUID(ns, name, func(e uidEntry) {
		if !e.missing {
			ref.UID = e.uid
			r.emit(ref, reason, note)
		}
	})
}

// withUID calls then with the cache entry of Service ns/name: at once when
// it is fresh, else after one GET shared by every caller meanwhile (in a
// goroutine owned by Start's context; then is not called when it ended).
func (r *Recorder) withUID(ns, name string, then func(uidEntry)) {
	k := ns + "/" + name
	r.mu.Lock()
	if e, ok := r.uids[k]; ok && r.now().Sub(e.at) < uidTTL {
		r.mu.Unlock()
		then(e)
		return
	}
	waiting, busy := r.pending[k]
	r.pending[k] = append(waiting, then)
	r.mu.Unlock()
	if busy {
		return
	}
	go func() {
		e := r.readUID(ns, name)
		r.mu.Lock()
		thens := r.pending[k]
		delete(r.pending, k)
		r.mu.Unlock()
		if r.ctx.Err() != nil {
			return
		}
		for _, f := range thens {
			f(e)
		}
	}()
}

// Service records reason with note on svc, a BMC Service, when it has a UID
// (it exists); otherwise, as for a create the API server refused, on the
// MAT Service of instance key, the note naming svc.
func (r *Recorder) Service(svc *corev1.Service, key string, reason Reason, note string) {
	if r == nil {
		return
	}
	if svc.UID == "" {
		r.Instance(key, reason, "Service "+svc.Namespace+"/"+svc.Name+": "+note)
		return
	}
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID}
	if r.admit(ref, reason) {
		r.emit(ref, reason, note)
	}
}

// admit runs the spam filter for one occurrence and counts it.
func (r *Recorder) admit(ref *corev1.ObjectReference, reason Reason) bool {
	e := &corev1.Event{InvolvedObject: *ref, Type: reason.Type(), Reason: string(reason)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.spam.Filter(e) {
		r.filtered[reason]++
		return false
	}
	r.recorded[reason]++
	return true
}

func (r *Recorder) emit(ref *corev1.ObjectReference, reason Reason, note string) {
	r.rec.Eventf(ref, nil, reason.Type(), string(reason), reason.Action(), "%s", cut(r.clean(note), MaxNote))
}

// readUID reads Service ns/name and caches what it learnt: its UID, or
// that it does not exist. A Service that cannot be read (not cached) is
// returned with no UID.
func (r *Recorder) readUID(ns, name string) uidEntry {
	k := ns + "/" + name
	now := r.now()
	gctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	var e uidEntry
	svc, err := r.kube.CoreV1().Services(ns).Get(gctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		e = uidEntry{uid: svc.UID, at: now}
	case apierrors.IsNotFound(err):
		e = uidEntry{missing: true, at: now}
	default:
		r.log.Debug("MAT Service not readable; the Kubernetes Event names it without its UID", "service", k, "error", err)
		return uidEntry{}
	}
	r.mu.Lock()
	if len(r.uids) > 4096 {
		for key, v := range r.uids {
			if now.Sub(v.at) >= uidTTL {
				delete(r.uids, key)
			}
		}
	}
	r.uids[k] = e
	r.mu.Unlock()
	return e
}

// cut returns s cut to at most n bytes on a rune boundary, ending in "…"
// when it was cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "…"
	i := n - len(more)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + more
}
