package operator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/owner"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// ErrNoInstance is returned by Plan and Instances when discovery finds no
// MAT instance: there is nothing to plan.
var ErrNoInstance = errors.New("operator: no MAT instance found")

// StatusClient fetches one MAT instance's status (*matclient.Client).
type StatusClient interface {
	Status(ctx context.Context) (*matclient.Status, error)
	Close() error
}

// PlanConfig is what Plan needs.
type PlanConfig struct {
	// Kube is only read: GET of the MAT Deployments (owners), one LIST of
	// the Services of Options.Namespace.
	Kube kubernetes.Interface
	// Options are the worker's plan options (--namespace, --managed-by,
	// --bmc-ip-mode, --target-selector, --enable-state-annotations).
	// Options.Namespace must be set.
	Options plan.Options
	// NewClient returns the status client of one instance URL, closed after
	// its one fetch.
	NewClient func(url string) (StatusClient, error)
	// Fetches is how many statuses are fetched at once; 0 or less means 8.
	Fetches int
	// Hold is the workers' hold rule (--delete-hold-share,
	// --delete-hold-window): deletes it would hold are reported as held,
	// not as changes.
	Hold plan.HoldRule
	// Holds are the hold records of the state bucket by instance key (the
	// holds in force or released); nil when they could not be read, and
	// then a hold in force is not known (HoldsErr says why).
	Holds    map[string]events.HoldRecord
	HoldsErr error
}

// Instances returns the instances src reports once it has synced: what
// discovery would publish now, sorted by key. Errors: src cannot start,
// ctx ends before it synced, or ErrNoInstance.
func Instances(ctx context.Context, src discovery.Source) ([]events.Instance, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := src.Run(sctx, func() {}); err != nil {
		return nil, fmt.Errorf("operator: discovery %s: %w", src.Scope(), err)
	}
	insts, err := discovery.WaitSynced(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("operator: discovery %s did not sync: %w", src.Scope(), err)
	}
	if len(insts) == 0 {
		return nil, fmt.Errorf("%w (discovery %s)", ErrNoInstance, src.Scope())
	}
	return insts, nil
}

// Plan fetches every instance's status once, lists the live Services of
// cfg.Options.Namespace once (the old controller's included), and runs
// plan.Build and plan.Diff per instance as a worker's sync does, with the
// same options, the owner reference of the instance's MAT Deployment and
// the same Services: the instance's own, the old controller's (managed-by
// ours, no matbus.io/instance label) and, in external-ip mode, the IPs
// other instances publish. It also passes every listed Service that holds
// a desired name, so a name taken by a foreign Service is reported as
// skipped (the worker's create would be refused with AlreadyExists).
//
// It writes nothing. A failed fetch or an unreadable owner Deployment is
// the instance's Error (the others are still planned; a failed fetch plans
// nothing for it). Errors: ErrNoInstance for no instances, the Service
// list failing (e.g. an unreachable API server), ctx ending.
func Plan(ctx context.Context, cfg PlanConfig, insts []events.Instance) (*Report, error) {
	if len(insts) == 0 {
		return nil, ErrNoInstance
	}
	if cfg.Kube == nil || cfg.NewClient == nil || cfg.Options.Namespace == "" {
		return nil, errors.New("operator: PlanConfig needs Kube, NewClient and Options.Namespace")
	}
	ns := cfg.Options.Namespace
	list, err := cfg.Kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("operator: list Services of namespace %s: %w", ns, err)
	}
	live := make([]*corev1.Service, len(list.Items))
	for i := range list.Items {
		live[i] = &list.Items[i]
	}
	sts := fetchAll(ctx, cfg, insts)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("operator: plan: %w", err)
	}

	r := &Report{Namespace: ns, IPMode: cfg.Options.IPMode, Services: len(live)}
	if r.IPMode == "" {
		r.IPMode = plan.IPModeClusterIP
	}
	idx := plan.NewListIndex(live)
	mb := cfg.Options.ManagedBy
	if mb == "" {
		mb = plan.DefaultManagedBy
	}
	for i, in := range insts {
		ip := InstancePlan{Key: in.Key, URL: in.URL, PodName: in.PodName, Owner: in.Owner}
		if sts[i].err != nil {
			ip.Error = fmt.Sprintf("status fetch failed, nothing planned: %v", sts[i].err)
			r.Instances = append(r.Instances, ip)
			continue
		}
		owner, oerr := owner.Lookup(ctx, cfg.Kube, in)
		if oerr != nil {
			ip.Error = fmt.Sprintf("owner Deployment not readable, planned without an owner reference as the worker would: %v", oerr)
		}
		d := plan.Build(plan.Instance{Key: in.Key, PodName: in.PodName, Owner: owner}, sts[i].st, cfg.Options)
		existing, foreign, err := plan.Existing(idx, in.Key, d.Services, cfg.Options)
		if err != nil {
			return nil, fmt.Errorf("operator: plan %s: %w", in.Key, err)
		}
		d.ForeignIPs = foreign
		p := plan.Diff(d, existing, cfg.Options)
		p = ip.hold(cfg, in.Key, sts[i], d, existing, p)
		ip.fill(d, p, plan.LabelValue(mb))
		r.Instances = append(r.Instances, ip)
	}
	r.count()
	return r, nil
}

type fetched struct {
	st  *matclient.Status
	at  time.Time // when the fetch started
	err error
}

// hold applies the workers' hold decision (plan.DecideHold) to the deletes
// of p, with the instance's hold record when known: the deletes a worker
// would hold now go to ip.HeldDeletes with ip.DeleteHold saying why, and
// p keeps only those a worker would run. The instance's previous epoch is
// not known here, so the epoch rule does not apply.
func (ip *InstancePlan) hold(cfg PlanConfig, key string, f fetched, d plan.Desired, existing []*corev1.Service, p plan.Plan) plan.Plan {
	var h *plan.HoldState
	rec, ok := cfg.Holds[key]
	if ok {
		h = plan.NewHoldState(rec.Since, rec.Until, !rec.InForce(), rec.UIDs(), !rec.Truncated)
	}
	dis := plan.Disappearance{Existing: plan.Deletable(d, existing, cfg.Options), Deletes: len(p.Delete), Epoch: f.st.EpochID}
	dec := plan.DecideHold(cfg.Hold, h, p, dis, f.at, cfg.Options.IPMode)
	p.Delete = dec.Go
	if len(dec.Held) == 0 {
		return p
	}
	dh := &DeleteHold{Reason: string(dec.Reason), Detail: dec.Detail, Window: cfg.Hold.Window.String()}
	if ok && rec.InForce() && dec.Action != plan.HoldStart {
		dh.Reason, dh.Detail, dh.Since, dh.Until = rec.Reason, rec.Detail, rec.Since, rec.Until
	}
	if cfg.Holds == nil && cfg.HoldsErr != nil {
		dh.Unknown = "hold records not read: " + cfg.HoldsErr.Error()
	}
	ip.DeleteHold = dh
	for _, s := range dec.Held {
		ip.HeldDeletes = append(ip.HeldDeletes, deleted(s))
	}
	return p
}

// fetchAll fetches each instance's status once, cfg.Fetches at a time.
func fetchAll(ctx context.Context, cfg PlanConfig, insts []events.Instance) []fetched {
	n := cfg.Fetches
	if n <= 0 {
		n = 8
	}
	out := make([]fetched, len(insts))
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, in := range insts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := cfg.NewClient(in.URL)
			if err != nil {
				out[i].err = fmt.Errorf("%s: %w", in.URL, err)
				return
			}
			defer func() { _ = c.Close() }()
			out[i].at = time.Now()
			st, err := c.Status(ctx)
			if err != nil {
				out[i].err = fmt.Errorf("%s: %w", in.URL, err)
				return
			}
			out[i].st = st
		}()
	}
	wg.Wait()
	return out
}
