package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/matbus/matbus/events"
)

// refusedSet holds the instances whose last status fetch by this worker
// failed because MAT's certificate was refused (matclient's
// IsVerificationError): when the CA bundle changes, these are the ones
// worth probing again at once. It is safe for concurrent use.
type refusedSet struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// note records the outcome of a fetch of key: refused or not.
func (r *refusedSet) note(key string, refused bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !refused {
		delete(r.keys, key)
		return
	}
	if r.keys == nil {
		r.keys = map[string]struct{}{}
	}
	r.keys[key] = struct{}{}
}

// forget drops key (the instance is gone).
func (r *refusedSet) forget(key string) { r.note(key, false) }

// list returns the keys, sorted.
func (r *refusedSet) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.keys))
	for k := range r.keys {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// RetryRefused tells the discovery scheduler that the trust in MAT changed
// (the CA bundle was re-read with new contents): for every instance whose
// last fetch by this worker was refused for its certificate it publishes
// a result with events.OutcomeRetry, and the scheduler probes the instance
// at once instead of at its backoff. It returns how many it published;
// a publish that fails is logged and leaves the instance to its next
// probe.
func (w *Worker) RetryRefused(ctx context.Context) int {
	keys := w.refused.list()
	n := 0
	for _, key := range keys {
		if ctx.Err() != nil {
			break
		}
		r := events.SyncResult{Key: key, Outcome: events.OutcomeRetry, Worker: w.cfg.Name,
			Error: "the MAT CA bundle changed since this instance's certificate was refused"}
		id := fmt.Sprintf("retry:%s:%s:%d", w.cfg.Name, key, time.Now().UnixNano())
		if err := w.bus.PublishResult(id, r); err != nil {
			w.log.Warn("could not ask for an early probe; the instance waits for its next one", "instance", key, "error", err)
			continue
		}
		n++
	}
	if n > 0 {
		w.log.Info("MAT CA bundle changed: asked for an early probe of the instances whose certificate was refused", "instances", n)
	}
	return n
}
