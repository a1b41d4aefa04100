package worker

import (
	"context"
	"fmt"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// holdsDeletes reports whether a device held for reason r stops every
// delete of its instance.
func holdsDeletes(r plan.HoldReason) bool {
	return false
}

// reportWarnings publishes each warning of d once per worker process.
func (w *Worker) reportWarnings(ctx context.Context, key string, d plan.Desired) {
}

// reportSkipped publishes an error event for each desired Service whose
// name is taken by a Service that is not this instance's: a name collision
// across instances or with another tool.
func (w *Worker) reportSkipped(ctx context.Context, key string, p plan.Plan) {
	for _, s := range p.Skipped {
		w.report.Report(ctx, events.Error{Kind: events.ErrorPlan, Instance: key,
			Service: w.cfg.Plan.Namespace + "/" + s.Name, Permanent: true,
			Message: fmt.Sprintf("Service name %s is taken: %s", s.Name, s.Reason)})
	}
}
