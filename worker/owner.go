package worker

import (
	"context"
	"errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/owner"
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
	ref, err := owner.Lookup(ctx, w.kube, inst)
	if err != nil {
		// The message names the API server's error alone.
		_, msg := w.cfg.Classifier.Classify(ctx, errors.Unwrap(err), nil)
		w.report.Report(ctx, events.Error{Kind: events.ErrorUpdate, Instance: inst.Key,
			Message: "owner Deployment not readable, Services get no owner reference: " + msg})
		return nil // not cached: read again next time
	}
	w.memo.setOwner(inst.Key, inst.Owner, ref)
	return ref
}
