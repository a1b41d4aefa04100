package plan

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// NoInstance is the value under which an Index keeps the Services without
// LabelInstance (the old controller's). It is not a valid label value, so
// no instance's label can take it.
const NoInstance = "\x00none"

// Index is a read-only view of the Services of one namespace
// (Options.Namespace), by which Existing finds what a sync compares its
// Desired with. The worker's Service informer implements it over its
// indexer, `matbus plan` over the Services of one LIST. Its methods do no
// I/O and never modify what they return.
type Index interface {
	// ByInstance returns the Services whose LabelInstance value is value,
	// or, for NoInstance, those without the label; in any order. An empty
	// label value is a value like any other. Errors: the index cannot be
	// read (e.g. the informer is not running).
	ByInstance(value string) ([]*corev1.Service, error)
	// ByIP returns the Services whose ServiceIP is ip, in any order.
	ByIP(ip string) []*corev1.Service
	// ByName returns the Service named name, nil when the index holds
	// none. What the index holds decides: a worker's informer holds only
	// the Services of its managed-by value (a foreign Service at a desired
	// name then shows as the create's AlreadyExists), a LIST holds every
	// Service (a dry run then reports the name as Skipped at once).
	ByName(name string) *corev1.Service
}

// Existing is the one rule by which a worker's sync and `matbus plan`
// choose, from x, the Services that Diff compares the desired Services of
// instance key with, and the foreign IPs that block them:
//
//   - existing, sorted by name: the Services of instance key (LabelInstance
//     = LabelValue(key)) and those without an instance label (the old
//     controller's, which Diff adopts when their name is desired), both
//     only with opts' managed-by value; plus, for each desired name not
//     among them, the Service x holds by that name (of another instance,
//     or foreign), so that Diff reports the name as taken instead of
//     planning a create that can only fail;
//   - foreignIPs, in IPModeExternalIP only (nil otherwise): ForeignIPs of
//     existing, where an IP's publishers are the Services of x with opts'
//     managed-by value whose ServiceIP it is, looked at in name order (the
//     first of another instance is named).
//
// Errors: x.ByInstance's. Existing never modifies x or desired.
func Existing(x Index, key string, desired []*corev1.Service, opts Options) (existing []*corev1.Service, foreignIPs map[string]string, err error) {
	mb := LabelValue(opts.managedBy())
	ours := func(svcs []*corev1.Service) []*corev1.Service {
		out := make([]*corev1.Service, 0, len(svcs))
		for _, s := range svcs {
			if s.Labels[LabelManagedBy] == mb {
				out = append(out, s)
			}
		}
		return out
	}
	inst := LabelValue(key)
	mine, err := x.ByInstance(inst)
	if err != nil {
		return nil, nil, err
	}
	old, err := x.ByInstance(NoInstance)
	if err != nil {
		return nil, nil, err
	}
	existing = append(ours(mine), ours(old)...)
	seen := make(map[string]bool, len(existing))
	for _, s := range existing {
		seen[s.Name] = true
	}
	for _, d := range desired {
		if seen[d.Name] {
			continue
		}
		if s := x.ByName(d.Name); s != nil {
			seen[s.Name] = true
			existing = append(existing, s)
		}
	}
	slices.SortFunc(existing, func(a, b *corev1.Service) int { return cmp.Compare(a.Name, b.Name) })
	if opts.IPMode != IPModeExternalIP {
		return existing, nil, nil
	}
	foreignIPs = ForeignIPs(inst, existing, func(ip string) []*corev1.Service {
		pubs := ours(x.ByIP(ip))
		slices.SortFunc(pubs, func(a, b *corev1.Service) int { return cmp.Compare(a.Name, b.Name) })
		return pubs
	})
	return existing, foreignIPs, nil
}

// ListIndex is an Index over a fixed list of Services (the items of one
// LIST of a namespace): it holds every Service given, whatever its
// managed-by value. Build it with NewListIndex; it is not changed after.
type ListIndex struct {
	byName map[string]*corev1.Service
	byInst map[string][]*corev1.Service
	byIP   map[string][]*corev1.Service
}

// NewListIndex indexes svcs by name, instance label (NoInstance without
// one) and ServiceIP (a Service without one is not indexed by IP). Of two
// Services with one name, the later is kept by name. It keeps the
// pointers, not copies.
func NewListIndex(svcs []*corev1.Service) *ListIndex {
	x := &ListIndex{byName: make(map[string]*corev1.Service, len(svcs)),
		byInst: map[string][]*corev1.Service{}, byIP: map[string][]*corev1.Service{}}
	for _, s := range svcs {
		x.byName[s.Name] = s
		inst, ok := s.Labels[LabelInstance]
		if !ok {
			inst = NoInstance
		}
		x.byInst[inst] = append(x.byInst[inst], s)
		if ip := ServiceIP(s); ip != "" {
			x.byIP[ip] = append(x.byIP[ip], s)
		}
	}
	return x
}

// ByInstance implements Index; it never fails.
func (x *ListIndex) ByInstance(value string) ([]*corev1.Service, error) {
	return slices.Clone(x.byInst[value]), nil
}

// ByIP implements Index.
func (x *ListIndex) ByIP(ip string) []*corev1.Service { return slices.Clone(x.byIP[ip]) }

// ByName implements Index.
func (x *ListIndex) ByName(name string) *corev1.Service { return x.byName[name] }
