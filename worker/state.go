package worker

import (
	"context"

	"sync"
)

// instanceState is everything a worker keeps per instance, and the one
// place that forgets it: the status memo (fingerprints, owner references,
// waits, change counts), the desired sets delete jobs are checked against,
// the warnings already reported, the instances whose certificate was
// refused, the recreates the API server refused, the cached MAT client and the instance's metric series.
// Stale delete jobs already published (pendingDeletes, by Service UID)
// expire after the duplicate window instead (see freshDeletes).
type instanceState struct {
	memo    *memo
	desired *desiredCache
	warned  warnedSet
	refused refusedSet
	// recreates are the recreates the API server refused, held back.
	recreates recreateRefusals
	cache     *ClientCache
	metrics   *Metrics
}

// forget drops everything kept about instance key (it is gone) and
// closes its MAT client unless another instance shares it.
func (s *instanceState) forget(ctx context.Context, key string) {
	s.cache.Release(ctx, key)
	s.memo.forget(key)
	s.desired.forget(key)
	s.warned.forget(key)
	s.refused.forget(key)
	s.recreates.forget(key)
	s.metrics.forget(key)
}

// warnedSet holds the plan warnings already reported, per instance: a
// warning repeats on every sync while the status stays the same. It is
// safe for concurrent use.
type warnedSet struct {
	mu   sync.Mutex
	seen map[string]map[string]struct{} // instance key -> "<mat_id>\x00<detail>"
}

// first reports whether warning id of instance key is new, and records it.
func (s *warnedSet) first(key, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[key][id]; ok {
		return false
	}
	if s.seen == nil {
		s.seen = map[string]map[string]struct{}{}
	}
	if s.seen[key] == nil {
		s.seen[key] = map[string]struct{}{}
	}
	s.seen[key][id] = struct{}{}
	return true
}

// forget drops the warnings of key.
func (s *warnedSet) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}

func (s *warnedSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// sizes returns the number of instances each per-instance store holds
// (for tests and inspection: all 0 once every instance is gone).
func (s *instanceState) sizes() map[string]int {
	s.memo.mu.Lock()
	memo := len(s.memo.entries) + len(s.memo.expected)
	s.memo.mu.Unlock()
	s.desired.mu.Lock()
	desired := len(s.desired.slots)
	s.desired.mu.Unlock()
	s.refused.mu.Lock()
	refused := len(s.refused.keys)
	s.refused.mu.Unlock()
	return map[string]int{"memo": memo, "desired": desired, "warned": s.warned.len(), "refused": refused, "recreates": s.recreates.len(),
		"clients": len(s.cache.Stats().URLs), "metric_series": s.metrics.series()}
}
