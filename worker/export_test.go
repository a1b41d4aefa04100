package worker

import (
	"context"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// PlanOf is the plan a sync of inst would make for st now, by the sync's
// own steps (owner lookup, plan.Build, existing over the informer cache,
// plan.Diff), without holding deletes and without writing.
func (w *Worker) PlanOf(ctx context.Context, inst events.Instance, st *matclient.Status) (plan.Plan, error) {
	ref := w.owner(ctx, inst, true)
	d := plan.Build(plan.Instance{Key: inst.Key, PodName: inst.PodName, Owner: ref}, st, w.cfg.Plan)
	existing, foreign, err := w.existing(inst.Key, d.Services)
	if err != nil {
		return plan.Plan{}, err
	}
	d.ForeignIPs = foreign
	return plan.Diff(d, existing, w.cfg.Plan), nil
}

// StateSizes returns how many instances each per-instance store holds.
func (w *Worker) StateSizes() map[string]int { return w.sizes() }
