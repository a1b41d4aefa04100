package worker

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/matbus/matbus/plan"
)

// byInstance names the Service informer's index by instance label: a sync
// reads its instance's Services (and the unlabelled ones it may adopt) in
// time proportional to their number, not to every Service of the namespace
// (at 10,000 Services two label-selector scans cost each sync milliseconds
// of CPU, and an instance whose Services are being deleted is synced at
// every poll).
const byInstance = "matbus.instance"

// noInstanceLabel is the index value of a Service without the instance
// label (an old controller's Service). It is not a valid label value, so no
// instance's label can take it.
const noInstanceLabel = "\x00none"

// instanceIndex indexes a Service by the value of its instance label, or by
// noInstanceLabel when it has none. The informer holds only Services
// managed by matbus (its label selector), so the index needs no other check.
func instanceIndex(obj any) ([]string, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return nil, fmt.Errorf("worker: index: %T is not a Service", obj)
	}
	v, ok := s.Labels[plan.LabelInstance]
	if !ok {
		return []string{noInstanceLabel}, nil
	}
	return []string{v}, nil
}

// indexed returns the Services of the informer whose instance label is
// value (noInstanceLabel: without the label). Errors: the index is missing
// (the informer was not set up by Run).
func (w *Worker) indexed(value string) ([]*corev1.Service, error) {
	if w.byInst == nil {
		return nil, fmt.Errorf("worker: Services by instance: the Service informer is not running")
	}
	objs, err := w.byInst.ByIndex(byInstance, value)
	if err != nil {
		return nil, fmt.Errorf("worker: Services by instance: %w", err)
	}
	out := make([]*corev1.Service, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*corev1.Service); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

// byIP names the Service informer's index by the BMC or NVOS IP a Service
// publishes (plan.ServiceIP of its annotations): a sync in external-ip mode
// finds whether an allocated cluster IP of its own Services is an IP that
// another instance publishes in time proportional to its own Services.
const byIP = "matbus.ip"

// ipIndex indexes a Service by plan.ServiceIP; a Service without one is
// not indexed.
func ipIndex(obj any) ([]string, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return nil, fmt.Errorf("worker: index: %T is not a Service", obj)
	}
	if ip := plan.ServiceIP(s); ip != "" {
		return []string{ip}, nil
	}
	return nil, nil
}

// foreignIPs is plan.ForeignIPs over the informer's index by IP: the IPs
// that other instances publish among the cluster IPs of mine (the Services
// of instance label value inst). nil when none or when the index is missing
// (nothing is recreated on a guess).
func (w *Worker) foreignIPs(inst string, mine []*corev1.Service) map[string]string {
	if w.byInst == nil {
		return nil
	}
	return plan.ForeignIPs(inst, mine, func(ip string) []*corev1.Service {
		objs, err := w.byInst.ByIndex(byIP, ip)
		if err != nil {
			return nil
		}
		out := make([]*corev1.Service, 0, len(objs))
		for _, o := range objs {
			if h, ok := o.(*corev1.Service); ok {
				out = append(out, h)
			}
		}
		return out
	})
}

// existing lists, from the informer cache, the Services of instance key plus
// the old controller's Services (managed-by ours, no instance label) that
// plan.Diff may adopt.
//
// Services of other instances that carry a desired name are added too, so
// that Diff reports the name as taken (a collision) instead of planning a
// create that can only fail.
func (w *Worker) existing(key string, desired []*corev1.Service) ([]*corev1.Service, error) {
	lister := w.services.Services(w.cfg.Plan.Namespace)
	mine, err := w.indexed(plan.LabelValue(key))
	if err != nil {
		return nil, err
	}
	old, err := w.indexed(noInstanceLabel)
	if err != nil {
		return nil, err
	}
	out := append(mine, old...)
	seen := make(map[string]bool, len(out))
	for _, s := range out {
		seen[s.Name] = true
	}
	for _, d := range desired {
		if seen[d.Name] {
			continue
		}
		if s, err := lister.Get(d.Name); err == nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
