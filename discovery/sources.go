package discovery

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/matbus/matbus/events"
)

// Paths of the sources API.
const (
	// SourcesPath is where SourceList serves the Sources document.
	SourcesPath = "/v1/sources"
	// SourcesHealthPath answers 200 "ok\n" while the sources API serves.
	SourcesHealthPath = "/v1/healthz"
)

// Sources is the document served on GET SourcesPath: the MAT instances this
// discovery replica's own source sees, for the MAT protocol gateway. Every
// replica, leading or not, serves the same document once its passes agree.
type Sources struct {
	// Generation increases by one whenever the set of (Name, BaseURL)
	// pairs changes (a pod change alone does not count); it starts at 0
	// with the process, so two replicas may count differently.
	Generation uint64 `json:"generation"`
	// Ready is false until the first successful discovery pass and true
	// from then on.
	Ready bool `json:"ready"`
	// List is sorted by Name, then BaseURL; never null.
	List []SourceEntry `json:"sources"`
}

// SourceEntry is one MAT instance as the gateway knows it.
type SourceEntry struct {
	// Name is the discovered Service's name (of a static instance: its
	// name without the namespace), e.g. "mat-0-bmc-mock".
	Name string `json:"name"`
	// BaseURL is the MAT API base URL: for a discovered Service
	// "<scheme>://<service>.<namespace>.svc.<cluster-domain>:<port>"
	// whatever the host mode of the published URL, or its URLAnnotation
	// as is; for a static instance its URL.
	BaseURL string `json:"base_url"`
	// Pod is the MAT pod name (label PodNameLabel) in multi-pod
	// deployments, else "".
	Pod string `json:"pod"`
}

// EntrySource is implemented by a Source whose sources-API entries are not
// just its instances (KubeSource: the Service's DNS name instead of the
// published URL, the Service's name instead of the instance key). For
// other sources the entries are derived from Instances: Name is the key
// without its namespace, BaseURL the URL, Pod the pod name.
type EntrySource interface {
	// SourceEntries returns the entries in any order, and false while the
	// source has not synced or cannot be listed (a failed pass).
	SourceEntries() ([]SourceEntry, bool)
}

// entriesOf returns the sources-API entries of src, sorted.
func entriesOf(src Source) ([]SourceEntry, bool) {
	var list []SourceEntry
	if es, ok := src.(EntrySource); ok {
		var synced bool
		if list, synced = es.SourceEntries(); !synced {
			return nil, false
		}
	} else {
		insts, synced := src.Instances()
		if !synced {
			return nil, false
		}
		list = make([]SourceEntry, 0, len(insts))
		for _, in := range insts {
			_, name, _ := strings.Cut(in.Key, ".")
			list = append(list, SourceEntry{Name: name, BaseURL: in.URL, Pod: in.PodName})
		}
	}
	if list == nil {
		list = []SourceEntry{}
	}
	slices.SortFunc(list, func(a, b SourceEntry) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.BaseURL, b.BaseURL), cmp.Compare(a.Pod, b.Pod))
	})
	return list, true
}

// SourceEntries implements EntrySource: one entry per selected Service
// that is an instance (a valid key, and a valid URLAnnotation or at least
// one port). BaseURL is "<scheme>://<ServiceDNSName>:<port>" (the port
// named "redfish" or "bmc-mock", else the first), so a re-created Service
// with a new cluster IP keeps its entry; URLAnnotation is used as is. It
// reports nothing: Instances already reports the Services it skips.
func (s *KubeSource) SourceEntries() ([]SourceEntry, bool) {
	svcs, ok := s.selected()
	if !ok {
		return nil, false
	}
	out := make([]SourceEntry, 0, len(svcs))
	for _, svc := range svcs {
		if _, err := events.Key(svc.Namespace, svc.Name); err != nil {
			continue
		}
		e := SourceEntry{Name: svc.Name, Pod: svc.Labels[PodNameLabel]}
		if u := svc.Annotations[URLAnnotation]; u != "" {
			if events.ValidateURL(u) != nil {
				continue
			}
			e.BaseURL = u
		} else {
			if len(svc.Spec.Ports) == 0 {
				continue
			}
			port := apiPort(svc)
			host := ServiceDNSName(svc.Name, svc.Namespace, s.cfg.ClusterDomain)
			e.BaseURL = s.cfg.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(port)))
		}
		out = append(out, e)
	}
	return out, true
}

// ErrNotStarted is returned by SharedSource.Run before SharedSource.Start.
var ErrNotStarted = errors.New("discovery: shared source not started")

// SharedSource runs one Source (one informer) for several readers, e.g.
// a SourceList for the process's lifetime and a Publisher for each term
// as leader. It is itself a Source: Run only subscribes to its
// notifications. Safe for concurrent use.
type SharedSource struct {
	src Source

	mu      sync.Mutex
	started bool
	next    int
	subs    map[int]func()
}

// Share returns a SharedSource of src; call Start once before Run.
func Share(src Source) *SharedSource {
	return &SharedSource{src: src, subs: map[int]func(){}}
}

// Start runs the underlying source until ctx ends, passing each of its
// notifications on to every current subscriber. It returns the source's
// error if it cannot start, or an error when called twice.
func (s *SharedSource) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return fmt.Errorf("discovery: shared source %s started twice", s.src.Scope())
	}
	s.started = true
	s.mu.Unlock()
	if err := s.src.Run(ctx, s.broadcast); err != nil {
		return fmt.Errorf("discovery: start source %s: %w", s.src.Scope(), err)
	}
	return nil
}

func (s *SharedSource) broadcast() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, notify := range s.subs {
		notify()
	}
}

// Scope implements Source: the underlying source's scope.
func (s *SharedSource) Scope() string { return s.src.Scope() }

// Run implements Source: notify is called after every change of the
// underlying source until ctx ends. It returns ErrNotStarted before Start.
func (s *SharedSource) Run(ctx context.Context, notify func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		return ErrNotStarted
	}
	id := s.next
	s.next++
	s.subs[id] = notify
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs, id)
	})
	return nil
}

// Instances implements Source.
func (s *SharedSource) Instances() ([]events.Instance, bool) { return s.src.Instances() }

// SourceEntries implements EntrySource with the underlying source's
// entries (derived from its instances when it is no EntrySource).
func (s *SharedSource) SourceEntries() ([]SourceEntry, bool) { return entriesOf(s.src) }

// SourceList keeps the Sources document of one discovery replica, fed by
// discovery passes over the replica's own source (Run), independent of
// leadership. The rules, for a pass at time now:
//
//   - a failed pass (source not synced, list error) changes nothing;
//   - the first successful pass is served at once and makes it ready;
//     ready stays true;
//   - a pass that differs from the served list starts a pending change
//     (first seen now); it is served only when a later pass, at least
//     Debounce after it was first seen, sees exactly the same entries; a
//     pass that sees the served list again drops it (a flap is never
//     served); another set starts a new pending change, while a pending
//     change that differs only in pods keeps its first-seen time;
//   - serving bumps Generation only when the (Name, BaseURL) pairs change:
//     a pod change alone is served (confirmed like any change) under the
//     same generation.
//
// A debounce of 0 serves every pass at once. Safe for concurrent use; the
// zero value is not: use NewSourceList.
type SourceList struct {
	debounce time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	doc     Sources       // what is served
	pending []SourceEntry // a change not yet confirmed, nil when none
	since   time.Time     // when pending was first seen
}

// NewSourceList returns a SourceList whose changes need a confirming pass
// at least debounce after they were first seen (0 or less: at once).
// log (may be nil) gets a line for every served change.
func NewSourceList(debounce time.Duration, log *slog.Logger) *SourceList {
	if debounce < 0 {
		debounce = 0
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &SourceList{debounce: debounce, log: log, doc: Sources{List: []SourceEntry{}}}
}

// PassInterval is how often Run makes a pass besides the source's
// notifications: a fifth of the debounce, between 20 ms and 1 s (1 s
// with no debounce). A change is served between Debounce and Debounce +
// PassInterval after it was first seen, 5 s to 6 s with the default 5 s.
func (l *SourceList) PassInterval() time.Duration {
	if l.debounce <= 0 {
		return time.Second
	}
	return min(max(l.debounce/5, 20*time.Millisecond), time.Second)
}

// Run makes discovery passes over src until ctx ends: one at once, one
// after every notification of src and one every PassInterval. It runs src
// (src.Run), so give it a source nobody else runs, or a SharedSource. It
// returns nil when ctx ends, or src's error if it cannot start.
func (l *SourceList) Run(ctx context.Context, src Source) error {
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if err := src.Run(ctx, notify); err != nil {
		return fmt.Errorf("discovery: sources API: %w", err)
	}
	tick := time.NewTicker(l.PassInterval())
	defer tick.Stop()
	for {
		list, ok := entriesOf(src)
		l.pass(time.Now(), list, ok)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// pass applies one discovery pass made at now that saw list (sorted, not
// nil), or failed (ok false); see SourceList for the rules.
func (l *SourceList) pass(now time.Time, list []SourceEntry, ok bool) {
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !l.doc.Ready || l.debounce == 0:
		l.serveLocked(list)
	case slices.Equal(list, l.doc.List):
		l.pending = nil
	case l.pending != nil && slices.Equal(list, l.pending):
		if now.Sub(l.since) >= l.debounce {
			l.serveLocked(list)
		}
	case l.pending != nil && samePairs(list, l.pending):
		l.pending = list // the same change, newer pods: its clock runs on
	default:
		l.pending, l.since = list, now
	}
}

func (l *SourceList) serveLocked(list []SourceEntry) {
	l.pending = nil
	if !samePairs(list, l.doc.List) {
		l.doc.Generation++
		l.log.Info("sources API: new set", "generation", l.doc.Generation, "sources", len(list))
	} else if !slices.Equal(list, l.doc.List) {
		l.log.Info("sources API: pods changed", "generation", l.doc.Generation, "sources", len(list))
	}
	l.doc.List = list
	l.doc.Ready = true
}

// samePairs tells whether two sorted lists have the same (Name, BaseURL)
// pairs.
func samePairs(a, b []SourceEntry) bool {
	return slices.EqualFunc(a, b, func(x, y SourceEntry) bool { return x.Name == y.Name && x.BaseURL == y.BaseURL })
}

// Get returns the served document (a copy).
func (l *SourceList) Get() Sources {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.doc
	d.List = slices.Clone(d.List)
	return d
}

// ServeHTTP answers GET and HEAD: SourcesPath with the document as JSON,
// SourcesHealthPath with 200 "ok\n"; other paths 404, other methods 405
// with an Allow header.
func (l *SourceList) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != SourcesPath && r.URL.Path != SourcesHealthPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if r.URL.Path == SourcesHealthPath {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	body, err := json.Marshal(l.Get())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

// ServeSources listens on addr and serves l until ctx ends; it returns
// once listening (an error when addr cannot be bound) and shuts the server
// down, waiting up to 5 s for requests in flight, when ctx ends. The
// returned channel is closed when the server has stopped.
func ServeSources(ctx context.Context, addr string, l *SourceList, log *slog.Logger) (net.Addr, <-chan struct{}, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: sources API on %s: %w", addr, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{Handler: l, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("sources API stopped", "addr", ln.Addr().String(), "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("sources API", "url", "http://"+ln.Addr().String()+SourcesPath)
	return ln.Addr(), done, nil
}

// RunSourcesAPI serves the sources API on addr (ServeSources) and makes
// the passes of a NewSourceList(debounce) over src until ctx ends, or
// until the returned stop is called, which waits for both. An address
// that cannot be bound (another discovery process on this host has it, as
// when a standby runs beside the leader outside Kubernetes) is logged and
// tried again every 10 s: the sources API is not worth stopping discovery
// for.
func RunSourcesAPI(ctx context.Context, addr string, debounce time.Duration, src Source, log *slog.Logger) (stop func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sources := NewSourceList(debounce, log)
	ctx, cancel := context.WithCancel(ctx)
	served, passes := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(served)
		for {
			_, done, err := ServeSources(ctx, addr, sources, log)
			if err == nil {
				<-done
				return
			}
			log.Warn("sources API not served; retrying in 10s", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
	}()
	go func() {
		defer close(passes)
		if err := sources.Run(ctx, src); err != nil {
			log.Error("sources API passes stopped", "error", err)
		}
	}()
	return func() { cancel(); <-served; <-passes }
}
