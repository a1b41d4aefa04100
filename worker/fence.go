package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
)

// epochFence keeps the newest discovery leader epoch per Lease a worker has seen, in
// an instance event, a stored instance record, a sync or a clean-up job.
// Messages of an older epoch come from a deposed leader (ADR 17); messages
// without one are never refused. It is safe for concurrent use.
type epochFence struct {
	mu     sync.Mutex
	newest map[string]events.Epoch // by Lease
}

// observe raises the newest epoch of e's Lease to e when e is newer.
func (f *epochFence) observe(e *events.Epoch) {
	if e == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n, ok := f.newest[e.Lease]; !ok || n.Term < e.Term {
		if f.newest == nil {
			f.newest = map[string]events.Epoch{}
		}
		f.newest[e.Lease] = *e
	}
}

// stale reports whether e is older than the newest epoch seen on its
// Lease, and that one.
func (f *epochFence) stale(e *events.Epoch) (bool, *events.Epoch) {
	if e == nil {
		return false, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.newest[e.Lease]
	if !ok || !e.Before(&n) {
		return false, nil
	}
	return true, &n
}

// admit observes env's epoch and returns nil, or, for a message of a
// deposed leader, publishes one error event of kind discovery saying so
// and returns an error that has been reported.
func (w *Worker) admit(ctx context.Context, env events.Envelope, subject string) error {
	stale, newest := w.fence.stale(env.Epoch)
	if !stale {
		w.fence.observe(env.Epoch)
		return nil
	}
	err := fmt.Errorf("refused %s %s from a deposed discovery leader: its epoch %s is older than %s, the newest seen; not acted on",
		env.Type, env.ID, env.Epoch, newest)
	w.log.Warn("message of a deposed leader refused", "subject", subject, "id", env.ID, "epoch", env.Epoch.String(), "newest_epoch", newest.String())
	w.report.Report(ctx, events.Error{Kind: events.ErrorDiscovery, Instance: keyOf(subject), Subject: subject,
		Message: err.Error(), Permanent: true})
	return jobs.Reported(err)
}

// learnEpoch raises the newest epoch to the newest of the stored instance
// records, so a worker that starts refuses a deposed leader's jobs before
// it has read any event. A stream it cannot read is skipped (the instance
// consumer learns the epochs as it reads them).
func (w *Worker) learnEpoch(ctx context.Context) {
	recs, _, err := w.bus.Instances(ctx)
	if err != nil {
		w.log.Debug("newest leader epoch not read from the instances stream", "error", err)
		return
	}
	for _, r := range recs {
		w.fence.observe(r.Epoch)
	}
}
