package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// handleSync dispatches sync and clean-up jobs. A sync job is always
// acknowledged once it ran (or terminated when malformed) and its outcome
// is published on the instance's result subject: retrying a failed sync is
// the discovery scheduler's decision (per-instance backoff), not
// JetStream's, so a failing instance never holds more than the one job
// the scheduler gave it. Only a job cut short by shutdown is left for
// redelivery.
func (w *Worker) handleSync(ctx context.Context, env events.Envelope, subject string) error {
	switch env.Type {
	case events.TypeSyncJob:
		job, err := syncOpening.accept(ctx, w, env, subject)
		if err != nil {
			return err
		}
		start := time.Now()
		w.cfg.Metrics.jobDelayed(delayReceived, env.Time, start)
		res, err := w.syncJob(ctx, job, env.ID, env.Time)
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return context.Canceled
		}
		res.Key, res.JobID, res.Worker = job.Key, env.ID, w.cfg.Name
		res.DurationMS = time.Since(start).Milliseconds()
		if err != nil && res.Error == "" {
			res.Error = err.Error()
		}
		w.syncs.Add(1)
		if res.Outcome == events.OutcomeApplyFailed || res.Outcome == events.OutcomeFetchFailed {
			w.failed.Add(1)
		}
		w.cfg.Metrics.syncResult(job.Key, res.Outcome, time.Now())
		if perr := w.bus.PublishResult(env.ID+":result", res); perr != nil {
			w.log.Warn("sync result not published; the scheduler releases the instance at its deadline", "instance", job.Key, "error", perr)
		}
		return nil
	case events.TypeCleanupJob:
		job, err := cleanupOpening.accept(ctx, w, env, subject)
		if err != nil {
			return err
		}
		if err := w.cleanup(ctx, job.Key, env.ID); err != nil {
			return err
		}
		w.cleanups.Add(1)
		return nil
	default:
		err := fmt.Errorf("%w: %s on a sync subject", events.ErrWrongType, env.Type)
		w.rejectEvent(ctx, subject, err)
		return jobs.Reported(err)
	}
}

// Sync runs a full sync of instance key (see syncJob) and returns nil
// when every write succeeded, or the failure.
func (w *Worker) Sync(ctx context.Context, key string) error {
	res, err := w.syncJob(ctx, events.SyncJob{Key: key, Reason: events.ReasonResync}, "", time.Time{})
	if err != nil {
		return err
	}
	if res.Failed() {
		return &jobs.Error{Retry: res.Transient, Reported: true, Err: errors.New(res.Error)}
	}
	return nil
}

// syncJob converges the Services of instance job.Key: it reads the
// instance's current record from the instances stream (a gone or unknown
// instance is skipped), fetches its status once through the cached client
// (failures are the scheduler's to retry), and, unless a poll finds the
// status and the instance's Services unchanged since this worker's last
// complete sync, takes an apply slot, plans, applies creates, updates and
// recreates, and publishes one delete job per Service that is no longer
// wanted, except the deletes a hold keeps back (holdDeletes: many devices
// vanished at once; a poll whose status is unchanged still plans when a
// hold's window is over, see holdDue). A failed or invalid fetch is reported to <prefix>.errors.fetch
// and changes nothing. It returns the outcome, and an error only when ctx
// ended.
//
// An instance that goes away while its sync applies creates is cleaned up
// again by the sync itself (see afterGone), so a create that raced the
// clean-up's list leaves no orphan. published is when the job was
// published (zero when it is not a job), for the job-delay metric.
func (w *Worker) syncJob(ctx context.Context, job events.SyncJob, jobID string, published time.Time) (events.SyncResult, error) {
	key := job.Key
	rec, res, err := w.syncRecord(ctx, key)
	if rec == nil {
		return res, err
	}
	inst := rec.Instance
	log := w.log.With("instance", key, "url", inst.URL)
	client, err := w.cache.Acquire(ctx, key, inst.URL)
	if err != nil {
		w.report.Report(ctx, events.Error{Kind: events.ErrorFetch, Instance: key, URL: inst.URL,
			Message: err.Error(), Permanent: true})
		w.cfg.Events.Instance(key, kubeevents.FetchFailed, err.Error())
		return events.SyncResult{Outcome: events.OutcomeFetchFailed, Error: err.Error()}, nil
	}

	// The change count is read before the fetch: a Service event that
	// comes during the sync makes the next poll plan again.
	changes := w.memo.changeCount(key)
	prev := ""
	if !job.Full() {
		prev = w.memo.fingerprint(key)
	}
	fetchedAt := time.Now()
	w.cfg.Metrics.jobDelayed(delayFetch, published, fetchedAt)
	poll, err := fetchStatus(ctx, client, prev)
	st, fp := poll.Status, poll.Fingerprint
	w.cfg.Metrics.fetched(time.Since(fetchedAt))
	w.refused.note(key, matclient.IsVerificationError(err))
	if err != nil {
		if ctx.Err() != nil {
			return events.SyncResult{}, ctx.Err()
		}
		if errors.Is(err, matclient.ErrClosed) {
			return closedDuringFetch(log), nil
		}
		// No deletes: the instance's Services stay as they are.
		transient := matclient.IsTransient(err)
		w.report.Report(ctx, events.Error{Kind: events.ErrorFetch, Instance: key, URL: inst.URL,
			Message: fmt.Sprintf("status fetch failed, no Service changed: %v", err), Permanent: !transient, Attempts: 1})
		w.cfg.Events.Instance(key, kubeevents.FetchFailed, fmt.Sprintf("status fetch failed, no Service changed: %v", err))
		return events.SyncResult{Outcome: events.OutcomeFetchFailed, Transient: transient, Error: err.Error()}, nil
	}
	if st == nil && w.memo.unchanged(key, fp) && !w.deferredDeletesDue(ctx, key) && !w.holdDue(key) {
		w.unchanged.Add(1)
		return events.SyncResult{Outcome: events.OutcomeUnchanged, NotModified: poll.NotModified}, nil
	}
	// Only a full sync tells the scheduler that MAT vouched for an
	// unchanged status: a poll that plans (a change, or a Service event
	// since the last sync) is a change.
	notModified := job.Full() && poll.NotModified
	if st == nil {
		// A Service changed since the fingerprint was taken: plan from a
		// full fetch.
		poll, err = fetchStatus(ctx, client, "")
		if st, fp = poll.Status, poll.Fingerprint; err != nil {
			if ctx.Err() != nil {
				return events.SyncResult{}, ctx.Err()
			}
			if errors.Is(err, matclient.ErrClosed) {
				return closedDuringFetch(log), nil
			}
			return events.SyncResult{Outcome: events.OutcomeFetchFailed, Transient: matclient.IsTransient(err), Error: err.Error()}, nil
		}
	}

	if err := w.acquireApplySlot(ctx); err != nil {
		return events.SyncResult{}, err
	}
	defer func() { <-w.applySlots }()

	owner := w.owner(ctx, inst, job.Full() && job.Reason != events.ReasonResync && job.Reason != events.ReasonProbe)
	desired := plan.Build(plan.Instance{Key: key, PodName: inst.PodName, Owner: owner}, st, w.cfg.Plan)
	w.desired.put(key, desiredOf(desired, fetchedAt))
	w.reportPlanFindings(ctx, key, desired)
	existing, foreign, err := w.existing(key, desired.Services)
	if err != nil {
		return events.SyncResult{Outcome: events.OutcomeApplyFailed, Transient: true, Error: err.Error()}, nil
	}
	desired.ForeignIPs = foreign
	p := plan.Diff(desired, existing, w.cfg.Plan)
	p = w.holdDeletes(ctx, log, key, st, desired, existing, p, fetchedAt)
	w.reportSkipped(ctx, key, p)
	w.reportForeignRecreates(ctx, key, p)
	w.waitForUnmet(key, desired.Services, p)
	err = w.apply(ctx, log, key, p, fetchedAt, fpTag(fp))
	w.memo.waitFor(key, unmet(desired.Services, p, err == nil))
	if len(p.Create)+len(p.Recreate) > 0 && ctx.Err() == nil {
		w.afterGone(ctx, key, rec.Seq, jobID)
	}
	return w.applied(ctx, key, fp, changes, notModified, err)
}

// applied is the result of a sync whose plan was applied with error err
// (nil: every write succeeded), and records it in the memo: a sync that
// completed, or whose writes were refused for good, is not planned again
// until the status or key's Services (change count changes) change.
func (w *Worker) applied(ctx context.Context, key, fp string, changes uint64, notModified bool, err error) (events.SyncResult, error) {
	var je *jobs.Error
	switch {
	case err == nil:
		w.memo.completed(key, fp, changes)
		return events.SyncResult{Outcome: events.OutcomeSynced, NotModified: notModified}, nil
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		return events.SyncResult{}, context.Canceled
	case errors.As(err, &je) && !je.Retry:
		// Permanent refusals were reported per Service; retrying them on
		// every poll only loads the API server: the next full resync, or
		// a change (such as the delete of the Service that holds a wanted
		// name or IP), tries again.
		w.memo.completed(key, fp, changes)
		return events.SyncResult{Outcome: events.OutcomeApplyFailed, Error: err.Error()}, nil
	default:
		w.memo.invalidate(key)
		return events.SyncResult{Outcome: events.OutcomeApplyFailed, Transient: true, Error: err.Error()}, nil
	}
}

// syncRecord reads the current record of instance key for its sync. It
// returns nil and the sync's result (or ctx's error) when there is nothing
// to sync: the record is unreadable (reported) or cannot be read now, the
// instance is not present, or the record is a deposed leader's.
func (w *Worker) syncRecord(ctx context.Context, key string) (*events.InstanceRecord, events.SyncResult, error) {
	rec, found, err := w.bus.LastInstance(ctx, key)
	if err != nil {
		if isEventErr(err) {
			w.report.Report(ctx, events.Error{Kind: events.ErrorEvent, Instance: key, Subject: w.bus.Subjects().Instance(key),
				Message: fmt.Sprintf("stored instance record is unreadable: %v", err), Permanent: true})
			return nil, events.SyncResult{Outcome: events.OutcomeSkipped, Error: err.Error()}, nil
		}
		if ctx.Err() != nil {
			return nil, events.SyncResult{}, ctx.Err()
		}
		return nil, events.SyncResult{Outcome: events.OutcomeApplyFailed, Transient: true, Error: err.Error()}, nil
	}
	if !found || !rec.Present() {
		w.log.Debug("sync skipped: instance not present", "instance", key)
		return nil, events.SyncResult{Outcome: events.OutcomeSkipped}, nil
	}
	if old, newest := w.fence.stale(rec.Epoch); old {
		// A deposed leader's appeared record: the new leader rewrites it.
		w.log.Debug("sync skipped: instance record of a deposed leader", "instance", key, "epoch", rec.Epoch.String(), "newest_epoch", newest.String())
		return nil, events.SyncResult{Outcome: events.OutcomeSkipped, Error: "instance record of a deposed leader's epoch"}, nil
	}
	return &rec, events.SyncResult{}, nil
}

// waitForUnmet records in the memo, before p is applied, the Services of p
// that another Service may hold (see unmet): from now on, the delete of a
// holder is a change of key's Services. A holder that p skipped and that
// is gone from the informer cache already (deleted since existing was
// read) is such a change too.
func (w *Worker) waitForUnmet(key string, desired []*corev1.Service, p plan.Plan) {
	w.memo.waitFor(key, unmet(desired, p, false))
	lister := w.services.Services(w.cfg.Plan.Namespace)
	for _, s := range p.Skipped {
		if _, err := lister.Get(s.Name); apierrors.IsNotFound(err) {
			w.memo.changed(key)
			return
		}
	}
}

// unmet returns the desired Services that plan p may have left to another
// holder: those it skipped (the name is another's), and, unless p was
// applied without error, every create and recreate too (a write refused
// because another Service holds the name or the IP).
func unmet(desired []*corev1.Service, p plan.Plan, applied bool) []*corev1.Service {
	names := make(map[string]bool, len(p.Skipped))
	for _, s := range p.Skipped {
		names[s.Name] = true
	}
	if !applied {
		for _, s := range p.Create {
			names[s.Name] = true
		}
		for _, u := range p.Recreate {
			names[u.New.Name] = true
		}
	}
	var out []*corev1.Service
	for _, d := range desired {
		if names[d.Name] {
			out = append(out, d)
		}
	}
	return out
}

// deferredDeletesDue reports whether key's last plan left stale deletes
// unpublished (its delete queue was not empty) and that queue is empty now,
// or cannot be read: the instance is then planned again although nothing
// changed, so those deletes are published.
func (w *Worker) deferredDeletesDue(ctx context.Context, key string) bool {
	return w.memo.deferredPlan(key) && w.storedJobs(ctx, events.StreamDelete, w.bus.Subjects().Delete(key)) <= 0
}

// fingerprinter is implemented by clients that can tell an unchanged
// status without decoding it, whether MAT said it was not modified, and
// that can revalidate a whole status they hold (*matclient.Client).
type fingerprinter interface {
	PollStatus(ctx context.Context, prev string) (matclient.Poll, error)
	FullStatus(ctx context.Context) (matclient.Poll, error)
}

// closedDuringFetch is the result of a sync whose MAT client was closed
// while it fetched: the client cache closes a client only when its instance
// went away or its URL changed, and that event brings its own clean-up or
// full sync. It is not a failure of MAT, so no error event: the job is
// reported as skipped, nothing is changed.
func closedDuringFetch(log *slog.Logger) events.SyncResult {
	log.Info("sync skipped: the instance's MAT client was closed during the fetch (instance gone or URL changed)")
	return events.SyncResult{Outcome: events.OutcomeSkipped, Error: "MAT client closed during the fetch"}
}

// fetchStatus fetches the status once. With a client that fingerprints,
// it returns no status and fingerprint prev when the status is unchanged
// since prev (NotModified when MAT answered 304), and for prev "" (a
// full sync) always the decoded status, which the client may have
// revalidated with a 304 (matclient.Client.FullStatus); other clients
// always return the decoded status, fingerprint "" and never NotModified.
func fetchStatus(ctx context.Context, c StatusClient, prev string) (matclient.Poll, error) {
	if f, ok := c.(fingerprinter); ok {
		if prev == "" {
			return f.FullStatus(ctx)
		}
		return f.PollStatus(ctx, prev)
	}
	st, err := c.Status(ctx)
	return matclient.Poll{Status: st}, err
}

// reportPlanFindings publishes the devices the plan holds back (except
// those still waiting for a BMC IP) as error events of kind "plan", and
// each warning (e.g. a merged duplicate endpoint) once per worker.
func (w *Worker) reportPlanFindings(ctx context.Context, key string, d plan.Desired) {
	for _, h := range d.Held {
		if h.Reason == plan.HoldNoBMCIP {
			continue
		}
		svc := ""
		if h.Name != "" {
			svc = w.cfg.Plan.Namespace + "/" + h.Name
		}
		msg := fmt.Sprintf("%s: %s", h.Reason, h.Detail)
		if h.Reason == plan.HoldInvalidDevice {
			msg += "; no Service of this instance is deleted until its status is valid again"
		}
		w.report.Report(ctx, events.Error{Kind: events.ErrorPlan, Instance: key, MatID: h.MatID,
			Service: svc, Message: msg, Permanent: true})
	}
	w.recordHeld(ctx, key, d.Held)
	w.reportWarnings(ctx, key, d)
}

func isEventErr(err error) bool {
	return errors.Is(err, events.ErrMalformed) || errors.Is(err, events.ErrUnknownSchema) ||
		errors.Is(err, events.ErrUnknownType) || errors.Is(err, events.ErrWrongType)
}

func (w *Worker) newBackoff(maxElapsed time.Duration) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(maxElapsed))
}

// acquireApplySlot takes one of the Jobs apply slots, waiting until one
// is free or ctx ends (ctx's error). While it waits, applyWaiting counts
// it, so the sync consumer pulls no new job (see pull).
func (w *Worker) acquireApplySlot(ctx context.Context) error {
	select {
	case w.applySlots <- struct{}{}:
		return nil
	default:
	}
	w.applyWaiting.Add(1)
	defer w.applyWaiting.Add(-1)
	select {
	case w.applySlots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
