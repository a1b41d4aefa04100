package plan

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

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
	PortNMXC    = "nmxc"    // TCP, NVOS Services only
)

// NMXCPort is the Service port of "nmxc" on an NVOS Service; its target
// is the switch's Redfish listen port.
const NMXCPort = 9370

// ServiceIP returns the IP a desired Service (from Build) is for: its
// AnnotationNVOSIP when set (an NVOS Service), else its AnnotationBMCIP;
// "" when neither is set.
func ServiceIP(svc *corev1.Service) string {
	if ip := svc.Annotations[AnnotationNVOSIP]; ip != "" {
		return ip
	}
	return svc.Annotations[AnnotationBMCIP]
}

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
	// Held are the devices that get no Service this time, sorted by Name,
	// MatID, then Detail.
	Held []Hold
	// ForeignIPs are BMC and NVOS IPs that other instances publish, each
	// with who publishes it (e.g. `Service mat-bmc-host-x of instance
	// "ns.mat-b"`). Build leaves it nil; the caller sets it before Diff from
	// what it knows of the other instances (their Services' IP
	// annotations). In IPModeExternalIP, Diff recreates a Service whose
	// allocated spec.clusterIP is one of them, as for the IPs of this
	// status: that device's traffic would reach the wrong Service.
	ForeignIPs map[string]string
	// Warnings are the devices that get a Service, but not all of what MAT
	// advertises for them (e.g. an endpoint left out), one per device,
	// sorted by Name then MatID.
	Warnings []Warning
}

// DeletesHeld reports whether Diff deletes nothing for d: when Build got no
// status (NoStatus), or a device of the status is invalid (a Held entry
// with HoldInvalidDevice), so that a device that could not be read is never
// taken for a device that is gone.
func (d Desired) DeletesHeld() bool {
	if d.NoStatus {
		return true
	}
	for _, h := range d.Held {
		if h.Reason == HoldInvalidDevice {
			return true
		}
	}
	return false
}

// Warning is a device that gets a Service, but not exactly what MAT
// advertises for it.
type Warning struct {
	MatID  string // the device's full mat_id
	Name   string // its Service name
	Detail string // what was left out and why, e.g. "ssh TCP port 443 (listen 2222) left out: redfish uses TCP port 443"
}

// Hold is a device of the status that gets no Service this time.
type Hold struct {
	MatID  string     // the device's full mat_id; "" for an invalid device without one
	Name   string     // the Service name it would get (ServiceName, or NVOSServiceName); "" when MatID is ""
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
	// BMC IP, or an NVOS IP equal to it (BMC and NVOS IPs share one
	// policy), and its mat_id is lexically smaller; within one switch, the
	// BMC Service wins over the NVOS Service.
	HoldDuplicateBMCIP HoldReason = "another device reports the same IP"
	// HoldNameCollision: another device's mat_id maps to the same Service
	// name, and its mat_id is lexically smaller.
	HoldNameCollision HoldReason = "another mat_id maps to the same Service name"
	// HoldInvalidDevice: the device has an invalid field, an invalid host
	// or a mat_id that occurs more than once (matclient.Status.Invalid).
	// Detail is "<path>: <reason>", e.g. `machines[3].dpus[0]: bmc.ip:
	// "x" is not an IPv4 address`. While a status has one, Diff deletes
	// nothing of the instance (Desired.DeletesHeld).
	HoldInvalidDevice HoldReason = "device is invalid in the status"
)

// Build returns the desired Services for the status st of instance inst.
//
// Every device of st (hosts, their DPUs, switches, power shelves; see
// matclient.Status.Walk) with a BMC IP gets one Service named
// ServiceName(MachineTypeOf(kind), mat_id), in opts.Namespace:
//
//   - labels (values through LabelValue): LabelManagedBy = opts.ManagedBy
//     (default DefaultManagedBy), LabelMatID, LabelMachineID (when known),
//     LabelMachineType (the ContractType: host, dpu), LabelParentID (DPUs:
//     the host's mat_id); and matbus's additions LabelInstance = inst.Key,
//     LabelDeviceKind (host, dpu, switch, power-shelf), LabelPodName (when
//     inst.PodName is set);
//   - annotations: AnnotationMatID (full mat_id), AnnotationBMCIP,
//     AnnotationRedfishPort, AnnotationIPMIPort and AnnotationSSHPort when
//     the port is in the Service (listen ports, decimal),
//     AnnotationHardwareType when non-empty, AnnotationAPIState and
//     AnnotationPowerState when non-empty and opts.StateAnnotations is set;
//   - spec: type ClusterIP; ports "redfish" TCP reachable→listen, "ipmi" UDP
//     and "ssh" TCP when advertised; selector = opts.TargetSelector plus
//     PodNameLabel = LabelValue(inst.PodName) when set (a pod name is
//     normally a valid label value and so kept as is); clusterIP =
//     clusterIPs[0] = BMC IP (IPModeClusterIP) or externalIPs = [BMC IP]
//     with clusterIP left to the API server (IPModeExternalIP);
//   - ports the API server would reject: an endpoint whose protocol and
//     reachable port (the Service port) are those of an earlier one, in the
//     order redfish, ipmi, ssh (e.g. SSH on TCP 443 beside Redfish), is left
//     out with its annotation, and the device gets one Warning saying what
//     was left out. Two ports with the same targetPort are valid (the API
//     server accepts them) and kept; ipmi (UDP) never clashes with the TCP
//     ports;
//   - owner references: [*inst.Owner] when set.
//
// A switch (device kind switch) with an NVOS IP also gets an NVOS Service
// named NVOSServiceName(mat_id), whether or not its BMC has an IP: the same
// labels with LabelMachineType and LabelDeviceKind "nvos" and no
// LabelMachineID or LabelParentID; annotations AnnotationMatID, AnnotationNVOSIP and
// AnnotationHardwareType (when non-empty); one port "nmxc" TCP NMXCPort
// (9370) → the Redfish listen port; the NVOS IP placed like a BMC IP per
// mode; the same selector and owner. Other devices that report an NVOS IP
// get none.
//
// Devices that get no Service are returned in Held:
//
//   - no BMC IP yet: HoldNoBMCIP;
//   - same BMC IP as another device of st (BMC and NVOS IPs are one pool):
//     the device with the lexically smallest mat_id gets the Service (a
//     switch's BMC Service before its own NVOS Service), the others
//     HoldDuplicateBMCIP. This
//     is a pure function of the status (not of which Service exists first),
//     so every worker and every sync decides alike and nothing flaps. Diff
//     keeps an existing Service of a held device, so in IPModeClusterIP a
//     winner that appears after the loser's Service was created cannot be
//     created ("IP already allocated") until the duplicate is resolved in
//     MAT — the conflict is surfaced, never fought over;
//   - same Service name as another device (a hash collision, see
//     ServiceName, or a mat_id that occurs twice in a hand-built status):
//     smallest mat_id wins, then the first in body order; the others
//     HoldNameCollision;
//   - every entry of st.Invalid (a device matclient could not read):
//     HoldInvalidDevice, Name = ServiceName of its mat_id as a DPU (nested)
//     or host ("" without a mat_id), Detail = "<path>: <reason>". Its
//     existing Service is neither updated nor deleted, and Diff deletes
//     nothing of the instance while such a hold exists; the valid devices
//     are created, updated and recreated as usual.
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

	cands, noIP := candidates(st)
	d.Held = append(d.Held, noIP...)
	d.Held = append(d.Held, invalidHolds(st)...)

	type ipUse struct {
		matID string
		nvos  bool
	}
	ipWinner := make(map[string]ipUse, len(cands))    // BMC or NVOS IP -> its user
	nameWinner := make(map[string]string, len(cands)) // name -> mat_id
	shared := newSharedFields(inst, opts)
	d.Services = make([]*corev1.Service, 0, len(cands))
	for _, c := range cands {
		id, ip := c.dev.MatID, c.ip
		if w, taken := ipWinner[ip]; taken {
			what, as := "BMC IP", "BMC IP"
			if c.typ == MachineTypeNVOS {
				what = "NVOS IP"
			}
			if w.nvos {
				as = "NVOS IP"
			}
			who := "mat_id " + w.matID
			if w.matID == id {
				who = "the same device"
			}
			d.Held = append(d.Held, Hold{MatID: id, Name: c.name, Reason: HoldDuplicateBMCIP,
				Detail: what + " " + ip + " is also reported by " + who + " as its " + as + ", which gets the Service"})
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
		ipWinner[ip] = ipUse{matID: id, nvos: c.typ == MachineTypeNVOS}
		nameWinner[c.name] = id
		if c.typ == MachineTypeNVOS {
			d.Services = append(d.Services, shared.nvosService(c.name, c.dev))
			continue
		}
		svc, left := shared.service(c.name, c.typ, c.dev, c.parent)
		d.Services = append(d.Services, svc)
		if left != "" {
			d.Warnings = append(d.Warnings, Warning{MatID: id, Name: c.name, Detail: left})
		}
	}
	slices.SortFunc(d.Services, func(a, b *corev1.Service) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(d.Held, func(a, b Hold) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.MatID, b.MatID), cmp.Compare(a.Detail, b.Detail))
	})
	slices.SortFunc(d.Warnings, func(a, b Warning) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.MatID, b.MatID))
	})
	return d
}

// candidate is a Service that Build may make: a device's BMC Service, or
// a switch's NVOS Service.
type candidate struct {
	dev    *matclient.Device
	parent *matclient.Device
	typ    MachineType // MachineTypeNVOS for a switch's NVOS Service
	name   string
	ip     string // BMC IP, or NVOS IP
	order  int
}

// candidates returns the Services of st's devices that have an IP, by
// mat_id, a device's BMC Service before its NVOS Service, then body order;
// and a HoldNoBMCIP for each device without a BMC IP, in body order.
func candidates(st *matclient.Status) ([]candidate, []Hold) {
	var cands []candidate
	var held []Hold
	order := 0
	st.Walk(func(dev, parent *matclient.Device) {
		typ := MachineTypeOf(dev.Kind)
		name := ServiceName(typ, dev.MatID)
		order++
		if dev.BMC.IP == "" {
			held = append(held, Hold{MatID: dev.MatID, Name: name, Reason: HoldNoBMCIP})
		} else {
			cands = append(cands, candidate{dev: dev, parent: parent, typ: typ, name: name, ip: dev.BMC.IP, order: order})
		}
		if dev.Kind == matclient.KindSwitch && dev.NvosIP != "" {
			cands = append(cands, candidate{dev: dev, typ: MachineTypeNVOS, name: NVOSServiceName(dev.MatID), ip: dev.NvosIP, order: order})
		}
	})
	isNVOS := func(c candidate) int {
		if c.typ == MachineTypeNVOS {
			return 1
		}
		return 0
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.dev.MatID, b.dev.MatID), cmp.Compare(isNVOS(a), isNVOS(b)), cmp.Compare(a.order, b.order))
	})
	return cands, held
}

// invalidHolds returns a HoldInvalidDevice for each entry of st.Invalid,
// named as the Service of its mat_id as a DPU (nested) or host.
func invalidHolds(st *matclient.Status) []Hold {
	var held []Hold
	for _, inv := range st.Invalid {
		h := Hold{MatID: inv.MatID, Reason: HoldInvalidDevice, Detail: inv.Path + ": " + inv.Reason}
		if inv.MatID != "" {
			typ := MachineTypeHost
			if inv.Nested() {
				typ = MachineTypeDPU
			}
			h.Name = ServiceName(typ, inv.MatID)
		}
		held = append(held, h)
	}
	return held
}

// sharedFields are the parts of every Service of one Build call.
type sharedFields struct {
	namespace, managedBy, instance, pod string
	mode                                IPMode
	state                               bool // Options.StateAnnotations
	selector                            map[string]string
	owner                               *metav1.OwnerReference
}

func newSharedFields(inst Instance, opts Options) sharedFields {
	s := sharedFields{
		namespace: opts.Namespace,
		managedBy: LabelValue(opts.managedBy()),
		instance:  LabelValue(inst.Key),
		mode:      opts.ipMode(),
		state:     opts.StateAnnotations,
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
// left says which advertised endpoints were left out and why ("" when
// none).
func (s sharedFields) service(name string, typ MachineType, dev, parent *matclient.Device) (svc *corev1.Service, left string) {
	ip := dev.BMC.IP
	labels := map[string]string{
		LabelManagedBy:   s.managedBy,
		LabelInstance:    s.instance,
		LabelMatID:       LabelValue(dev.MatID),
		LabelMachineType: typ.ContractType(),
		LabelDeviceKind:  string(typ),
	}
	if dev.MachineID != "" {
		labels[LabelMachineID] = LabelValue(dev.MachineID)
	}
	if typ == MachineTypeDPU && parent != nil {
		labels[LabelParentID] = LabelValue(parent.MatID)
	}
	if s.pod != "" {
		labels[LabelPodName] = s.pod
	}

	annotations := map[string]string{
		AnnotationMatID:       dev.MatID,
		AnnotationBMCIP:       ip,
		AnnotationRedfishPort: strconv.Itoa(int(dev.BMC.Redfish.ListenPort)),
	}
	if s.state {
		setIf(annotations, AnnotationAPIState, dev.APIState)
		setIf(annotations, AnnotationPowerState, dev.PowerState)
	}
	setIf(annotations, AnnotationHardwareType, dev.HardwareType)

	ports, left := servicePorts(dev.BMC)
	for _, p := range ports {
		switch p.Name {
		case PortIPMI:
			annotations[AnnotationIPMIPort] = strconv.Itoa(int(dev.BMC.IPMI.ListenPort))
		case PortSSH:
			annotations[AnnotationSSHPort] = strconv.Itoa(int(dev.BMC.SSH.ListenPort))
		}
	}

	return s.object(name, ip, labels, annotations, ports), left
}

// nvosService builds the NVOS Service of switch dev: its NVOS IP, one TCP
// port "nmxc" NMXCPort → the Redfish listen port.
func (s sharedFields) nvosService(name string, dev *matclient.Device) *corev1.Service {
	labels := map[string]string{
		LabelManagedBy:   s.managedBy,
		LabelInstance:    s.instance,
		LabelMatID:       LabelValue(dev.MatID),
		LabelMachineType: MachineTypeNVOS.ContractType(),
		LabelDeviceKind:  string(MachineTypeNVOS),
	}
	if s.pod != "" {
		labels[LabelPodName] = s.pod
	}
	annotations := map[string]string{
		AnnotationMatID:  dev.MatID,
		AnnotationNVOSIP: dev.NvosIP,
	}
	setIf(annotations, AnnotationHardwareType, dev.HardwareType)
	ports := []corev1.ServicePort{{
		Name:       PortNMXC,
		Protocol:   corev1.ProtocolTCP,
		Port:       NMXCPort,
		TargetPort: intstr.FromInt32(int32(dev.BMC.Redfish.ListenPort)),
	}}
	return s.object(name, dev.NvosIP, labels, annotations, ports)
}

// object is the Service name with the given metadata and ports, the shared
// selector and owner, and ip placed per mode. It retains labels,
// annotations and ports.
func (s sharedFields) object(name, ip string, labels, annotations map[string]string, ports []corev1.ServicePort) *corev1.Service {
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

// servicePorts returns the Service ports of b in the order redfish, ipmi,
// ssh, leaving out an endpoint whose name, or protocol and port, is taken
// by an earlier one (the API server rejects both), and says what it left
// out ("" when nothing).
func servicePorts(b matclient.BMC) (ports []corev1.ServicePort, left string) {
	type endpoint struct {
		name  string
		proto corev1.Protocol
		e     *matclient.Endpoint
	}
	eps := []endpoint{{PortRedfish, corev1.ProtocolTCP, &b.Redfish}, {PortIPMI, corev1.ProtocolUDP, b.IPMI}, {PortSSH, corev1.ProtocolTCP, b.SSH}}
	ports = make([]corev1.ServicePort, 0, len(eps))
	var out []string
	for _, ep := range eps {
		if ep.e == nil {
			continue
		}
		p := servicePort(ep.name, ep.proto, *ep.e)
		i := slices.IndexFunc(ports, func(q corev1.ServicePort) bool {
			return q.Name == p.Name || q.Protocol == p.Protocol && q.Port == p.Port
		})
		if i >= 0 {
			out = append(out, fmt.Sprintf("%s %s port %d (listen %d) left out: %s uses %s port %d",
				p.Name, p.Protocol, p.Port, ep.e.ListenPort, ports[i].Name, ports[i].Protocol, ports[i].Port))
			continue
		}
		ports = append(ports, p)
	}
	return ports, strings.Join(out, "; ")
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
