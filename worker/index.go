package worker

import (
	"fmt"

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
// label (an old controller's): plan.NoInstance.
const noInstanceLabel = plan.NoInstance

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

// informerIndex is the Service informer's indexer as a plan.Index: it
// holds only the Services of the worker's managed-by value (the informer's
// label selector).
type informerIndex struct{ w *Worker }

// ByInstance implements plan.Index (Worker.indexed).
func (x informerIndex) ByInstance(value string) ([]*corev1.Service, error) { return x.w.indexed(value) }

// ByIP implements plan.Index: nil when the index is missing.
func (x informerIndex) ByIP(ip string) []*corev1.Service {
	if x.w.byInst == nil {
		return nil
	}
	objs, err := x.w.byInst.ByIndex(byIP, ip)
	if err != nil {
		return nil
	}
	out := make([]*corev1.Service, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*corev1.Service); ok {
			out = append(out, s)
		}
	}
	return out
}

// ByName implements plan.Index: nil when the informer holds no such
// Service (or is not running).
func (x informerIndex) ByName(name string) *corev1.Service {
	if x.w.services == nil {
		return nil
	}
	s, err := x.w.services.Services(x.w.cfg.Plan.Namespace).Get(name)
	if err != nil {
		return nil
	}
	return s
}

// existing is plan.Existing over the informer cache: the Services of
// instance key that Diff compares its desired Services with (its own, the
// old controller's it may adopt, and those of other instances that hold a
// desired name), and in external-ip mode the foreign IPs among their
// cluster IPs. Errors: the informer's index is missing.
func (w *Worker) existing(key string, desired []*corev1.Service) ([]*corev1.Service, map[string]string, error) {
	return plan.Existing(informerIndex{w}, key, desired, w.cfg.Plan)
}
