package plan

import (
	"fmt"
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
	// BMC Services (`--enable-state-annotations`). They change whenever a
	// simulated machine powers on or off, so each flip costs a Service
	// write; off (the default), Build leaves them out and Diff removes them
	// from Services that still carry them.
	StateAnnotations bool
}

// DefaultManagedBy is the old polling controller's managed-by value, so that
// its Services are adopted without churn.
const DefaultManagedBy = "mat-k8s-controller"

func (o Options) managedBy() string {
	if o.ManagedBy == "" {
		return DefaultManagedBy
	}
	return o.ManagedBy
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
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	LabelInstance    = "matbus.io/instance"      // LabelValue(Instance.Key)
	LabelMatID       = "matbus.io/mat-id"        // LabelValue(mat_id)
	LabelMachineID   = "matbus.io/machine-id"    // LabelValue(machine_id), when known
	LabelMachineType = "matbus.io/machine-type"  // host, dpu, switch, power-shelf, nvos
	LabelParentMatID = "matbus.io/parent-mat-id" // LabelValue(host mat_id), DPUs only
	LabelPodName     = "matbus.io/pod-name"      // LabelValue(Instance.PodName), when set

	// PodNameLabel is the selector key for the MAT pod name.
	PodNameLabel = "nvidia-infra-controller/pod-name"

	AnnotationBMCIP        = "matbus.io/bmc-ip"
	AnnotationNVOSIP       = "matbus.io/nvos-ip"       // NVOS Services only
	AnnotationAPIState     = "matbus.io/api-state"     // when non-empty and Options.StateAnnotations
	AnnotationPowerState   = "matbus.io/power-state"   // when non-empty and Options.StateAnnotations
	AnnotationHardwareType = "matbus.io/hardware-type" // when non-empty
	AnnotationRedfishPort  = "matbus.io/redfish-listen-port"
	AnnotationIPMIPort     = "matbus.io/ipmi-listen-port" // when IPMI is advertised
	AnnotationSSHPort      = "matbus.io/ssh-listen-port"  // when SSH is advertised
	// AnnotationMatID is the full mat_id, always (label values may be hashed).
	AnnotationMatID = "matbus.io/mat-id"
)

// ourLabelKeys and ourAnnotationKeys are the keys plan owns on a Service:
// Diff compares exactly these and removes the ones the desired Service does
// not carry; every other key is foreign and kept.
var (
	ourLabelKeys = []string{
		LabelManagedBy, LabelInstance, LabelMatID, LabelMachineID,
		LabelMachineType, LabelParentMatID, LabelPodName,
	}
	ourAnnotationKeys = []string{
		AnnotationBMCIP, AnnotationNVOSIP, AnnotationAPIState, AnnotationPowerState, AnnotationHardwareType,
		AnnotationRedfishPort, AnnotationIPMIPort, AnnotationSSHPort, AnnotationMatID,
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
