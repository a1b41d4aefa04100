package worker

import (
	"context"
	"fmt"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/plan"
)

// holdsDeletes reports whether a device held for reason r stops every
// delete of its instance (an invalid device might be any of its Services).
func holdsDeletes(r plan.HoldReason) bool {
	return r == plan.HoldInvalidDevice
}

// reportWarnings publishes each warning of d (e.g. a duplicate endpoint
// dropped from a Service) once per worker process and instance: a
// warning repeats on every sync while the status stays the same.
func (w *Worker) reportWarnings(ctx context.Context, key string, d plan.Desired) {
	for _, wn := range d.Warnings {
		if !w.warned.first(key, wn.MatID+"\x00"+wn.Detail) {
			continue
		}
		w.log.Warn("plan warning", "instance", key, "mat_id", wn.MatID, "service", wn.Name, "detail", wn.Detail)
		w.report.Report(ctx, events.Error{Kind: events.ErrorPlan, Instance: key, MatID: wn.MatID,
			Service: w.cfg.Plan.Namespace + "/" + wn.Name, Message: "warning: " + wn.Detail})
	}
}

// reportSkipped publishes an error event for each desired Service whose
// name is taken by a Service that is not this instance's: a name collision
// across instances or with another tool.
func (w *Worker) reportSkipped(ctx context.Context, key string, p plan.Plan) {
	for _, s := range p.Skipped {
		msg := fmt.Sprintf("Service name %s is taken: %s", s.Name, s.Reason)
		if s.HaveMatID != "" && s.HaveMatID != s.WantMatID {
			// Two different mat_ids map to one name: a name collision.
			msg = fmt.Sprintf("Service name collision: mat_id %q (this instance) and mat_id %q (instance label %q) both map to %s; the existing Service stays: %s",
				s.WantMatID, s.HaveMatID, s.HaveInstance, s.Name, s.Reason)
		}
		w.report.Report(ctx, events.Error{Kind: events.ErrorPlan, Instance: key, MatID: s.WantMatID,
			Service: w.cfg.Plan.Namespace + "/" + s.Name, Permanent: true, Message: msg})
		w.cfg.Events.Instance(key, kubeevents.NameCollision, msg)
	}
}

// reportForeignRecreates publishes (and so logs) a plan error event for each
// recreate of p whose cluster IP is an IP another instance publishes
// (plan.Update.Foreign): two instances' Services were fighting over one IP,
// which the recreate ends.
func (w *Worker) reportForeignRecreates(ctx context.Context, key string, p plan.Plan) {
	for _, u := range p.Recreate {
		if !u.Foreign {
			continue
		}
		msg := fmt.Sprintf("Service %s is recreated for a fresh cluster IP: %s", u.Old.Name, u.Reason)
		w.report.Report(ctx, events.Error{Kind: events.ErrorPlan, Instance: key, MatID: u.New.Annotations[plan.AnnotationMatID],
			Service: w.cfg.Plan.Namespace + "/" + u.Old.Name, Message: msg})
	}
}
