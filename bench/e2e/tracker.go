package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// tracker follows the Services of one namespace through an informer and
// records when each watch event was received. Waiters registered with it
// are settled by those events, so waiting costs no API requests.
type tracker struct {
	mu      sync.Mutex
	present map[string]bool
	waiters map[*waiter]struct{}
}

// waiter waits until every one of names is present (want true) or absent
// (want false). at is the receive time of the event that settled it,
// first that of the first event that settled one of the names.
type waiter struct {
	want    bool
	names   map[string]struct{}
	pending map[string]struct{}
	done    chan struct{}
	at      time.Time
	first   time.Time
}

// startTracker starts an informer on the Services of ns and returns once
// its cache has synced (or ctx ends). The informer stops when ctx ends.
func startTracker(ctx context.Context, kube kubernetes.Interface, ns string) (*tracker, error) {
	t := &tracker{present: map[string]bool{}, waiters: map[*waiter]struct{}{}}
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Services().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*corev1.Service); ok {
				t.set(s.Name, true, time.Now())
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*corev1.Service); ok {
				t.set(s.Name, false, time.Now())
			}
		},
	})
	if err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("informer on the Services of %s did not sync: %w", ns, context.Cause(ctx))
	}
	return t, nil
}

func (t *tracker) set(name string, present bool, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if present {
		t.present[name] = true
	} else {
		delete(t.present, name)
	}
	for w := range t.waiters {
		if _, ok := w.names[name]; !ok {
			continue
		}
		if present == w.want {
			delete(w.pending, name)
			if w.first.IsZero() {
				w.first = at
			}
		} else {
			w.pending[name] = struct{}{}
		}
		if len(w.pending) == 0 {
			w.at = at
			close(w.done)
			delete(t.waiters, w)
		}
	}
}

// Count returns how many Services exist now.
func (t *tracker) Count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.present)
}

// Present reports whether the Service name exists now.
func (t *tracker) Present(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.present[name]
}

// Expect registers a waiter for names to become present (want true) or
// absent (want false). Register before making the change.
func (t *tracker) Expect(names []string, want bool) *waiter {
	w := &waiter{want: want, names: make(map[string]struct{}, len(names)),
		pending: map[string]struct{}{}, done: make(chan struct{})}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range names {
		w.names[n] = struct{}{}
		if t.present[n] != want {
			w.pending[n] = struct{}{}
		}
	}
	if len(w.pending) == 0 {
		w.at = time.Now()
		close(w.done)
		return w
	}
	t.waiters[w] = struct{}{}
	return w
}

// Wait blocks until the waiter is settled, until deadline, until ctx
// ends, or until alive (checked every second; may be nil) returns an
// error. It returns the settling event's receive time, or the number of
// names still pending and why it stopped waiting.
func (t *tracker) Wait(ctx context.Context, w *waiter, deadline time.Time, alive func() error) (time.Time, int, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var why error
	for why == nil {
		select {
		case <-w.done:
			return w.at, 0, nil
		case <-timer.C:
			why = errTimeout
		case <-ctx.Done():
			why = context.Cause(ctx)
		case <-tick.C:
			if alive != nil {
				why = alive()
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-w.done: // settled at the last moment
		return w.at, 0, nil
	default:
	}
	delete(t.waiters, w)
	return time.Time{}, len(w.pending), why
}

// errTimeout ends a wait whose deadline passed.
var errTimeout = errors.New("timeout")
