package worker

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// handleDelete runs one delete job.
func (w *Worker) handleDelete(ctx context.Context, env events.Envelope, subject string) error {
	job, err := events.Into[events.DeleteJob](env, events.TypeDeleteJob)
	if err == nil {
		err = keyMatches(subject, job.Key)
	}
	if err == nil && job.Namespace != w.cfg.Plan.Namespace {
		err = fmt.Errorf("%w: delete job for namespace %q; this worker manages %q", events.ErrMalformed, job.Namespace, w.cfg.Plan.Namespace)
	}
	if err != nil {
		w.rejectEvent(ctx, subject, err)
		return &jobError{Err: err, Reported: true}
	}
	return w.Delete(ctx, job)
}

// Delete deletes the Service of job, with job.UID as precondition, so a
// Service re-created under the same name stays. It deletes nothing that is
// not managed by matbus or belongs to another instance, and nothing of an
// instance that is present again when the job's reason is "gone". NotFound
// and a failed UID precondition count as done. Transient errors are retried
// with backoff under ctx; if they outlast it, the job asks for redelivery.
// Every failure is published to <prefix>.errors.delete: a permanent one per
// Service, transient ones per instance (rate-limited together).
func (w *Worker) Delete(ctx context.Context, job events.DeleteJob) error {
	log := w.log.With("instance", job.Key, "service", job.Namespace+"/"+job.Name)
	if job.Reason == "gone" {
		rec, found, err := w.bus.LastInstance(ctx, job.Key)
		if err != nil && !isEventErr(err) {
			return &jobError{Retry: true, Err: err}
		}
		if found && rec.Present() {
			log.Info("delete skipped: instance is present again")
			return nil
		}
	}
	svcs := w.kube.CoreV1().Services(job.Namespace)
	var deleted bool
	cls, err := w.retry(ctx, job.Key, events.ErrorDelete, svcOf(job), func(ctx context.Context, _ int) error {
		cur, err := svcs.Get(ctx, job.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
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
		uid := cur.UID
		err = svcs.Delete(ctx, job.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case err == nil:
			deleted = true
			return nil
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
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
	return &jobError{Retry: cls == Transient, Reported: true, Err: fmt.Errorf("delete %s/%s: %w", job.Namespace, job.Name, err)}
}

func svcOf(job events.DeleteJob) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: job.Name,
		Annotations: map[string]string{plan.AnnotationMatID: job.MatID}}}
}
