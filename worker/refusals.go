package worker

import (
	"crypto/sha256"
	"encoding/json"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Backoff of a recreate whose replacement the API server refused
// permanently (the old Service was put back): it is not tried again for
// recreateRefusedFirst, then twice as long each time, at most
// recreateRefusedMax. Trying it at every sync would delete and restore the
// Service, a gap in the BMC's route, each time.
const (
	recreateRefusedFirst = time.Minute
	recreateRefusedMax   = time.Hour
)

// recreateRefusals holds, per instance and Service name, the recreates the
// API server refused, keyed by a fingerprint of the replacement: a changed
// replacement (another IP, other labels) is tried at once. Safe for
// concurrent use.
type recreateRefusals struct {
	mu   sync.Mutex
	keys map[string]map[string]refusal // instance key -> Service name -> refusal
}

type refusal struct {
	fingerprint [32]byte
	until       time.Time
	wait        time.Duration // the backoff that set until
	msg         string        // the API server's answer
}

// fingerprint identifies a replacement Service by its content.
func fingerprint(s *corev1.Service) [32]byte {
	b, _ := json.Marshal(s) // a Service always marshals
	return sha256.Sum256(b)
}

// blocked returns the refusal that still holds want back, if any.
func (r *recreateRefusals) blocked(key string, want *corev1.Service, now time.Time) (refusal, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.keys[key][want.Name]
	if !ok || f.fingerprint != fingerprint(want) || !now.Before(f.until) {
		return refusal{}, false
	}
	return f, true
}

// refused records that want was refused with msg, doubling the backoff of
// a refusal of the same replacement.
func (r *recreateRefusals) refused(key string, want *corev1.Service, msg string, now time.Time) refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	fp := fingerprint(want)
	wait := recreateRefusedFirst
	if prev, ok := r.keys[key][want.Name]; ok && prev.fingerprint == fp {
		wait = min(2*prev.wait, recreateRefusedMax)
	}
	if r.keys == nil {
		r.keys = map[string]map[string]refusal{}
	}
	if r.keys[key] == nil {
		r.keys[key] = map[string]refusal{}
	}
	f := refusal{fingerprint: fp, until: now.Add(wait), wait: wait, msg: msg}
	r.keys[key][want.Name] = f
	return f
}

// done forgets the refusal of Service name (its recreate went through, or
// is no longer planned).
func (r *recreateRefusals) done(key, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.keys[key], name)
	if len(r.keys[key]) == 0 {
		delete(r.keys, key)
	}
}

// forget drops the refusals of instance key.
func (r *recreateRefusals) forget(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.keys, key)
}

func (r *recreateRefusals) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys)
}
