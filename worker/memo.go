package worker

import (
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
//
// A Service that an instance's plan wants but another instance holds (the
// same name, or in cluster-ip mode the same cluster IP) changes the
// waiting instance's count too when it is deleted, by anyone: the memo
// indexes, per instance, the names and IPs its last plan wanted without
// holding them (see waitFor), so the waiting instance's next poll plans and
// creates the Service.
//
// The delete of a Service that the instance's last plan itself deletes (see
// expect) is no change: it is what that plan asked for. So a fan-out of
// thousands of delete jobs does not make every poll of its instance fetch,
// decode and plan the whole status again only to find each remaining delete
// queued already. A plan that left deletes unpublished because the
// instance's delete queue was not empty (deferred) is planned again once
// that queue is empty (see deferredPlan).
type memo struct {
	mu      sync.Mutex
	entries map[string]memoEntry // instance key -> entry
	changes map[string]uint64    // instance label value -> Service events seen
	adopt   uint64               // events of Services without an instance label (adoption candidates)
	// Instance label values waiting for a Service name or a cluster IP.
	byName, byIP map[string]map[string]struct{}
	// expected holds, per instance label value, the UIDs of the Services
	// the instance's last plan deletes.
	expected map[string]map[types.UID]struct{}
}

type memoEntry struct {
	fingerprint string
	changes     uint64 // changes[label] + adopt when the plan was made
	owner       *metav1.OwnerReference
	ownerName   string
	ownerAt     time.Time
	// waitNames and waitIPs are the instance's keys in byName and byIP.
	waitNames, waitIPs []string
	// deferred: the last plan left stale deletes unpublished until the
	// instance's delete queue is empty.
	deferred bool
	// epoch is the epoch_id of the last status planned ("" when none).
	epoch string
}

func newMemo() *memo {
	return &memo{entries: map[string]memoEntry{}, changes: map[string]uint64{},
		byName: map[string]map[string]struct{}{}, byIP: map[string]map[string]struct{}{},
		expected: map[string]map[types.UID]struct{}{}}
}

// handler counts informer events per instance label, except the delete
// of a Service its instance's last plan deletes.
func (m *memo) handler() cache.ResourceEventHandler {
	bump := func(obj any, deleted bool) {
		s, ok := serviceOf(obj)
		if !ok {
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		v, ok := s.Labels[plan.LabelInstance]
		if !ok {
			m.adopt++
			return
		}
		if set := m.expected[v]; deleted && set != nil {
			if _, planned := set[s.UID]; planned && s.UID != "" {
				delete(set, s.UID)
				return
			}
		}
		m.changes[v]++
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { bump(obj, false) },
		UpdateFunc: func(_, n any) { bump(n, false) },
		DeleteFunc: func(obj any) {
			bump(obj, true)
			m.freed(obj)
		},
	}
}

// expect records that the plan of instance key being applied deletes svcs
// (existing Services, by UID), replacing what its earlier plans deleted:
// their deletes, by anyone, are no change of key's Services. A Service an
// earlier plan deleted and this one keeps (its device came back) counts
// again. The caller records it before the deletes are sent, and a plan
// that fails is planned again (invalidate), so nothing is left expected
// that no delete job will delete.
func (m *memo) expect(key string, svcs []*corev1.Service) {
	v := plan.LabelValue(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(svcs) == 0 {
		delete(m.expected, v)
		return
	}
	set := make(map[types.UID]struct{}, len(svcs))
	for _, s := range svcs {
		if s.UID != "" {
			set[s.UID] = struct{}{}
		}
	}
	m.expected[v] = set
}

// setDeferred records whether key's plan left stale deletes unpublished
// because the instance's delete queue was not empty.
func (m *memo) setDeferred(key string, deferred bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key]
	e.deferred = deferred
	m.entries[key] = e
}

// deferredPlan reports whether key's last plan left stale deletes
// unpublished (see setDeferred).
func (m *memo) deferredPlan(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[key].deferred
}

// freed counts the delete of a Service as a change of every instance
// waiting for its name or one of its cluster IPs.
func (m *memo) freed(obj any) {
	s, ok := serviceOf(obj)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	waiting := maps.Clone(m.byName[s.Name])
	for _, ip := range serviceIPs(s) {
		if waiting == nil {
			waiting = map[string]struct{}{}
		}
		maps.Copy(waiting, m.byIP[ip])
	}
	for v := range waiting {
		if v != s.Labels[plan.LabelInstance] { // counted by bump already
			m.changes[v]++
		}
	}
}

// changed counts a change of instance key's Services.
func (m *memo) changed(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes[plan.LabelValue(key)]++
}

// waitFor records that instance key wants svcs (their names and, where
// set, spec.clusterIP) and may not hold them, replacing what it waited for
// before: the delete of any Service with one of those names or IPs is a
// change of key's Services. It costs one map insert per name and IP;
// nothing else is recorded, so a plan that got everything it wanted passes
// no Services.
func (m *memo) waitFor(key string, svcs []*corev1.Service) {
	v := plan.LabelValue(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key]
	m.unwaitLocked(v, e)
	e.waitNames, e.waitIPs = nil, nil
	for _, s := range svcs {
		e.waitNames = append(e.waitNames, s.Name)
		addWaiter(m.byName, s.Name, v)
		if ip := s.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
			e.waitIPs = append(e.waitIPs, ip)
			addWaiter(m.byIP, ip, v)
		}
	}
	m.entries[key] = e
}

func (m *memo) unwaitLocked(v string, e memoEntry) {
	for _, n := range e.waitNames {
		removeWaiter(m.byName, n, v)
	}
	for _, ip := range e.waitIPs {
		removeWaiter(m.byIP, ip, v)
	}
}

func addWaiter(idx map[string]map[string]struct{}, k, v string) {
	set := idx[k]
	if set == nil {
		set = map[string]struct{}{}
		idx[k] = set
	}
	set[v] = struct{}{}
}

func removeWaiter(idx map[string]map[string]struct{}, k, v string) {
	if set := idx[k]; set != nil {
		delete(set, v)
		if len(set) == 0 {
			delete(idx, k)
		}
	}
}

// serviceOf returns the Service of an informer event's object (also of a
// delete seen late, cache.DeletedFinalStateUnknown).
func serviceOf(obj any) (*corev1.Service, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*corev1.Service)
	return s, ok
}

// serviceIPs returns the cluster IPs of s (spec.clusterIPs, else spec.clusterIP).
func serviceIPs(s *corev1.Service) []string {
	if len(s.Spec.ClusterIPs) > 0 {
		return s.Spec.ClusterIPs
	}
	if s.Spec.ClusterIP != "" {
		return []string{s.Spec.ClusterIP}
	}
	return nil
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

// epoch returns the epoch_id of the last status of key this worker
// planned, "" when it planned none.
func (m *memo) epoch(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[key].epoch
}

// setEpoch records the epoch_id of the status of key being planned.
func (m *memo) setEpoch(key, epoch string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key]
	e.epoch = epoch
	m.entries[key] = e
}

// forget drops everything about key (the instance is gone), including
// what it waited for.
func (m *memo) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unwaitLocked(plan.LabelValue(key), m.entries[key])
	delete(m.entries, key)
	delete(m.expected, plan.LabelValue(key))
}
