package operator

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/plan"
)

// Report is what a takeover of one namespace would do, per instance.
type Report struct {
	Namespace string      `json:"namespace"`
	IPMode    plan.IPMode `json:"bmc_ip_mode"`
	// Services is how many Services the namespace held (all of them).
	Services  int            `json:"services_listed"`
	Instances []InstancePlan `json:"instances"`
	// Changes counts creates, updates, recreates and deletes over all
	// instances; Adoptions the adoptions that change nothing else (not
	// changes); Errors the instances with an Error.
	Changes   int `json:"changes"`
	Adoptions int `json:"adoptions"`
	Errors    int `json:"errors"`
}

// ExitCode is `matbus plan`'s exit status for r: 1 when an instance has
// an error, else 2 when something would change, else 0.
func (r *Report) ExitCode() int {
	switch {
	case r.Errors > 0:
		return 1
	case r.Changes > 0:
		return 2
	}
	return 0
}

// InstancePlan is the plan of one MAT instance. Every list is sorted by
// Service name.
type InstancePlan struct {
	Key     string `json:"key"`
	URL     string `json:"url"`
	PodName string `json:"pod_name,omitempty"`
	Owner   string `json:"owner,omitempty"`
	// Error is why the instance could not be planned (a failed status
	// fetch: nothing planned), or planned only in part (an unreadable
	// owner Deployment); "" when none.
	Error string `json:"error,omitempty"`
	// Create are the Services that do not exist yet.
	Create []Created `json:"create"`
	// Update are the Services changed in place (with the fields that
	// change), adoptions that change more than matbus's additions
	// included (Adopt set).
	Update []Changed `json:"update"`
	// Recreate are the Services deleted and created again (Reason says
	// why: spec.clusterIP is immutable).
	Recreate []Changed `json:"recreate"`
	// Delete are the Services of this instance no device wants any more.
	Delete []Deleted `json:"delete"`
	// Adopt are the old controller's Services that get matbus's documented
	// additions only (labels matbus.io/instance, matbus.io/machine-type,
	// matbus.io/pod-name, annotation matbus.io/mat-id): not a change.
	Adopt []Changed `json:"adopt"`
	// Skipped are desired names held by a Service that is not ours to
	// change (plan.Skip).
	Skipped []Skipped `json:"skipped,omitempty"`
	// Held are the devices that get no Service (plan.Hold).
	Held []Held `json:"held,omitempty"`
	// HeldDeletes are the Services of this instance whose deletes a worker
	// holds now (many devices vanished at once); DeleteHold says why and
	// until when. They are not changes: they run only if a status fetched
	// after the hold's window still lacks their devices.
	HeldDeletes []Deleted   `json:"held_deletes,omitempty"`
	DeleteHold  *DeleteHold `json:"delete_hold,omitempty"`

	// Plan is plan.Diff's answer, nil when nothing was planned.
	Plan *plan.Plan `json:"-"`
}

// Changes is the number of creates, updates, recreates and deletes.
func (p InstancePlan) Changes() int {
	return len(p.Create) + len(p.Update) + len(p.Recreate) + len(p.Delete)
}

// Created is a Service to create.
type Created struct {
	Name        string `json:"name"`
	MatID       string `json:"mat_id"`
	MachineType string `json:"machine_type"` // matbus.io/machine-type: host, dpu, switch, power-shelf, nvos
	IP          string `json:"ip"`           // the BMC or NVOS IP
}

// Changed is a Service updated, recreated or adopted.
type Changed struct {
	Name string `json:"name"`
	// Adopt is set when the Service is the old controller's (our managed-by,
	// no matbus.io/instance label).
	Adopt bool `json:"adopt,omitempty"`
	// Reason says why a recreate is needed (plan.Update.Reason); Foreign
	// when the IP is another instance's.
	Reason  string        `json:"reason,omitempty"`
	Foreign bool          `json:"foreign,omitempty"`
	Fields  []FieldChange `json:"fields"`
}

// FieldChange is one changed field of a Service.
type FieldChange struct {
	// Field is "label", "annotation", "selector", "port", "type",
	// "clusterIP", "externalIPs" or "ownerReferences".
	Field string `json:"field"`
	// Key is the label, annotation or selector key, or the port name; ""
	// for the other fields.
	Key string `json:"key,omitempty"`
	// Op is "add", "change" or "remove".
	Op string `json:"op"`
	// Old and New are the values before and after ("" when absent); a port
	// as "TCP 443->1266", IP lists and owner references comma separated.
	Old string `json:"old,omitempty"`
	New string `json:"new,omitempty"`
}

// DeleteHold is why an instance's deletes are held.
type DeleteHold struct {
	// Reason is all, share or epoch (plan.MassReason); Detail says it for
	// people.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// Since and Until are the window of the hold in force (the state
	// bucket's record); zero when this status would start a hold, which
	// then lasts Window from the worker's first sight of it.
	Since  time.Time `json:"since,omitzero"`
	Until  time.Time `json:"until,omitzero"`
	Window string    `json:"window"`
	// Unknown says why a hold in force could not be known (the state
	// bucket not read); "" when it was read.
	Unknown string `json:"unknown,omitempty"`
}

// Deleted is a Service to delete.
type Deleted struct {
	Name  string `json:"name"`
	MatID string `json:"mat_id,omitempty"`
}

// Skipped is a desired name left alone.
type Skipped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Held is a device that gets no Service.
type Held struct {
	Name   string `json:"name,omitempty"`
	MatID  string `json:"mat_id,omitempty"`
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

// additions are matbus's documented additions (ADR 14), by field.
var additions = map[string][]string{
	"label":      {plan.LabelInstance, plan.LabelDeviceKind, plan.LabelPodName},
	"annotation": {plan.AnnotationMatID},
}

// isAddition reports whether c only adds one of matbus's documented keys.
func isAddition(c FieldChange) bool {
	return c.Op == "add" && slices.Contains(additions[c.Field], c.Key)
}

// fill sets ip's lists from d and p.
func (ip *InstancePlan) fill(d plan.Desired, p plan.Plan, managedBy string) {
	ip.Plan = &p
	ip.Create, ip.Update, ip.Recreate, ip.Delete, ip.Adopt = []Created{}, []Changed{}, []Changed{}, []Deleted{}, []Changed{}
	for _, s := range p.Create {
		ip.Create = append(ip.Create, Created{Name: s.Name, MatID: s.Annotations[plan.AnnotationMatID],
			MachineType: s.Labels[plan.LabelDeviceKind], IP: plan.ServiceIP(s)})
	}
	for _, u := range p.Update {
		c := Changed{Name: u.Old.Name, Adopt: oldControllers(u.Old, managedBy), Fields: fieldChanges(u.Old, u.New)}
		if c.Adopt && !slices.ContainsFunc(c.Fields, func(f FieldChange) bool { return !isAddition(f) }) {
			ip.Adopt = append(ip.Adopt, c)
			continue
		}
		ip.Update = append(ip.Update, c)
	}
	for _, u := range p.Recreate {
		ip.Recreate = append(ip.Recreate, Changed{Name: u.Old.Name, Adopt: oldControllers(u.Old, managedBy),
			Reason: u.Reason, Foreign: u.Foreign, Fields: fieldChanges(u.Old, u.New)})
	}
	for _, s := range p.Delete {
		ip.Delete = append(ip.Delete, deleted(s))
	}
	for _, s := range p.Skipped {
		ip.Skipped = append(ip.Skipped, Skipped{Name: s.Name, Reason: s.Reason})
	}
	for _, h := range d.Held {
		ip.Held = append(ip.Held, Held{Name: h.Name, MatID: h.MatID, Reason: string(h.Reason), Detail: h.Detail})
	}
}

// deleted is the Deleted of Service s.
func deleted(s *corev1.Service) Deleted {
	id, ok := s.Annotations[plan.AnnotationMatID]
	if !ok {
		id = s.Labels[plan.LabelMatID]
	}
	return Deleted{Name: s.Name, MatID: id}
}

// oldControllers reports whether s is the old controller's: our managed-by,
// no instance label.
func oldControllers(s *corev1.Service, managedBy string) bool {
	_, has := s.Labels[plan.LabelInstance]
	return s.Labels[plan.LabelManagedBy] == managedBy && !has
}

func (r *Report) count() {
	r.Changes, r.Adoptions, r.Errors = 0, 0, 0
	for _, ip := range r.Instances {
		r.Changes += ip.Changes()
		r.Adoptions += len(ip.Adopt)
		if ip.Error != "" {
			r.Errors++
		}
	}
}

// fieldChanges lists what differs between old and new, in a fixed order:
// labels, annotations, selector (each by key), ports (by name), type,
// clusterIP, externalIPs, owner references.
func fieldChanges(old, new *corev1.Service) []FieldChange {
	var out []FieldChange
	out = append(out, mapChanges("label", old.Labels, new.Labels)...)
	out = append(out, mapChanges("annotation", old.Annotations, new.Annotations)...)
	out = append(out, mapChanges("selector", old.Spec.Selector, new.Spec.Selector)...)
	out = append(out, mapChanges("port", ports(old.Spec.Ports), ports(new.Spec.Ports))...)
	if a, b := string(serviceType(old)), string(serviceType(new)); a != b {
		out = append(out, FieldChange{Field: "type", Op: "change", Old: a, New: b})
	}
	if old.Spec.ClusterIP != new.Spec.ClusterIP {
		n := new.Spec.ClusterIP
		if n == "" {
			n = "(allocated by the API server)"
		}
		out = append(out, valueChange("clusterIP", old.Spec.ClusterIP, n))
	}
	if a, b := strings.Join(old.Spec.ExternalIPs, ","), strings.Join(new.Spec.ExternalIPs, ","); a != b {
		out = append(out, valueChange("externalIPs", a, b))
	}
	if a, b := owners(old.OwnerReferences), owners(new.OwnerReferences); a != b {
		out = append(out, valueChange("ownerReferences", a, b))
	}
	return out
}

func valueChange(field, old, new string) FieldChange {
	op := "change"
	switch {
	case old == "":
		op = "add"
	case new == "":
		op = "remove"
	}
	return FieldChange{Field: field, Op: op, Old: old, New: new}
}

func mapChanges(field string, old, new map[string]string) []FieldChange {
	keys := slices.Sorted(maps.Keys(old))
	for k := range new {
		if _, ok := old[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []FieldChange
	for _, k := range keys {
		ov, oldOK := old[k]
		nv, newOK := new[k]
		switch {
		case !oldOK:
			out = append(out, FieldChange{Field: field, Key: k, Op: "add", New: nv})
		case !newOK:
			out = append(out, FieldChange{Field: field, Key: k, Op: "remove", Old: ov})
		case ov != nv:
			out = append(out, FieldChange{Field: field, Key: k, Op: "change", Old: ov, New: nv})
		}
	}
	return out
}

// ports maps each port name to "PROTOCOL port->targetPort" (TCP when the
// protocol is unset, as the API server defaults it).
func ports(ps []corev1.ServicePort) map[string]string {
	out := make(map[string]string, len(ps))
	for _, p := range ps {
		proto := cmp.Or(p.Protocol, corev1.ProtocolTCP)
		out[p.Name] = string(proto) + " " + strconv.Itoa(int(p.Port)) + "->" + p.TargetPort.String()
	}
	return out
}

func serviceType(s *corev1.Service) corev1.ServiceType {
	return cmp.Or(s.Spec.Type, corev1.ServiceTypeClusterIP)
}

func owners(refs []metav1.OwnerReference) string {
	s := make([]string, len(refs))
	for i, r := range refs {
		s[i] = fmt.Sprintf("%s/%s %s", r.Kind, r.Name, r.UID)
	}
	return strings.Join(s, ",")
}
