package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// IPMode says where the BMC IP goes in a Service spec (`--bmc-ip-mode`).
type IPMode string

const (
	// IPModeClusterIP puts the BMC IP into spec.clusterIP (and
	// spec.clusterIPs), as the first polling controller did. spec.clusterIP is
	// immutable, so a changed BMC IP means delete + create (Plan.Recreate).
	// The BMC IP must lie inside the cluster's service CIDR.
	IPModeClusterIP IPMode = "cluster-ip"
	// IPModeExternalIP puts the BMC IP into spec.externalIPs = [ip] and
	// leaves spec.clusterIP to the API server, as later versions of the
	// polling controller did (BMC ranges often lie outside the service CIDR).
	IPModeExternalIP IPMode = "external-ip"
)

// ParseIPMode parses a `--bmc-ip-mode` value: "cluster-ip" or
// "external-ip" (case-insensitive, surrounding blanks ignored). Anything
// else, including "", is an error naming the accepted values.
func ParseIPMode(s string) (IPMode, error) {
	switch m := IPMode(strings.ToLower(strings.TrimSpace(s))); m {
	case IPModeClusterIP, IPModeExternalIP:
		return m, nil
	}
	return "", fmt.Errorf("plan: invalid BMC IP mode %q: want %q or %q", s, IPModeClusterIP, IPModeExternalIP)
}

// String returns the mode as written on the command line.
func (m IPMode) String() string { return string(m) }

// Instance is the MAT instance a status came from.
type Instance struct {
	// Key is "<namespace>.<service-name>" of the discovered MAT Service, or
	// the name of a static instance. It goes into LabelInstance through
	// LabelValue.
	Key string
	// PodName is the MAT pod the status came from in a multi-pod
	// deployment, "" otherwise. When set, LabelValue(PodName) is added to
	// the selector (under PodNameLabel) and to LabelPodName, and Diff only
	// deletes Services of this pod: Services of a pod that is gone for good
	// are the caller's to delete (list by InstanceSelector and LabelPodName).
	PodName string
	// Owner is the MAT Deployment (the discovered Service name without
	// `-bmc-mock`), put on every Service so that Kubernetes garbage-collects
	// them with it; nil when unknown (static runs).
	Owner *metav1.OwnerReference
}

// Options are the settings of one matbus deployment that shape Services.
type Options struct {
	// Namespace is where Services are created. Diff ignores existing
	// Services whose (non-empty) namespace differs.
	Namespace string
	// ManagedBy is the value of LabelManagedBy; "" means DefaultManagedBy.
	// Only Services carrying this value are ever changed or deleted.
	ManagedBy string
	// IPMode is where the BMC IP goes; anything but IPModeExternalIP
	// (including "") means IPModeClusterIP. Use ParseIPMode to validate.
	IPMode IPMode
	// TargetSelector selects the MAT pods that serve the BMCs; the pod name
	// is added under PodNameLabel for multi-pod deployments. Copied, never
	// retained.
	TargetSelector map[string]string
	// StateAnnotations puts AnnotationAPIState and AnnotationPowerState on
	// BMC Services (`--enable-state-annotations`, on by default in the
	// worker: the old controller writes them). They change whenever a
	// simulated machine powers on or off, so each flip costs a Service
	// write; off, Build leaves them out and Diff removes them from Services
	// that still carry them.
	StateAnnotations bool
}

// DefaultTargetSelector is the old polling controller's selector of the MAT
// pods (`--target-selector`), so that Services it wrote keep their
// endpoints when matbus adopts them.
const DefaultTargetSelector = "app.kubernetes.io/name=nico-machine-a-tron"

// DefaultManagedBy is the old polling controller's managed-by value, so that
// its Services are adopted without churn.
const DefaultManagedBy = "mat-k8s-controller"

func (o Options) managedBy() string {
	if o.ManagedBy == "" {
		return DefaultManagedBy
	}
	return o.ManagedBy
}

// Fingerprint identifies what of o shapes the Services Build and Diff
// write: the namespace, the managed-by value, the IP mode, the target
// selector and StateAnnotations, each as Build and Diff read them (""
// and DefaultManagedBy are one managed-by; "" and IPModeClusterIP one
// mode). It is 12 lowercase hex digits of a SHA-256 over them. Two
// workers with the same fingerprint write every Service alike; two with
// different ones may undo each other's writes.
func (o Options) Fingerprint() string {
	var b strings.Builder
	fmt.Fprintf(&b, "namespace=%q\nmanaged-by=%q\nip-mode=%q\nstate-annotations=%t\n", o.Namespace, o.managedBy(), o.ipMode(), o.StateAnnotations)
	for _, k := range slices.Sorted(maps.Keys(o.TargetSelector)) {
		fmt.Fprintf(&b, "selector %q=%q\n", k, o.TargetSelector[k])
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:6])
}

// ipMode is IPModeExternalIP when set so, else IPModeClusterIP (the zero
// value and anything ParseIPMode would reject).
func (o Options) ipMode() IPMode {
	if o.IPMode == IPModeExternalIP {
		return IPModeExternalIP
	}
	return IPModeClusterIP
}

// Label and annotation keys written on every Service (see Build).
//
// The Service is a public contract: users, scripts, dashboards and other
// controllers select and read these Services by the old polling
// controller's keys (prefix "nvidia-infra-controller/"), so those keys carry
// exactly its values. matbus's own facts are additions under "matbus.io/"
// (docs/adr/0014-old-controller-service-contract.md), never instead.
const (
	// LabelManagedBy marks the Services matbus may change or delete; its
	// value is Options.ManagedBy (default DefaultManagedBy, the old
	// controller's).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// LabelMatID is LabelValue(mat_id): the mat_id itself when it is a
	// valid label value (every UUID), else a stable hashed form (the old
	// controller's create failed for those).
	LabelMatID = "nvidia-infra-controller/mat-id"
	// LabelMachineID is LabelValue(machine_id), when MAT knows it.
	LabelMachineID = "nvidia-infra-controller/mat-machine-id"
	// LabelMachineType is "host", "dpu" or "nvos", as the old controller
	// writes it: switches and power shelves are "host" (LabelDeviceKind has
	// the finer kind).
	LabelMachineType = "nvidia-infra-controller/mat-machine-type"
	// LabelParentID is LabelValue(the host's mat_id), DPUs only.
	LabelParentID = "nvidia-infra-controller/mat-parent-id"

	// LabelInstance (addition) is LabelValue(Instance.Key): which MAT
	// instance the Service belongs to (InstanceSelector).
	LabelInstance = "matbus.io/instance"
	// LabelDeviceKind (addition) is the finer machine type: host, dpu,
	// switch, power-shelf or nvos.
	LabelDeviceKind = "matbus.io/machine-type"
	// LabelPodName (addition) is LabelValue(Instance.PodName), when set.
	LabelPodName = "matbus.io/pod-name"

	// PodNameLabel is the selector key for the MAT pod name.
	PodNameLabel = "nvidia-infra-controller/pod-name"

	// AnnotationBMCIP is the BMC IP (BMC Services).
	AnnotationBMCIP = "nvidia-infra-controller/mat-bmc-ip"
	// AnnotationNVOSIP is the switch's NVOS IP (NVOS Services only).
	AnnotationNVOSIP = "nvidia-infra-controller/mat-nvos-ip"
	// AnnotationAPIState is MAT's api_state, when non-empty and
	// Options.StateAnnotations.
	AnnotationAPIState = "nvidia-infra-controller/mat-api-state"
	// AnnotationPowerState is MAT's power_state, when non-empty and
	// Options.StateAnnotations.
	AnnotationPowerState = "nvidia-infra-controller/mat-power-state"
	// AnnotationHardwareType is MAT's hardware_type, when non-empty.
	AnnotationHardwareType = "nvidia-infra-controller/mat-hardware-type"
	// AnnotationRedfishPort is the Redfish listen port (decimal).
	AnnotationRedfishPort = "nvidia-infra-controller/mat-redfish-listen-port"
	// AnnotationIPMIPort is the IPMI listen port, when IPMI is in the Service.
	AnnotationIPMIPort = "nvidia-infra-controller/mat-ipmi-listen-port"
	// AnnotationSSHPort is the SSH listen port, when SSH is in the Service.
	AnnotationSSHPort = "nvidia-infra-controller/mat-ssh-listen-port"
	// AnnotationMatID (addition) is the full mat_id, always (LabelMatID may
	// be hashed).
	AnnotationMatID = "matbus.io/mat-id"
)

// Keys that matbus versions before the contract wrote instead of the old
// controller's. Diff owns them, so a Service that still carries them is
// updated in place (same UID) to the contract at its next sync: they are
// removed, the contract keys written.
const (
	legacyLabelMatID      = "matbus.io/mat-id"
	legacyLabelMachineID  = "matbus.io/machine-id"
	legacyLabelParentID   = "matbus.io/parent-mat-id"
	legacyAnnBMCIP        = "matbus.io/bmc-ip"
	legacyAnnNVOSIP       = "matbus.io/nvos-ip"
	legacyAnnAPIState     = "matbus.io/api-state"
	legacyAnnPowerState   = "matbus.io/power-state"
	legacyAnnHardwareType = "matbus.io/hardware-type"
	legacyAnnRedfishPort  = "matbus.io/redfish-listen-port"
	legacyAnnIPMIPort     = "matbus.io/ipmi-listen-port"
	legacyAnnSSHPort      = "matbus.io/ssh-listen-port"
)

// ourLabelKeys and ourAnnotationKeys are the keys plan owns on a Service:
// Diff compares exactly these and removes the ones the desired Service does
// not carry; every other key is foreign and kept.
var (
	ourLabelKeys = []string{
		LabelManagedBy, LabelMatID, LabelMachineID, LabelMachineType, LabelParentID,
		LabelInstance, LabelDeviceKind, LabelPodName,
		legacyLabelMatID, legacyLabelMachineID, legacyLabelParentID,
	}
	ourAnnotationKeys = []string{
		AnnotationBMCIP, AnnotationNVOSIP, AnnotationAPIState, AnnotationPowerState, AnnotationHardwareType,
		AnnotationRedfishPort, AnnotationIPMIPort, AnnotationSSHPort, AnnotationMatID,
		legacyAnnBMCIP, legacyAnnNVOSIP, legacyAnnAPIState, legacyAnnPowerState, legacyAnnHardwareType,
		legacyAnnRedfishPort, legacyAnnIPMIPort, legacyAnnSSHPort,
	}
)

// InstanceSelector selects the Services of one MAT instance:
// managed-by=<opts.ManagedBy or DefaultManagedBy>,
// matbus.io/instance=LabelValue(key). Use it to list what Diff needs, and to
// delete everything of an instance that is gone. It does not see the old
// controller's Services (no instance label); Diff adopts those when they
// are passed in.
func InstanceSelector(opts Options, key string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{
		LabelManagedBy: LabelValue(opts.managedBy()),
		LabelInstance:  LabelValue(key),
	})
}

// ParseTargetSelector parses a target selector, "k=v[,k2=v2]", into its
// labels; empty items are skipped. The error names the item that is not
// key=value.
func ParseTargetSelector(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("selector item %q: want key=value", kv)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}
