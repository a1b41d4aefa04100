package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// desiredFresh is how long a fetched desired set answers the delete jobs
// planned before it was fetched.
const desiredFresh = time.Second

// desiredSet is what one status of an instance asks for, as far as
// deletes are concerned: the Service names it wants and the mat_ids it
// holds back (a held device is never deleted).
type desiredSet struct {
	fetchedAt time.Time
	names     map[string]bool
	ips       map[string]string // Service name -> BMC or NVOS IP
	held      map[string]bool   // mat_ids of held devices
	holdAll   bool              // a device of the status is invalid: no deletes at all
}

// desiredOf extracts the desired set of d, fetched at fetchedAt.
func desiredOf(d plan.Desired, fetchedAt time.Time) *desiredSet {
	s := &desiredSet{fetchedAt: fetchedAt, names: make(map[string]bool, len(d.Services)),
		ips: make(map[string]string, len(d.Services)), held: make(map[string]bool, len(d.Held))}
	for _, svc := range d.Services {
		s.names[svc.Name] = true
		s.ips[svc.Name] = plan.ServiceIP(svc)
	}
	for _, h := range d.Held {
		s.held[h.MatID] = true
		if holdsDeletes(h.Reason) {
			s.holdAll = true
		}
	}
	s.holdAll = s.holdAll || d.NoStatus
	return s
}

// keeps returns why job must not run against s ("" when it may): the
// status still wants the Service's name, holds its device, or holds
// every delete of the instance.
func (s *desiredSet) keeps(job events.DeleteJob) string {
	switch {
	case s.names[job.Name]:
		return "the newest status still wants this Service"
	case job.MatID != "" && s.held[job.MatID]:
		return "the newest status still reports its device (held back from a Service)"
	case s.holdAll:
		return "the newest status of the instance has invalid devices; its deletes are held"
	}
	return ""
}

// desiredCache keeps the newest desired set per instance, fetched by a sync
// or by a delete job's re-check; concurrent re-checks of one instance share
// one fetch. It is safe for concurrent use.
type desiredCache struct {
	mu    sync.Mutex
	slots map[string]*desiredSlot
}

type desiredSlot struct {
	mu  sync.Mutex // held while fetching
	set *desiredSet
}

func newDesiredCache() *desiredCache { return &desiredCache{slots: map[string]*desiredSlot{}} }

func (c *desiredCache) slot(key string) *desiredSlot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.slots[key]
	if !ok {
		s = &desiredSlot{}
		c.slots[key] = s
	}
	return s
}

// put records set for key if it is newer than what is kept.
func (c *desiredCache) put(key string, set *desiredSet) {
	s := c.slot(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set == nil || set.fetchedAt.After(s.set.fetchedAt) {
		s.set = set
	}
}

// forget drops key.
func (c *desiredCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.slots, key)
}

// get returns a desired set of key fetched after `after` and at most
// desiredFresh ago, calling fetch (once for all concurrent callers) when
// there is none.
func (c *desiredCache) get(ctx context.Context, key string, after time.Time, fetch func(context.Context) (*desiredSet, error)) (*desiredSet, error) {
	s := c.slot(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set != nil && s.set.fetchedAt.After(after) && time.Since(s.set.fetchedAt) < desiredFresh {
		return s.set, nil
	}
	set, err := fetch(ctx)
	if err != nil {
		return nil, err
	}
	if s.set == nil || set.fetchedAt.After(s.set.fetchedAt) {
		s.set = set
	}
	return set, nil
}

// currentDesired returns the desired set of instance inst from a status
// fetched after `after` (see desiredCache.get).
func (w *Worker) currentDesired(ctx context.Context, inst events.Instance, after time.Time) (*desiredSet, error) {
	return w.desired.get(ctx, inst.Key, after, func(ctx context.Context) (*desiredSet, error) {
		client, err := w.cache.Acquire(ctx, inst.Key, inst.URL)
		if err != nil {
			return nil, err
		}
		at := time.Now()
		poll, err := fetchStatus(ctx, client, "")
		if err != nil {
			return nil, fmt.Errorf("re-check against the newest status: %w", err)
		}
		st := poll.Status
		// The owner does not matter for names; no API request here.
		d := plan.Build(plan.Instance{Key: inst.Key, PodName: inst.PodName}, st, w.cfg.Plan)
		return desiredOf(d, at), nil
	})
}

// allocationResolves reports whether the refusal of cluster IP ip will end
// by itself: the Service holding it is one of ours whose instance is gone,
// or whose instance's newest status no longer gives it that IP (the IP
// moved between devices of different instances, and the holder's sync will
// free it). A holder that is not ours (unknown to the informer), or one
// whose status still wants the IP (two instances report one BMC IP), does
// not resolve by itself.
func (w *Worker) allocationResolves(ctx context.Context, ip string) bool {
	if ip == "" || w.services == nil {
		return false
	}
	all, err := w.services.Services(w.cfg.Plan.Namespace).List(labels.Everything())
	if err != nil {
		return false
	}
	for _, h := range all {
		if h.Spec.ClusterIP != ip {
			continue
		}
		key := h.Labels[plan.LabelInstance]
		if key == "" {
			return false
		}
		rec, found, err := w.bus.LastInstance(ctx, key)
		if err != nil {
			return true // cannot tell; keep retrying
		}
		if !found || !rec.Present() {
			return true // its instance is gone: the clean-up frees it
		}
		set, err := w.currentDesired(ctx, rec.Instance, time.Now().Add(-desiredFresh))
		if err != nil {
			return true
		}
		return set.ips[h.Name] != ip
	}
	return false
}
