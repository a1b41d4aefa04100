package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// handleSync dispatches sync and clean-up jobs.
func (w *Worker) handleSync(ctx context.Context, env events.Envelope, subject string) error {
	switch env.Type {
	case events.TypeSyncJob:
		job, err := events.Into[events.SyncJob](env, events.TypeSyncJob)
		if err == nil {
			err = keyMatches(subject, job.Key)
		}
		if err != nil {
			w.rejectEvent(ctx, subject, err)
			return &jobError{Err: err, Reported: true}
		}
		err = w.Sync(ctx, job.Key)
		// A sync whose writes failed permanently has done all it can: it
		// counts as completed, and (terminated) as failed.
		if je := (*jobError)(nil); err == nil || errors.As(err, &je) && !je.Retry {
			w.syncs.Add(1)
		}
		return err
	case events.TypeCleanupJob:
		job, err := events.Into[events.CleanupJob](env, events.TypeCleanupJob)
		if err == nil {
			err = keyMatches(subject, job.Key)
		}
		if err != nil {
			w.rejectEvent(ctx, subject, err)
			return &jobError{Err: err, Reported: true}
		}
		if err := w.cleanup(ctx, job.Key, env.ID); err != nil {
			return err
		}
		w.cleanups.Add(1)
		return nil
	default:
		err := fmt.Errorf("%w: %s on a sync subject", events.ErrWrongType, env.Type)
		w.rejectEvent(ctx, subject, err)
		return &jobError{Err: err, Reported: true}
	}
}

// Sync converges the Services of instance key: it reads the instance's
// current record from the instances stream (a gone or unknown instance is
// skipped), fetches its status through the cached client, plans, applies
// creates, updates and recreates, and publishes one delete job per Service
// that is no longer wanted. A failed or invalid fetch is reported to
// <prefix>.errors.fetch and changes nothing. It returns a *jobError asking
// for redelivery when some write failed transiently.
func (w *Worker) Sync(ctx context.Context, key string) error {
	rec, found, err := w.bus.LastInstance(ctx, key)
	if err != nil {
		if isEventErr(err) {
			w.report.Report(ctx, events.Error{Kind: events.ErrorEvent, Instance: key, Subject: w.bus.Subjects.Instance(key),
				Message: fmt.Sprintf("stored instance record is unreadable: %v", err), Permanent: true})
			return nil
		}
		return &jobError{Retry: true, Err: err}
	}
	if !found || !rec.Present() {
		w.log.Debug("sync skipped: instance not present", "instance", key)
		return nil
	}
	inst := rec.Instance
	log := w.log.With("instance", key, "url", inst.URL)
	client, err := w.cache.Acquire(ctx, key, inst.URL)
	if err != nil {
		w.report.Report(ctx, events.Error{Kind: events.ErrorFetch, Instance: key, URL: inst.URL,
			Message: err.Error(), Permanent: true})
		return nil
	}
	st, attempts, err := w.fetch(ctx, client)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// No deletes: the instance's Services stay as they are.
		w.report.Report(ctx, events.Error{Kind: events.ErrorFetch, Instance: key, URL: inst.URL,
			Message:   fmt.Sprintf("status fetch failed, no Service changed: %v", err),
			Permanent: !matclient.IsTransient(err), Attempts: attempts})
		return nil
	}

	owner := w.owner(ctx, inst)
	desired := plan.Build(plan.Instance{Key: key, PodName: inst.PodName, Owner: owner}, st, w.cfg.Plan)
	for _, h := range desired.Held {
		if h.Reason == plan.HoldNoBMCIP {
			continue
		}
		w.report.Report(ctx, events.Error{Kind: events.ErrorPlan, Instance: key, MatID: h.MatID,
			Service: w.cfg.Plan.Namespace + "/" + h.Name, Message: fmt.Sprintf("%s: %s", h.Reason, h.Detail), Permanent: true})
	}
	existing, err := w.existing(key)
	if err != nil {
		return &jobError{Retry: true, Err: err}
	}
	p := plan.Diff(desired, existing, w.cfg.Plan)
	if !p.Empty() {
		log.Info("applying plan", "create", len(p.Create), "update", len(p.Update), "recreate", len(p.Recreate), "delete", len(p.Delete))
	}
	return w.apply(ctx, key, p)
}

func isEventErr(err error) bool {
	return errors.Is(err, events.ErrMalformed) || errors.Is(err, events.ErrUnknownSchema) ||
		errors.Is(err, events.ErrUnknownType) || errors.Is(err, events.ErrWrongType)
}

// fetch gets the status, retrying transient failures with backoff for at
// most min(RetryMaxElapsed, 15 s).
func (w *Worker) fetch(ctx context.Context, c StatusClient) (*matclient.Status, int, error) {
	bo := w.newBackoff(min(w.cfg.RetryMaxElapsed, 15*time.Second))
	var st *matclient.Status
	attempts := 0
	err := backoff.Retry(func() error {
		attempts++
		var err error
		st, err = c.Status(ctx)
		if err != nil && (!matclient.IsTransient(err) || ctx.Err() != nil) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, ctx))
	return st, attempts, err
}

func (w *Worker) newBackoff(maxElapsed time.Duration) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(maxElapsed))
}

// owner returns the owner reference to the instance's MAT Deployment, or
// nil when it has none, does not exist, or cannot be read (reported).
func (w *Worker) owner(ctx context.Context, inst events.Instance) *metav1.OwnerReference {
	if inst.Owner == "" {
		return nil
	}
	ns, _, err := events.SplitKey(inst.Key)
	if err != nil {
		return nil
	}
	d, err := w.kube.AppsV1().Deployments(ns).Get(ctx, inst.Owner, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			_, msg := w.cfg.Classifier.Classify(ctx, err, nil)
			w.report.Report(ctx, events.Error{Kind: events.ErrorUpdate, Instance: inst.Key,
				Message: "owner Deployment not readable, Services get no owner reference: " + msg})
		}
		return nil
	}
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}
}

// existing lists, from the informer cache, the Services of instance key plus
// the old controller's Services (managed-by ours, no instance label) that
// plan.Diff may adopt.
func (w *Worker) existing(key string) ([]*corev1.Service, error) {
	lister := w.services.Services(w.cfg.Plan.Namespace)
	mine, err := lister.List(plan.InstanceSelector(w.cfg.Plan, key))
	if err != nil {
		return nil, fmt.Errorf("worker: list Services: %w", err)
	}
	req, err := labels.NewRequirement(plan.LabelInstance, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	old, err := lister.List(labels.SelectorFromSet(labels.Set{plan.LabelManagedBy: w.managedBy()}).Add(*req))
	if err != nil {
		return nil, fmt.Errorf("worker: list Services: %w", err)
	}
	out := append(append([]*corev1.Service{}, mine...), old...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

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
// retried with backoff like every other API call.
func (w *Worker) cleanup(ctx context.Context, key, jobID string) error {
	rec, found, err := w.bus.LastInstance(ctx, key)
	if err != nil && !isEventErr(err) {
		return &jobError{Retry: true, Err: err}
	}
	if found && rec.Present() {
		w.log.Info("clean-up skipped: instance is present again", "instance", key)
		return nil
	}
	w.cache.Release(ctx, key)
	var svcs *corev1.ServiceList
	cls := Transient
	attempts := 0
	err = backoff.Retry(func() error {
		attempts++
		var err error
		svcs, err = w.kube.CoreV1().Services(w.cfg.Plan.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: plan.InstanceSelector(w.cfg.Plan, key).String()})
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
		return &jobError{Retry: cls == Transient, Err: fmt.Errorf("list Services of %s (%d attempts): %w", key, attempts, err)}
	}
	var del []*corev1.Service
	for i := range svcs.Items {
		del = append(del, &svcs.Items[i])
	}
	w.log.Info("instance gone: deleting its Services", "instance", key, "services", len(del))
	suffix := ""
	if jobID != "" {
		suffix = "@" + jobID
	}
	return w.publishDeletes(ctx, key, del, "gone", suffix)
}

// publishDeletes publishes one delete job per Service with Nats-Msg-Id
// "del-<uid><idSuffix>".
func (w *Worker) publishDeletes(ctx context.Context, key string, svcs []*corev1.Service, reason, idSuffix string) error {
	var errs []string
	for _, s := range svcs {
		job := events.DeleteJob{Key: key, Namespace: s.Namespace, Name: s.Name, UID: string(s.UID),
			MatID: s.Annotations[plan.AnnotationMatID], Reason: reason}
		if err := w.bus.Publish(ctx, w.bus.Subjects.Delete(key), events.TypeDeleteJob, "del-"+string(s.UID)+idSuffix, job); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", s.Name, err))
			continue
		}
		w.deleteJobs.Add(1)
	}
	if len(errs) > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &jobError{Retry: true, Err: fmt.Errorf("publish delete jobs: %s", strings.Join(errs, "; "))}
	}
	return nil
}

// keyMatches rejects a message whose data names another instance than its
// subject: such a message could act on an instance outside the per-instance
// ordering of its subject.
func keyMatches(subject, key string) error {
	if k, ok := events.KeyFromSubject(subject); !ok || k != key {
		return fmt.Errorf("%w: data key %q does not match subject %s", events.ErrMalformed, key, subject)
	}
	return nil
}
