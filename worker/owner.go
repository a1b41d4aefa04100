package worker

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
)

// owner returns the owner reference to the instance's MAT Deployment, or
// nil when it has none, does not exist, or cannot be read (reported). The
// answer is cached for OwnerTTL; refresh reads it again regardless.
func (w *Worker) owner(ctx context.Context, inst events.Instance, refresh bool) *metav1.OwnerReference {
	if inst.Owner == "" {
		return nil
	}
	if ref, ok := w.memo.owner(inst.Key, inst.Owner, w.cfg.OwnerTTL); ok && !refresh {
		return ref
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
			return nil // not cached: read again next time
		}
		w.memo.setOwner(inst.Key, inst.Owner, nil)
		return nil
	}
	ref := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}
	w.memo.setOwner(inst.Key, inst.Owner, ref)
	return ref
}
