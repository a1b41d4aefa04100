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
	"sync"
	"time"

	"github.com/matbus/matbus/events"
)

// SourcesPath is where SourceList serves the sources document.
const SourcesPath = "/v1/sources"

// Sources is the document served on GET SourcesPath: the MAT instances the
// publisher currently publishes, for the MAT protocol gateway.
type Sources struct {
	// Generation increases by one whenever the set of sources changes; it
	// is a change hint only and starts at 0 with the process.
	Generation uint64 `json:"generation"`
	// Ready is false until the publisher has a complete view (its source
	// synced and the instances stream read), and again once it stops
	// publishing (lost the lead).
	Ready bool `json:"ready"`
	// List is sorted by Name, never null.
	List []SourceEntry `json:"sources"`
}

// SourceEntry is one MAT instance.
type SourceEntry struct {
	Name    string `json:"name"`     // the instance key, "<namespace>.<service-name>"
	BaseURL string `json:"base_url"` // the MAT API base URL, e.g. "https://10.96.0.10:1266"
	Pod     string `json:"pod"`      // the MAT pod name in multi-pod deployments, else ""
}

// SourceList keeps the Sources document. A Publisher with
// PublisherConfig.Sources set reports the instances it publishes after
// every reconcile that read the instances stream; the first report is
// visible at once (and makes the list ready), later changes are debounced:
// a change becomes visible Debounce after the first change of a burst, and
// every change within that window is folded into one generation. It is
// safe for concurrent use; the zero value is not: use NewSourceList.
type SourceList struct {
	debounce time.Duration

	mu      sync.Mutex
	doc     Sources       // what is served
	pending []SourceEntry // the newest report not yet served, nil when none
	timer   *time.Timer
}

// NewSourceList returns a SourceList that folds changes within debounce (0
// or less: every change is visible at once).
func NewSourceList(debounce time.Duration) *SourceList {
	return &SourceList{debounce: debounce, doc: Sources{List: []SourceEntry{}}}
}

// Report records the instances being published now. The order of insts
// does not matter.
func (l *SourceList) Report(insts []events.Instance) {
	list := make([]SourceEntry, 0, len(insts))
	for _, in := range insts {
		list = append(list, SourceEntry{Name: in.Key, BaseURL: in.URL, Pod: in.PodName})
	}
	slices.SortFunc(list, func(a, b SourceEntry) int { return cmp.Compare(a.Name, b.Name) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.doc.Ready || l.debounce <= 0 {
		l.stopLocked()
		l.applyLocked(list)
		return
	}
	l.pending = list
	if l.timer == nil {
		l.timer = time.AfterFunc(l.debounce, l.flush)
	}
}

// Unready marks the list not ready (the publisher stopped); the last set
// stays visible, and the next Report is visible at once.
func (l *SourceList) Unready() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopLocked()
	l.doc.Ready = false
}

// Get returns the served document (a copy).
func (l *SourceList) Get() Sources {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.doc
	d.List = slices.Clone(d.List)
	return d
}

func (l *SourceList) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = nil
	if l.pending != nil {
		l.applyLocked(l.pending)
		l.pending = nil
	}
}

func (l *SourceList) stopLocked() {
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.pending = nil
}

func (l *SourceList) applyLocked(list []SourceEntry) {
	if !slices.Equal(list, l.doc.List) {
		l.doc.Generation++
		l.doc.List = list
	}
	l.doc.Ready = true
}

// ServeHTTP answers GET (and HEAD) SourcesPath with the document as JSON,
// 404 for other paths and 405 for other methods.
func (l *SourceList) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != SourcesPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(l.Get())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
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
