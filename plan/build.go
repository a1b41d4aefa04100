package plan

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	"github.com/matbus/matbus/matclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Service port names.
const (
	PortRedfish = "redfish" // TCP, always
	PortIPMI    = "ipmi"    // UDP, when MAT advertises IPMI
	PortSSH     = "ssh"     // TCP, when MAT advertises SSH
)

// Desired is what one MAT status asks for: a Service per device that can
// have one, and the devices that get none this time.
type Desired struct {
	// Instance is LabelValue(Instance.Key): Diff only deletes Services
	// carrying this instance label.
	Instance string
	// PodName is LabelValue(Instance.PodName), "" for single-pod
	// deployments: Diff only deletes Services whose LabelPodName equals it
	// (absent when "").
	PodName string
	// NoStatus is set when Build got a nil status: Diff then deletes
	// nothing (a failed fetch must never delete Services).
	NoStatus bool
	// Services are the desired Services, sorted by name, names unique.
	Services []*corev1.Service
	// Held are the devices that get no Service this time, sorted by Name
	// then MatID.
	Held []Hold
}

// Hold is a device of the status that gets no Service this time.
type Hold struct {
	MatID  string     // the device's full mat_id
	Name   string     // the Service name it would get (ServiceName)
	Reason HoldReason // why it gets none
	Detail string     // human-readable specifics, e.g. the winning mat_id
}

// HoldReason says why a device gets no Service. Diff never deletes the
// existing Service of a held device: a device still present is never deleted.
type HoldReason string

const (
	// HoldNoBMCIP: the BMC has no DHCP lease yet (bmc.ip absent). The device
	// gets its Service once it has one.
	HoldNoBMCIP HoldReason = "device has no BMC IP yet"
	// HoldDuplicateBMCIP: another device of the same status reports the same
	// BMC IP, and its mat_id is lexically smaller.
	HoldDuplicateBMCIP HoldReason = "another device reports the same BMC IP"
	// HoldNameCollision: another device's mat_id maps to the same Service
	// name, and its mat_id is lexically smaller.
	HoldNameCollision HoldReason = "another mat_id maps to the same Service name"
)

// Build returns the desired Services for the status st of instance inst.
//
// Every device of st (hosts, their DPUs, switches, power shelves; see
// matclient.Status.Walk) with a BMC IP gets one Service named
// ServiceName(MachineTypeOf(kind), mat_id), in opts.Namespace:
//
//   - labels (values through LabelValue): LabelManagedBy = opts.ManagedBy
//     (default DefaultManagedBy), LabelInstance = inst.Key, LabelMatID,
//     LabelMachineID (when known), LabelMachineType, LabelParentMatID (DPUs:
//     the host's mat_id), LabelPodName (when inst.PodName is set);
//   - annotations: AnnotationMatID (full mat_id), AnnotationBMCIP,
//     AnnotationRedfishPort, AnnotationIPMIPort and AnnotationSSHPort when
//     advertised (listen ports, decimal), AnnotationAPIState,
//     AnnotationPowerState and AnnotationHardwareType when non-empty;
//   - spec: type ClusterIP; ports "redfish" TCP reachable→listen, "ipmi" UDP
//     and "ssh" TCP when advertised; selector = opts.TargetSelector plus
//     PodNameLabel = LabelValue(inst.PodName) when set (a pod name is
//     normally a valid label value and so kept as is); clusterIP = clusterIPs[0] = BMC
//     IP (IPModeClusterIP) or externalIPs = [BMC IP] with clusterIP left to
//     the API server (IPModeExternalIP);
//   - owner references: [*inst.Owner] when set.
//
// Devices that get no Service are returned in Held:
//
//   - no BMC IP yet: HoldNoBMCIP;
//   - same BMC IP as another device of st: the device with the lexically
//     smallest mat_id gets the Service, the others HoldDuplicateBMCIP. This
//     is a pure function of the status (not of which Service exists first),
//     so every worker and every sync decides alike and nothing flaps. Diff
//     keeps an existing Service of a held device, so in IPModeClusterIP a
//     winner that appears after the loser's Service was created cannot be
//     created ("IP already allocated") until the duplicate is resolved in
//     MAT — the conflict is surfaced, never fought over;
//   - same Service name as another device (a 32-bit FNV collision, or a
//     mat_id that occurs twice in a hand-built status): smallest mat_id
//     wins, then the first in body order; the others HoldNameCollision.
//
// A nil st yields a Desired with NoStatus set, which Diff turns into no
// deletes. Build does not retain or modify st or opts.
func Build(inst Instance, st *matclient.Status, opts Options) Desired {
	d := Desired{Instance: LabelValue(inst.Key)}
	if inst.PodName != "" {
		d.PodName = LabelValue(inst.PodName)
	}
	if st == nil {
		d.NoStatus = true
		return d
	}

	type candidate struct {
		dev    *matclient.Device
		parent *matclient.Device
		typ    MachineType
		name   string
		order  int
	}
	var cands []candidate
	order := 0
	st.Walk(func(dev, parent *matclient.Device) {
		typ := MachineTypeOf(dev.Kind)
		name := ServiceName(typ, dev.MatID)
		order++
		if dev.BMC.IP == "" {
			d.Held = append(d.Held, Hold{MatID: dev.MatID, Name: name, Reason: HoldNoBMCIP})
			return
		}
		cands = append(cands, candidate{dev: dev, parent: parent, typ: typ, name: name, order: order})
	})
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.dev.MatID, b.dev.MatID), cmp.Compare(a.order, b.order))
	})

	ipWinner := make(map[string]string, len(cands))   // BMC IP -> mat_id
	nameWinner := make(map[string]string, len(cands)) // name -> mat_id
	shared := newSharedFields(inst, opts)
	d.Services = make([]*corev1.Service, 0, len(cands))
	for _, c := range cands {
		id, ip := c.dev.MatID, c.dev.BMC.IP
		if w, taken := ipWinner[ip]; taken {
			d.Held = append(d.Held, Hold{MatID: id, Name: c.name, Reason: HoldDuplicateBMCIP,
				Detail: "BMC IP " + ip + " is also reported by mat_id " + w + ", which gets the Service"})
			continue
		}
		if w, taken := nameWinner[c.name]; taken {
			detail := "mat_id " + w + " maps to the same name and gets the Service"
			if w == id {
				detail = "mat_id occurs more than once in the status; the first gets the Service"
			}
			d.Held = append(d.Held, Hold{MatID: id, Name: c.name, Reason: HoldNameCollision, Detail: detail})
			continue
		}
		ipWinner[ip] = id
		nameWinner[c.name] = id
		d.Services = append(d.Services, shared.service(c.name, c.typ, c.dev, c.parent))
	}
	slices.SortFunc(d.Services, func(a, b *corev1.Service) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(d.Held, func(a, b Hold) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.MatID, b.MatID))
	})
	return d
}

// sharedFields are the parts of every Service of one Build call.
type sharedFields struct {
	namespace, managedBy, instance, pod string
	mode                                IPMode
	selector                            map[string]string
	owner                               *metav1.OwnerReference
}

func newSharedFields(inst Instance, opts Options) sharedFields {
	s := sharedFields{
		namespace: opts.Namespace,
		managedBy: LabelValue(opts.managedBy()),
		instance:  LabelValue(inst.Key),
		mode:      opts.ipMode(),
		owner:     inst.Owner,
	}
	if inst.PodName != "" {
		s.pod = LabelValue(inst.PodName)
	}
	if len(opts.TargetSelector) > 0 || inst.PodName != "" {
		s.selector = make(map[string]string, len(opts.TargetSelector)+1)
		maps.Copy(s.selector, opts.TargetSelector)
		if inst.PodName != "" {
			s.selector[PodNameLabel] = s.pod
		}
	}
	return s
}

// service builds the Service of one device; every map and slice is fresh.
func (s sharedFields) service(name string, typ MachineType, dev, parent *matclient.Device) *corev1.Service {
	ip := dev.BMC.IP
	labels := map[string]string{
		LabelManagedBy:   s.managedBy,
		LabelInstance:    s.instance,
		LabelMatID:       LabelValue(dev.MatID),
		LabelMachineType: string(typ),
	}
	if dev.MachineID != "" {
		labels[LabelMachineID] = LabelValue(dev.MachineID)
	}
	if typ == MachineTypeDPU && parent != nil {
		labels[LabelParentMatID] = LabelValue(parent.MatID)
	}
	if s.pod != "" {
		labels[LabelPodName] = s.pod
	}

	annotations := map[string]string{
		AnnotationMatID:       dev.MatID,
		AnnotationBMCIP:       ip,
		AnnotationRedfishPort: strconv.Itoa(int(dev.BMC.Redfish.ListenPort)),
	}
	setIf(annotations, AnnotationAPIState, dev.APIState)
	setIf(annotations, AnnotationPowerState, dev.PowerState)
	setIf(annotations, AnnotationHardwareType, dev.HardwareType)

	ports := make([]corev1.ServicePort, 0, 3)
	ports = append(ports, servicePort(PortRedfish, corev1.ProtocolTCP, dev.BMC.Redfish))
	if e := dev.BMC.IPMI; e != nil {
		ports = append(ports, servicePort(PortIPMI, corev1.ProtocolUDP, *e))
		annotations[AnnotationIPMIPort] = strconv.Itoa(int(e.ListenPort))
	}
	if e := dev.BMC.SSH; e != nil {
		ports = append(ports, servicePort(PortSSH, corev1.ProtocolTCP, *e))
		annotations[AnnotationSSHPort] = strconv.Itoa(int(e.ListenPort))
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   s.namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Ports:    ports,
			Selector: maps.Clone(s.selector),
		},
	}
	if s.owner != nil {
		svc.OwnerReferences = []metav1.OwnerReference{*s.owner.DeepCopy()}
	}
	switch s.mode {
	case IPModeExternalIP:
		svc.Spec.ExternalIPs = []string{ip}
	default:
		svc.Spec.ClusterIP = ip
		svc.Spec.ClusterIPs = []string{ip}
	}
	return svc
}

func servicePort(name string, proto corev1.Protocol, e matclient.Endpoint) corev1.ServicePort {
	return corev1.ServicePort{
		Name:       name,
		Protocol:   proto,
		Port:       int32(e.ReachablePort),
		TargetPort: intstr.FromInt32(int32(e.ListenPort)),
	}
}

func setIf(m map[string]string, k, v string) {
	if v != "" {
		m[k] = v
	}
}
