package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/kubewatch"
	"github.com/matbus/matbus/plan"
)

// Cleanup fans out one delete job per Service of a gone instance. If the
// instance is present again, nothing is deleted.
func (w *Worker) Cleanup(ctx context.Context, key string) error {
	return w.cleanup(ctx, key, "")
}

// cleanup is Cleanup for the clean-up job with envelope id jobID: the
// delete jobs it publishes carry ids derived from the Service UID and
// jobID, so a redelivered clean-up job publishes nothing twice while a
// later clean-up job of the same instance (a sweep) is not swallowed by
// JetStream's de-duplication of the earlier one's delete jobs. The List is
// retried with backoff like every other API call, and its outcome goes to
// WatchHealth: a refused List (403, 401) is no reason to keep a gone
// instance's Services, so it makes the worker not ready and the job is
// redelivered (and swept again after its deliveries, see sweepGone) until
// the List is allowed.
func (w *Worker) cleanup(ctx context.Context, key, jobID string) error {
	rec, found, err := w.bus.LastInstance(ctx, key)
	if err != nil && !isEventErr(err) {
		return jobs.Retry(err)
	}
	if found && rec.Present() {
		w.log.Info("clean-up skipped: instance is present again", "instance", key)
		return nil
	}
	w.cache.Release(ctx, key)
	var svcs *corev1.ServiceList
	cls := Transient
	attempts := 0
	refused := false // the last List was refused by RBAC or authentication
	err = backoff.Retry(func() error {
		attempts++
		var err error
		svcs, err = w.kube.CoreV1().Services(w.cfg.Plan.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: plan.InstanceSelector(w.cfg.Plan, key).String()})
		w.watch.Observe(ctx, kubewatch.VerbList, err)
		refused = apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
		if err == nil {
			return nil
		}
		var msg string
		if cls, msg = w.cfg.Classifier.Classify(ctx, err, nil); cls != Transient {
			return backoff.Permanent(errors.New(msg))
		}
		w.log.Debug("retrying Service list", "instance", key, "attempt", attempts, "error", err)
		return err
	}, backoff.WithContext(w.newBackoff(w.cfg.RetryMaxElapsed), ctx))
	if err != nil {
		if cls == Canceled || ctx.Err() != nil {
			return context.Canceled
		}
		return &jobs.Error{Retry: cls == Transient || refused, Err: fmt.Errorf("list Services of %s (%d attempts): %w", key, attempts, err)}
	}
	var del []*corev1.Service
	for i := range svcs.Items {
		del = append(del, &svcs.Items[i])
	}
	w.log.Info("instance gone: deleting its Services", "instance", key, "services", len(del))
	w.endHold(ctx, key, "the instance is gone; its Services are deleted")
	suffix := ""
	if jobID != "" {
		suffix = "@" + jobID
	}
	w.forget(ctx, key)
	return w.publishDeletes(ctx, key, del, events.DeleteGone, suffix, time.Time{})
}

// afterGone cleans up instance key again when its record changed to gone
// since the sync read it at sequence seq: the clean-up job's list may have
// run before this sync's creates.
func (w *Worker) afterGone(ctx context.Context, key string, seq uint64, jobID string) {
	rec, found, err := w.bus.LastInstance(ctx, key)
	// No record is a lost stream, not a gone instance: nothing is deleted.
	if err != nil || !found || rec.Present() || rec.Seq == seq {
		return
	}
	w.log.Info("instance went away during its sync: cleaning up again", "instance", key)
	if jobID == "" {
		jobID = fmt.Sprintf("sync-%d", time.Now().UnixNano())
	}
	if err := w.cleanup(ctx, key, "after-"+jobID); err != nil && ctx.Err() == nil {
		w.log.Warn("clean-up after a sync raced the instance's removal failed; the sweep repeats it", "instance", key, "error", err)
	}
}
