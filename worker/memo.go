package worker

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/plan"
)

// memo remembers, per instance, what this worker's last complete sync saw:
// the status fingerprint and the change count of the instance's Services
// in the informer. A poll job whose fetched fingerprint and change count
// are both the same needs no planning and no API request: the status is
// the one already applied and nobody (this worker, another worker, a
// person) touched the instance's Services since. Any doubt (no entry, a
// failed write, a Service event) makes the next poll plan again, and every
// full resync plans regardless. It is safe for concurrent use.
type memo struct {
	mu      sync.Mutex
	entries map[string]memoEntry // instance key -> entry
	changes map[string]uint64    // instance label value -> Service events seen
	adopt   uint64               // events of Services without an instance label (adoption candidates)
}

type memoEntry struct {
	fingerprint string
	changes     uint64 // changes[label] + adopt when the plan was made
	owner       *metav1.OwnerReference
	ownerName   string
	ownerAt     time.Time
}

func newMemo() *memo {
	return &memo{entries: map[string]memoEntry{}, changes: map[string]uint64{}}
}

// handler counts informer events per instance label.
func (m *memo) handler() cache.ResourceEventHandler {
	bump := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		s, ok := obj.(*corev1.Service)
		if !ok {
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if v, ok := s.Labels[plan.LabelInstance]; ok {
			m.changes[v]++
			return
		}
		m.adopt++
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    bump,
		UpdateFunc: func(_, n any) { bump(n) },
		DeleteFunc: bump,
	}
}

// changeCount returns the number of Service events seen for instance key
// (plus those of unlabelled Services), to compare later.
func (m *memo) changeCount(key string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changes[plan.LabelValue(key)] + m.adopt
}

// unchanged reports whether key's last complete sync saw fingerprint fp
// and no Service event of the instance came since.
func (m *memo) unchanged(key, fp string) bool {
	if fp == "" {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	return ok && e.fingerprint == fp && e.changes == m.changes[plan.LabelValue(key)]+m.adopt
}

// fingerprint returns the fingerprint of key's last complete sync, "" if none.
func (m *memo) fingerprint(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[key].fingerprint
}

// completed records a complete sync of key from fingerprint fp, planned
// when the change count was changes.
func (m *memo) completed(key, fp string, changes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key]
	e.fingerprint, e.changes = fp, changes
	m.entries[key] = e
}

// invalidate forgets key's fingerprint, so its next poll plans again.
func (m *memo) invalidate(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[key]; ok {
		e.fingerprint = ""
		m.entries[key] = e
	}
}

// owner returns the cached owner reference of key for Deployment name, if
// read within ttl.
func (m *memo) owner(key, name string, ttl time.Duration) (*metav1.OwnerReference, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || e.ownerName != name || e.ownerAt.IsZero() || time.Since(e.ownerAt) > ttl {
		return nil, false
	}
	return e.owner, true
}

func (m *memo) setOwner(key, name string, ref *metav1.OwnerReference) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key]
	e.owner, e.ownerName, e.ownerAt = ref, name, time.Now()
	m.entries[key] = e
}

// forget drops everything about key (the instance is gone).
func (m *memo) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.entries, key)
}
