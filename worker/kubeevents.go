package worker

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/plan"
)

// The worker's Kubernetes Events (Config.Events): instance-level ones on
// the instance's MAT Service, per-Service ones on the BMC Service. Each
// mirrors a failure the worker also reports as an error event, or a
// change worth an operator's notice (a recreate, an adoption).

// maxListed is how many devices or Services one Event note names.
const maxListed = 5

// heldReasons maps the holds worth an Event to their reason.
var heldReasons = map[plan.HoldReason]kubeevents.Reason{
	plan.HoldInvalidDevice:  kubeevents.InvalidDevices,
	plan.HoldDuplicateBMCIP: kubeevents.DuplicateBMCIP,
	plan.HoldNameCollision:  kubeevents.NameCollision,
}

// recordHeld records one Event per reason for the devices of instance key
// that get no Service (devices without a BMC IP yet are routine and left
// out), naming the first few.
func (w *Worker) recordHeld(ctx context.Context, key string, held []plan.Hold) {
	if w.cfg.Events == nil {
		return
	}
	by := map[kubeevents.Reason][]string{}
	for _, h := range held {
		if r, ok := heldReasons[h.Reason]; ok {
			by[r] = append(by[r], h.Detail)
		}
	}
	for _, r := range []kubeevents.Reason{kubeevents.InvalidDevices, kubeevents.DuplicateBMCIP, kubeevents.NameCollision} {
		details := by[r]
		if len(details) == 0 {
			continue
		}
		var note string
		switch r {
		case kubeevents.InvalidDevices:
			note = fmt.Sprintf("%d invalid devices in the status get no Service, and no Service of this instance is deleted until it is valid again: %s",
				len(details), listed(details))
		case kubeevents.DuplicateBMCIP:
			note = fmt.Sprintf("%d devices report an IP another device reports and get no Service: %s", len(details), listed(details))
		default:
			note = fmt.Sprintf("%d devices map to a Service name another device has and get no Service: %s", len(details), listed(details))
		}
		w.cfg.Events.Instance(key, r, note)
	}
}

// listed joins the first maxListed of items and says how many more there are.
func listed(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:maxListed], "; "), len(items)-maxListed)
}

// recordRefused records a permanent refusal of a write of svc (kind create
// or update) on the existing Service of that name, else on the MAT Service
// of instance key. Deletes have no Event: the Service is gone from the
// plan, and the error event names it.
func (w *Worker) recordRefused(ctx context.Context, key string, kind events.ErrorKind, svc *corev1.Service, msg string) {
	if w.cfg.Events == nil {
		return
	}
	reason := kubeevents.CreateRefused
	switch kind {
	case events.ErrorUpdate:
		reason = kubeevents.UpdateRefused
	case events.ErrorCreate:
	default:
		return
	}
	target := svc
	if w.services != nil {
		if cur, err := w.services.Services(svc.Namespace).Get(svc.Name); err == nil {
			target = cur
		}
	}
	w.cfg.Events.Service(target, key, reason, msg)
}

// recordRecreated records on created, the Service this worker created in
// place of old for a new cluster IP (nil: another worker created it, and
// records it).
func (w *Worker) recordRecreated(ctx context.Context, old, created *corev1.Service) {
	if w.cfg.Events == nil || created == nil {
		return
	}
	w.cfg.Events.Service(created, "", kubeevents.Recreated,
		fmt.Sprintf("deleted and created again for a new cluster IP (spec.clusterIP is immutable): %s -> %s; the BMC's address is the new one",
			old.Spec.ClusterIP, created.Spec.ClusterIP))
}

// recordAdopted records the adoption of old, a Service of the old
// controller (managed-by ours, no instance label) that an update of
// instance key just gave matbus's labels and annotation.
func (w *Worker) recordAdopted(ctx context.Context, key string, old *corev1.Service) {
	if w.cfg.Events == nil {
		return
	}
	if _, ours := old.Labels[plan.LabelInstance]; ours {
		return
	}
	w.cfg.Events.Service(old, key, kubeevents.Adopted,
		fmt.Sprintf("adopted from the old controller by instance %s: matbus's labels and annotation added, its own labels and annotations kept", key))
}
