package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/plan"
)

// handleDelete runs one delete job.
func (w *Worker) handleDelete(ctx context.Context, env events.Envelope, subject string) error {
	job, err := deleteOpening.accept(ctx, w, env, subject)
	if err != nil {
		return err
	}
	return w.Delete(ctx, job)
}

// Delete deletes the Service of job, with job.UID as precondition, so a
// Service re-created under the same name stays. It deletes nothing that is
// not managed by matbus or belongs to another instance, nothing of an
// instance that is present again when the job's reason is "gone", and —
// for a "stale" job — nothing that the instance's newest status still
// wants: the job is re-checked against a status fetched after the job was
// planned (shared by the delete jobs of one instance for up to a second),
// so a delete that waited (API errors, redelivery) while its device came
// back, or a stale job carrying the current UID, leaves the Service
// alone. Before that, a "stale" job is checked against the instance's hold
// record (see holdDeletes): a Service a hold in force lists is not deleted
// (its device vanished with many others; the hold decides after its
// window). If the status or the record cannot be read, nothing is deleted
// and the job is retried. NotFound and a failed UID precondition count as done.
// Transient errors are retried with backoff under ctx; if they outlast
// it, the job asks for redelivery. Every failure is published to
// <prefix>.errors.delete: a permanent one per Service, transient ones per
// instance (rate-limited together).
func (w *Worker) Delete(ctx context.Context, job events.DeleteJob) error {
	log := w.log.With("instance", job.Key, "service", job.Namespace+"/"+job.Name)
	rec, found, err := w.bus.LastInstance(ctx, job.Key)
	if err != nil && !isEventErr(err) {
		return jobs.Retry(err)
	}
	present := found && rec.Present()
	switch {
	case job.Reason == events.DeleteGone && present:
		log.Info("delete skipped: instance is present again")
		return nil
	case job.Reason != events.DeleteGone && present:
		if keep, err := w.keepStale(ctx, log, job, rec.Instance); keep || err != nil {
			return err
		}
	}
	svcs := w.kube.CoreV1().Services(job.Namespace)
	var deleted bool
	cls, err := w.retry(ctx, job.Key, events.ErrorDelete, svcOf(job), func(ctx context.Context, attempt int) error {
		// The informer's copy saves a GET; its resourceVersion joins the
		// precondition, so a Service changed since (labels, owner) is
		// read again from the API before it is deleted.
		var cur *corev1.Service
		if attempt == 1 && w.services != nil {
			if c, err := w.services.Services(job.Namespace).Get(job.Name); err == nil && string(c.UID) == job.UID {
				cur = c
			}
		}
		precise := cur != nil
		if cur == nil {
			c, err := svcs.Get(ctx, job.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			cur = c
		}
		switch {
		case string(cur.UID) != job.UID:
			log.Info("delete skipped: the Service was re-created since the job was made", "uid", cur.UID, "job_uid", job.UID)
			return nil
		case cur.Labels[plan.LabelManagedBy] != w.managedBy():
			log.Warn("delete skipped: Service is not managed by matbus", "managed_by", cur.Labels[plan.LabelManagedBy])
			return nil
		case cur.Labels[plan.LabelInstance] != plan.LabelValue(job.Key):
			log.Warn("delete skipped: Service belongs to another instance", "instance_label", cur.Labels[plan.LabelInstance])
			return nil
		}
		pre := &metav1.Preconditions{UID: &cur.UID}
		if precise {
			rv := cur.ResourceVersion
			pre.ResourceVersion = &rv
		}
		err := svcs.Delete(ctx, job.Name, metav1.DeleteOptions{Preconditions: pre})
		switch {
		case err == nil:
			deleted = true
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err) && precise:
			return errChangedSinceCached // read it again from the API
		case apierrors.IsConflict(err):
			return nil
		}
		return err
	})
	if err == nil {
		if deleted {
			w.deleted.Add(1)
			log.Info("Service deleted", "reason", job.Reason)
		}
		return nil
	}
	if cls == Canceled {
		return context.Canceled
	}
	if cls == Transient {
		w.reportTransient(ctx, job.Key, events.ErrorDelete, []string{job.Namespace + "/" + job.Name}, 1, err)
	}
	return &jobs.Error{Retry: cls == Transient, Reported: true, Err: fmt.Errorf("delete %s/%s: %w", job.Namespace, job.Name, err)}
}

// keepStale reports whether the stale delete job is not to run: a hold in
// force lists its Service, or inst's newest status still wants it (see
// Delete). An error (the job is retried, or ctx ended) keeps it too.
func (w *Worker) keepStale(ctx context.Context, log *slog.Logger, job events.DeleteJob, inst events.Instance) (bool, error) {
	held, err := w.heldDelete(ctx, job)
	if err != nil {
		if ctx.Err() != nil {
			return true, context.Canceled
		}
		log.Info("delete held: the instance's hold record cannot be read", "error", err)
		return true, jobs.Retry(err)
	}
	if held {
		w.kept.Add(1)
		log.Info("delete skipped: held with the instance's other vanished devices until the hold's window ends", "mat_id", job.MatID)
		return true, nil
	}
	set, err := w.currentDesired(ctx, inst, job.PlannedAt)
	if err != nil {
		if ctx.Err() != nil {
			return true, context.Canceled
		}
		log.Info("delete held: the newest status cannot be read", "error", err)
		return true, jobs.Retry(err)
	}
	if why := set.keeps(job); why != "" {
		w.kept.Add(1)
		log.Info("delete skipped: "+why, "mat_id", job.MatID)
		return true, nil
	}
	return false, nil
}

// errChangedSinceCached makes retry try a delete again, reading the
// Service from the API: it changed since the informer's copy.
var errChangedSinceCached = errors.New("the Service changed since the cached copy")

func svcOf(job events.DeleteJob) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: job.Name,
		Annotations: map[string]string{plan.AnnotationMatID: job.MatID}}}
}
