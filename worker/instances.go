package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// runInstances feeds the client cache from the instances stream. Every
// worker reads every instance event through an ordered consumer starting
// with the last event per instance, so a worker that starts late sees the
// current set. Every InstanceResync the cache is also checked against the
// stream, which catches gone events lost with a server's store.
func (w *Worker) runInstances(ctx context.Context) {
	stream := w.bus.StreamName("INSTANCES")
	delay := 100 * time.Millisecond
	resync := time.NewTicker(w.cfg.InstanceResync)
	defer resync.Stop()
	for ctx.Err() == nil {
		cons, err := w.bus.JS.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{w.bus.Subjects.Instances()},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("instances consumer not available, retrying", "error", err)
			_ = w.bus.EnsureStreams(ctx)
			if !sleep(ctx, delay) {
				return
			}
			delay = min(delay*2, 5*time.Second)
			continue
		}
		delay = 100 * time.Millisecond
		it, err := cons.Messages()
		if err != nil {
			if !sleep(ctx, delay) {
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
	if err == nil {
		var inst events.Instance
		inst, err = events.Into[events.Instance](env, events.TypeInstanceAppeared, events.TypeInstanceGone)
		if err == nil {
			w.applyInstance(ctx, env.Type, inst)
			return
		}
	}
	w.rejectEvent(ctx, subject, err)
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
		w.cache.Release(ctx, inst.Key)
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
			w.applyInstance(ctx, events.TypeInstanceAppeared, r.Instance)
			continue
		}
		w.cache.Release(ctx, key)
	}
}
