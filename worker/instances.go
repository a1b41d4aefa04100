package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/plan"
)

// runInstances feeds the client cache from the instances stream. Every
// worker reads every instance event of its namespace through an ordered consumer starting
// with the last event per instance, so a worker that starts late sees the
// current set. Every InstanceResync the cache is also checked against the
// stream, which catches gone events lost with a server's store.
func (w *Worker) runInstances(ctx context.Context) {
	delay := 100 * time.Millisecond
	resync := time.NewTicker(w.cfg.InstanceResync)
	defer resync.Stop()
	for ctx.Err() == nil {
		cons, err := w.bus.OrderedConsumer(ctx, events.StreamInstances, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{w.bus.Subjects().InstancesIn(w.cfg.Plan.Namespace)},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("instances consumer not available, retrying", "error", err)
			_ = w.bus.EnsureStreams(ctx)
			if !jobs.Sleep(ctx, delay) {
				return
			}
			delay = min(delay*2, 5*time.Second)
			continue
		}
		delay = 100 * time.Millisecond
		it, err := cons.Messages()
		if err != nil {
			if !jobs.Sleep(ctx, delay) {
				return
			}
			continue
		}
		msgs := make(chan jetstream.Msg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer close(msgs)
			for {
				m, err := it.Next(jetstream.NextContext(ctx))
				if err != nil {
					if ctx.Err() == nil {
						w.log.Warn("instances consumer interrupted, re-attaching", "error", err)
					}
					return
				}
				select {
				case msgs <- m:
				case <-ctx.Done():
					return
				}
			}
		}()
	loop:
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					break loop
				}
				w.handleInstanceMsg(ctx, m.Subject(), m.Data())
			case <-resync.C:
				w.resyncCache(ctx)
			}
		}
		it.Stop()
		<-done
	}
}

// handleInstanceMsg applies one instance event to the client cache.
func (w *Worker) handleInstanceMsg(ctx context.Context, subject string, data []byte) {
	env, err := events.Decode(data)
	if err != nil {
		w.rejectEvent(ctx, subject, err)
		return
	}
	if inst, err := instanceOpening.accept(ctx, w, env, subject); err == nil {
		w.applyInstance(ctx, env.Type, inst)
	}
}

func (w *Worker) applyInstance(ctx context.Context, typ events.Type, inst events.Instance) {
	switch typ {
	case events.TypeInstanceAppeared:
		if _, err := w.cache.Acquire(ctx, inst.Key, inst.URL); err != nil {
			w.report.Report(ctx, events.Error{Kind: events.ErrorFetch, Instance: inst.Key, URL: inst.URL,
				Message: fmt.Sprintf("cannot make a MAT client: %v", err), Permanent: true})
			return
		}
		w.log.Debug("instance appeared", "instance", inst.Key, "url", inst.URL)
	case events.TypeInstanceGone:
		w.forget(ctx, inst.Key)
		w.log.Debug("instance gone", "instance", inst.Key, "url", inst.URL)
	}
}

// resyncCache releases cached instances whose current record is gone or missing.
func (w *Worker) resyncCache(ctx context.Context) {
	recs, _, err := w.bus.Instances(ctx)
	if err != nil {
		w.log.Debug("instance resync skipped", "error", err)
		return
	}
	w.cache.mu.Lock()
	var stale []string
	for key, url := range w.cache.urlOf {
		if r, ok := recs[key]; !ok || !r.Present() || r.Instance.URL != url {
			stale = append(stale, key)
		}
	}
	w.cache.mu.Unlock()
	for _, key := range stale {
		if r, ok := recs[key]; ok && r.Present() {
			if old, _ := w.fence.stale(r.Epoch); old {
				continue // a deposed leader's record: the new leader rewrites it
			}
			w.applyInstance(ctx, events.TypeInstanceAppeared, r.Instance)
			continue
		}
		w.forget(ctx, key)
	}
	w.sweepGone(ctx, recs)
}

// sweepGone repairs clean-ups that did not finish. For every instance whose
// record has said "gone" for at least two InstanceResync periods while
// Services with its instance label are still in the informer cache and no
// clean-up or delete job of it is stored any more (a job gave up, e.g.
// during a long API outage, and was terminated), it publishes a new
// clean-up job; workers in the same period publish the same Nats-Msg-Id, so
// one job results. An instance without a record is never swept: a lost
// instances stream is not a gone instance.
func (w *Worker) sweepGone(ctx context.Context, recs map[string]events.InstanceRecord) {
	if w.services == nil {
		return
	}
	svcs, err := w.services.Services(w.cfg.Plan.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	left := map[string]int{}
	for _, s := range svcs {
		if v := s.Labels[plan.LabelInstance]; v != "" {
			left[v]++
		}
	}
	period := int64(w.cfg.InstanceResync)
	for key, rec := range recs {
		n := left[plan.LabelValue(key)]
		if rec.Present() || n == 0 || time.Since(rec.Time) < 2*w.cfg.InstanceResync {
			continue
		}
		// Jobs of the instance still stored: a clean-up is under way or
		// being retried; do not pile another one on.
		if w.storedJobs(ctx, events.StreamSync, w.bus.Subjects().Cleanup(key)) != 0 || w.storedJobs(ctx, events.StreamDelete, w.bus.Subjects().Delete(key)) != 0 {
			continue
		}
		id := fmt.Sprintf("sweep:%s:%d:%d", key, rec.Seq, time.Now().UnixNano()/period)
		job := events.CleanupJob{Key: key, Scope: rec.Instance.Scope}
		if err := w.bus.Publish(ctx, w.bus.Subjects().Cleanup(key), events.TypeCleanupJob, id, job); err != nil {
			w.log.Warn("clean-up sweep not published", "instance", key, "error", err)
			continue
		}
		w.log.Info("instance gone but Services left: clean-up published again", "instance", key, "services", n)
	}
}

// storedJobs counts the messages stored on subject in the stream of role;
// -1 when that cannot be read.
func (w *Worker) storedJobs(ctx context.Context, role events.Role, subject string) int64 {
	n, err := w.bus.StoredMessages(ctx, role, subject)
	if err != nil {
		return -1
	}
	return n
}
