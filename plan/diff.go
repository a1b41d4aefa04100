package plan

import (
	"cmp"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Plan is what it takes to turn the existing Services into the desired ones.
// Every list is sorted by Service name.
type Plan struct {
	// Create are desired Services that do not exist (deep copies of
	// Desired.Services).
	Create []*corev1.Service
	// Update are Services whose fields differ from the desired ones and can
	// be changed in place.
	Update []Update
	// Recreate are Services whose spec.clusterIP must change, which the API
	// server forbids: delete Old (with Old.UID as precondition), then create
	// New (New has no UID/ResourceVersion).
	Recreate []Update
	// Delete are Services of this instance (and pod) that no device of the
	// status asks for any more. Delete them with their UID as precondition.
	Delete []*corev1.Service
	// Skipped are desired names that Diff leaves alone because the existing
	// Service with that name is not ours to change (another managed-by,
	// another instance or pod) or is being deleted. Nothing to apply; worth a
	// log line or an error event.
	Skipped []Skip
}

// Update is one changed Service. Old is the existing object as passed to
// Diff (never modified). New is a deep copy of Old with our fields overlaid:
// foreign labels, annotations, owner references and spec fields are kept.
// For Plan.Update, New keeps Old's UID and ResourceVersion (an optimistic
// update); for Plan.Recreate, New is ready to create (server-set metadata,
// status, ipFamilies and ipFamilyPolicy cleared).
type Update struct {
	Old, New *corev1.Service
	// Reason says why a Recreate is needed, e.g. "spec.clusterIP 10.96.64.13
	// is the BMC IP of Service mat-bmc-host-y of instance \"ns.mat-b\"";
	// "" for updates.
	Reason string
	// Foreign is set when Reason is another instance's IP (ForeignIPs):
	// a conflict worth a warning, not routine.
	Foreign bool
}

// Skip is a desired Service name that Diff does not act on, and why, with
// the ids of both sides so that a caller can report the clash, e.g. "Service
// bmc/mat-bmc-host-x of mat_id A (instance ns.mat-a) is wanted for mat_id
// B".
type Skip struct {
	// Name is the desired (and existing) Service name.
	Name string
	// Reason says why the existing Service is left alone, e.g. `existing
	// Service belongs to instance "ns.mat-b"`.
	Reason string
	// WantMatID is the full mat_id of the desired Service (its
	// AnnotationMatID).
	WantMatID string
	// HaveMatID is the mat_id of the existing Service: its AnnotationMatID,
	// else its LabelMatID (possibly hashed, see LabelValue), else "" (not a
	// Service of ours or of the old controller).
	HaveMatID string
	// HaveInstance is the existing Service's LabelInstance value
	// (LabelValue of its instance key), "" when it has none (the old
	// controller's or a foreign Service).
	HaveInstance string
}

// Empty reports whether the plan has nothing to apply (Skipped entries are
// not actions).
func (p Plan) Empty() bool {
	return len(p.Create) == 0 && len(p.Update) == 0 && len(p.Recreate) == 0 && len(p.Delete) == 0
}

// Diff compares the desired Services of one instance with the existing
// ones and returns what to create, update, recreate and delete.
//
// existing are the Services the caller listed with InstanceSelector,
// possibly plus the old controller's Services (managed-by set, no instance
// label) and anything else; Diff sorts out what is ours:
//
//   - a Service whose LabelManagedBy is not opts.ManagedBy (default
//     DefaultManagedBy), or whose namespace is set and not opts.Namespace,
//     is never changed or deleted; if it has a desired name, the name is
//     Skipped (no Create, which would only fail with AlreadyExists);
//   - a Service with our managed-by but no instance label (the old
//     controller's) is adopted when its name is desired — updated with our
//     labels, instance included — and left alone otherwise;
//   - a Service of another instance, or of another pod of this instance, is
//     left alone (Skipped when its name is desired);
//   - a Service of this instance and pod whose name is not desired is
//     deleted, unless its mat_id (AnnotationMatID, else LabelMatID) is that
//     of a Held device (a device still present is never deleted), or it is
//     already being deleted;
//   - nothing at all is deleted when d.DeletesHeld(): Build got no status
//     (d.NoStatus), or a device of the status is invalid (a Held entry with
//     HoldInvalidDevice: a device that could not be read may be one whose
//     Service exists, under any name). Creates, updates and recreates of
//     the valid devices' Services still happen.
//
// For a desired name whose Service is ours, only our fields are compared:
// our labels and annotations (present with the same value, or absent
// together), ports (name, protocol, port, targetPort; order ignored),
// selector, our owner reference, type, and per mode:
//
//   - IPModeClusterIP: a different spec.clusterIP → Recreate
//     (spec.clusterIP is immutable). spec.externalIPs is not compared; when
//     a Service is written anyway, the BMC IP is removed from it (a leftover
//     of external-ip mode).
//   - IPModeExternalIP: spec.externalIPs must be exactly [BMC IP] (else
//     Update); spec.clusterIP is the API server's and is not compared —
//     except that a spec.clusterIP equal to the BMC (or NVOS) IP is a
//     leftover of cluster-ip mode (the old controller's, or matbus's in
//     that mode): Recreate, so that the IP is released from the service
//     range and the API server assigns a fresh one. So is a spec.clusterIP
//     that the API server allocated and that equals the BMC or NVOS IP of
//     another desired Service of d (that device's traffic would reach the
//     wrong Service). Foreign labels, annotations and owner references
//     survive the recreate. (Should the API server pick such an IP again
//     — only possible when it lies inside the service range, which is what
//     cluster-ip mode is for — the recreate repeats on the next sync.)
//
// Equal → no entry. Diff never modifies d, existing or their contents; Old
// and Delete entries point at the existing objects, New and Create are
// fresh deep copies. Diff(Build(st), apply(Diff(…))) is Empty.
func Diff(d Desired, existing []*corev1.Service, opts Options) Plan {
	managedBy := LabelValue(opts.managedBy())
	mode := opts.ipMode()

	byName := make(map[string]*corev1.Service, len(existing))
	for _, have := range existing {
		if have == nil || opts.Namespace != "" && have.Namespace != "" && have.Namespace != opts.Namespace {
			continue
		}
		if _, dup := byName[have.Name]; !dup {
			byName[have.Name] = have
		}
	}

	var p Plan
	// In external-ip mode, every BMC and NVOS IP of the status and of
	// other instances (d.ForeignIPs): a Service whose allocated clusterIP
	// is one of them takes it from the device that publishes it.
	var ips map[string]ipOwner
	if mode == IPModeExternalIP {
		ips = make(map[string]ipOwner, len(d.Services)+len(d.ForeignIPs))
		for ip, who := range d.ForeignIPs {
			ips[ip] = ipOwner{who: who, foreign: true}
		}
		for _, want := range d.Services {
			if ip := bmcIP(want, mode); ip != "" {
				ips[ip] = ipOwner{who: "Service " + want.Name}
			}
		}
	}
	desired := make(map[string]bool, len(d.Services))
	for _, want := range d.Services {
		desired[want.Name] = true
		have, ok := byName[want.Name]
		if !ok {
			p.Create = append(p.Create, want.DeepCopy())
			continue
		}
		if reason := notOurs(have, d, managedBy); reason != "" {
			p.Skipped = append(p.Skipped, skip(want, have, reason))
			continue
		}
		if have.DeletionTimestamp != nil {
			p.Skipped = append(p.Skipped, skip(want, have, "existing Service is being deleted"))
			continue
		}
		switch {
		case needsRecreate(have, want, mode, ips):
			u := Update{Old: have, New: recreated(have, want, mode)}
			u.Reason, u.Foreign = recreateReason(have, want, mode, ips)
			p.Recreate = append(p.Recreate, u)
		case !equalOurs(have, want, mode):
			n := have.DeepCopy()
			overlay(n, want, mode)
			p.Update = append(p.Update, Update{Old: have, New: n})
		}
	}

	if !d.DeletesHeld() {
		held := make(map[string]bool, 2*len(d.Held))
		for _, h := range d.Held {
			held[h.MatID] = true
		}
		heldLabel := make(map[string]bool, len(d.Held))
		for _, h := range d.Held {
			heldLabel[LabelValue(h.MatID)] = true
		}
		for name, have := range byName {
			if desired[name] || have.DeletionTimestamp != nil ||
				have.Labels[LabelManagedBy] != managedBy || !inScope(have, d) {
				continue
			}
			if id, ok := have.Annotations[AnnotationMatID]; ok {
				if held[id] {
					continue
				}
			} else if id, ok := have.Labels[LabelMatID]; ok && heldLabel[id] {
				continue
			}
			p.Delete = append(p.Delete, have)
		}
	}

	byServiceName := func(a, b *corev1.Service) int { return cmp.Compare(a.Name, b.Name) }
	byUpdateName := func(a, b Update) int { return cmp.Compare(a.Old.Name, b.Old.Name) }
	slices.SortFunc(p.Create, byServiceName)
	slices.SortFunc(p.Update, byUpdateName)
	slices.SortFunc(p.Recreate, byUpdateName)
	slices.SortFunc(p.Delete, byServiceName)
	slices.SortFunc(p.Skipped, func(a, b Skip) int { return cmp.Compare(a.Name, b.Name) })
	return p
}

// inScope reports whether have carries this Desired's instance label and
// the same pod label (both absent for single-pod deployments).
func inScope(have *corev1.Service, d Desired) bool {
	inst, ok := have.Labels[LabelInstance]
	if !ok || inst != d.Instance {
		return false
	}
	return have.Labels[LabelPodName] == d.PodName
}

// notOurs returns why have, which has a desired name, must not be changed,
// or "" when it is ours (or the old controller's, to adopt).
func notOurs(have *corev1.Service, d Desired, managedBy string) string {
	mb, ok := have.Labels[LabelManagedBy]
	switch {
	case !ok:
		return "existing Service has no " + LabelManagedBy + " label"
	case mb != managedBy:
		return "existing Service is managed by " + quote(mb)
	}
	inst, ok := have.Labels[LabelInstance]
	switch {
	case !ok:
		return "" // the old controller's: adopt
	case inst != d.Instance:
		return "existing Service belongs to instance " + quote(inst)
	case have.Labels[LabelPodName] != d.PodName:
		return "existing Service belongs to pod " + quote(have.Labels[LabelPodName]) + " of this instance"
	}
	return ""
}

func quote(s string) string { return `"` + s + `"` }

// skip is the Skip entry for the desired want whose name have holds.
func skip(want, have *corev1.Service, reason string) Skip {
	haveID, ok := have.Annotations[AnnotationMatID]
	if !ok {
		haveID = have.Labels[LabelMatID]
	}
	return Skip{
		Name:         want.Name,
		Reason:       reason,
		WantMatID:    want.Annotations[AnnotationMatID],
		HaveMatID:    haveID,
		HaveInstance: have.Labels[LabelInstance],
	}
}

// bmcIP is the BMC IP of a desired Service in the given mode.
func bmcIP(want *corev1.Service, mode IPMode) string {
	if mode == IPModeExternalIP {
		if len(want.Spec.ExternalIPs) > 0 {
			return want.Spec.ExternalIPs[0]
		}
		return ""
	}
	return want.Spec.ClusterIP
}

// ipOwner is who publishes a BMC or NVOS IP: a desired Service of this
// status, or another instance's (foreign).
type ipOwner struct {
	who     string
	foreign bool
}

// needsRecreate reports whether have's spec.clusterIP must change: in
// external-ip mode when it is want's own IP or one of ips (another
// device's BMC or NVOS IP, of this status or another instance's), else
// when it is not want's.
func needsRecreate(have, want *corev1.Service, mode IPMode, ips map[string]ipOwner) bool {
	if mode == IPModeExternalIP {
		ip := bmcIP(want, mode)
		_, taken := ips[have.Spec.ClusterIP]
		return have.Spec.ClusterIP != "" && (ip != "" && have.Spec.ClusterIP == ip || taken)
	}
	return have.Spec.ClusterIP != want.Spec.ClusterIP
}

// recreateReason says why needsRecreate holds, and whether the IP is
// another instance's.
func recreateReason(have, want *corev1.Service, mode IPMode, ips map[string]ipOwner) (string, bool) {
	ip := have.Spec.ClusterIP
	if mode != IPModeExternalIP {
		return "spec.clusterIP " + ip + " is not the BMC IP " + want.Spec.ClusterIP, false
	}
	if ip == bmcIP(want, mode) {
		return "spec.clusterIP " + ip + " is its own IP (a leftover of cluster-ip mode)", false
	}
	o := ips[ip]
	return "spec.clusterIP " + ip + " is the IP that " + o.who + " publishes", o.foreign
}

// equalOurs reports whether have already carries want's fields (see Diff).
func equalOurs(have, want *corev1.Service, mode IPMode) bool {
	if serviceType(have) != corev1.ServiceTypeClusterIP ||
		!ownedEqual(have.Labels, want.Labels, ourLabelKeys) ||
		!ownedEqual(have.Annotations, want.Annotations, ourAnnotationKeys) ||
		!maps.Equal(have.Spec.Selector, want.Spec.Selector) ||
		!portsEqual(have.Spec.Ports, want.Spec.Ports) ||
		!reflect.DeepEqual(mergeOwnerRefs(have.OwnerReferences, want.OwnerReferences), have.OwnerReferences) {
		return false
	}
	if mode == IPModeExternalIP {
		return slices.Equal(have.Spec.ExternalIPs, want.Spec.ExternalIPs)
	}
	return true
}

func serviceType(s *corev1.Service) corev1.ServiceType {
	if s.Spec.Type == "" {
		return corev1.ServiceTypeClusterIP // the API server's default
	}
	return s.Spec.Type
}

// ownedEqual compares have and want on the keys we own plus any key of want.
func ownedEqual(have, want map[string]string, owned []string) bool {
	same := func(k string) bool {
		hv, hok := have[k]
		wv, wok := want[k]
		return hok == wok && hv == wv
	}
	for _, k := range owned {
		if !same(k) {
			return false
		}
	}
	for k := range want {
		if !same(k) {
			return false
		}
	}
	return true
}

// overlayOwned returns have without the keys we own, plus want. have is
// modified in place (callers pass a copy) and may be nil.
func overlayOwned(have, want map[string]string, owned []string) map[string]string {
	for _, k := range owned {
		delete(have, k)
	}
	if have == nil && len(want) > 0 {
		have = make(map[string]string, len(want))
	}
	maps.Copy(have, want)
	return have
}

type portKey struct {
	name     string
	protocol corev1.Protocol
	port     int32
	target   intstr.IntOrString
}

func portKeys(ps []corev1.ServicePort) []portKey {
	keys := make([]portKey, len(ps))
	for i, p := range ps {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP // the API server's default
		}
		keys[i] = portKey{name: p.Name, protocol: proto, port: p.Port, target: p.TargetPort}
	}
	slices.SortFunc(keys, func(a, b portKey) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.protocol, b.protocol), cmp.Compare(a.port, b.port))
	})
	return keys
}

// portsEqual compares name, protocol, port and targetPort, in any order. A
// targetPort of "1266" (named) differs from 1266 (number).
func portsEqual(have, want []corev1.ServicePort) bool {
	return len(have) == len(want) && slices.Equal(portKeys(have), portKeys(want))
}

// sameOwner reports whether two owner references name the same owner: same
// UID, or same API group, kind and name (an owner re-created under the same
// name gets a new UID; ours replaces the stale reference).
func sameOwner(a, b metav1.OwnerReference) bool {
	if a.UID != "" && a.UID == b.UID {
		return true
	}
	group := func(apiVersion string) string {
		if i := strings.IndexByte(apiVersion, '/'); i >= 0 {
			return apiVersion[:i]
		}
		return ""
	}
	return a.Kind == b.Kind && a.Name == b.Name && group(a.APIVersion) == group(b.APIVersion)
}

// mergeOwnerRefs returns have with each of want in place of the first
// reference to the same owner (other references to it dropped), or
// appended. Foreign references keep their order. Without want it returns
// have itself.
func mergeOwnerRefs(have, want []metav1.OwnerReference) []metav1.OwnerReference {
	if len(want) == 0 {
		return have
	}
	out := make([]metav1.OwnerReference, 0, len(have)+len(want))
	placed := make([]bool, len(want))
	for _, h := range have {
		matched := false
		for i, w := range want {
			if sameOwner(h, w) {
				matched = true
				if !placed[i] {
					out = append(out, *w.DeepCopy())
					placed[i] = true
				}
				break
			}
		}
		if !matched {
			out = append(out, *h.DeepCopy())
		}
	}
	for i, w := range want {
		if !placed[i] {
			out = append(out, *w.DeepCopy())
		}
	}
	return out
}

// overlay writes want's fields onto n (a deep copy of an existing Service).
func overlay(n, want *corev1.Service, mode IPMode) {
	n.Labels = overlayOwned(n.Labels, want.Labels, ourLabelKeys)
	n.Annotations = overlayOwned(n.Annotations, want.Annotations, ourAnnotationKeys)
	n.OwnerReferences = mergeOwnerRefs(n.OwnerReferences, want.OwnerReferences)

	if serviceType(n) != corev1.ServiceTypeClusterIP {
		// Fields the API server rejects or ignores on a ClusterIP Service.
		n.Spec.ExternalName = ""
		n.Spec.ExternalTrafficPolicy = ""
		n.Spec.HealthCheckNodePort = 0
		n.Spec.LoadBalancerIP = ""
		n.Spec.LoadBalancerSourceRanges = nil
		n.Spec.LoadBalancerClass = nil
		n.Spec.AllocateLoadBalancerNodePorts = nil
	}
	n.Spec.Type = corev1.ServiceTypeClusterIP
	n.Spec.Ports = slices.Clone(want.Spec.Ports)
	n.Spec.Selector = maps.Clone(want.Spec.Selector)

	if mode == IPModeExternalIP {
		n.Spec.ExternalIPs = slices.Clone(want.Spec.ExternalIPs)
		return
	}
	ip := want.Spec.ClusterIP
	n.Spec.ExternalIPs = slices.DeleteFunc(n.Spec.ExternalIPs, func(s string) bool { return s == ip })
	if len(n.Spec.ExternalIPs) == 0 {
		n.Spec.ExternalIPs = nil
		// The API server set it when the Service had externalIPs (external-ip
		// mode) and refuses it on a Service that no longer does.
		n.Spec.ExternalTrafficPolicy = ""
	}
}

// recreated returns the Service to create in place of have: a copy of have
// without server-set metadata and status, with want's fields overlaid and
// spec.clusterIP set to the BMC IP (cluster-ip) or left to the API server
// (external-ip).
func recreated(have, want *corev1.Service, mode IPMode) *corev1.Service {
	n := have.DeepCopy()
	n.UID = ""
	n.ResourceVersion = ""
	n.Generation = 0
	n.CreationTimestamp = metav1.Time{}
	n.DeletionTimestamp = nil
	n.DeletionGracePeriodSeconds = nil
	n.ManagedFields = nil
	n.Status = corev1.ServiceStatus{}
	overlay(n, want, mode)
	n.Spec.IPFamilies = nil
	n.Spec.IPFamilyPolicy = nil
	if mode == IPModeExternalIP {
		n.Spec.ClusterIP = ""
		n.Spec.ClusterIPs = nil
	} else {
		n.Spec.ClusterIP = want.Spec.ClusterIP
		n.Spec.ClusterIPs = slices.Clone(want.Spec.ClusterIPs)
	}
	return n
}

// ForeignIPs returns, of the allocated cluster IPs of mine (Services of the
// instance whose LabelInstance value is inst), those that a Service of
// another instance publishes as its BMC or NVOS IP (ServiceIP), each with
// who publishes it, e.g. `Service mat-bmc-host-y of instance "ns.mat-b"`:
// the Desired.ForeignIPs to pass to Diff. publishers returns the Services
// whose ServiceIP is ip (an informer index, say). A cluster IP that is the
// Service's own IP, and Services without an instance label, are not
// looked at. nil when there is none.
func ForeignIPs(inst string, mine []*corev1.Service, publishers func(ip string) []*corev1.Service) map[string]string {
	var out map[string]string
	for _, s := range mine {
		ip := s.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone || ip == ServiceIP(s) {
			continue
		}
		for _, h := range publishers(ip) {
			other := h.Labels[LabelInstance]
			if other == inst || other == "" {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			out[ip] = "Service " + h.Name + " of instance " + quote(other)
			break
		}
	}
	return out
}
