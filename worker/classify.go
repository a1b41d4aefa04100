package worker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Class says what to do about a failed Kubernetes call.
type Class int

const (
	// Transient failures are retried with backoff: timeouts, 429, 5xx,
	// conflicts, connection errors, and a ClusterIP that is still allocated
	// to another Service.
	Transient Class = iota
	// Permanent failures cannot succeed by retrying: 403, 401, invalid
	// objects (e.g. a BMC IP outside the service range), other 4xx.
	Permanent
	// Canceled means the job's context ended (shutdown): the job is left for
	// redelivery and nothing is reported.
	Canceled
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	default:
		return "canceled"
	}
}

// Classifier decides the Class of API errors by HTTP status code and the
// status causes, never by message text. ServiceCIDRs, when known, tell an
// "IP already allocated" 422 (the IP is inside a service range: wait for it
// to be released) from an out-of-range one (permanent).
type Classifier struct {
	// ServiceCIDRs are fixed ranges (--service-cidr).
	ServiceCIDRs []netip.Prefix
	// Ranges, when set, replaces ServiceCIDRs: the ranges listed from the
	// ServiceCIDR objects and listed again when an IP lies outside them.
	Ranges *ServiceRanges
}

// ranges returns the ranges known now, for an IP: listed again first when
// ip lies outside them and they come from the API (see ServiceRanges).
func (c Classifier) ranges(ctx context.Context, ip netip.Addr) []netip.Prefix {
	if c.Ranges != nil {
		return c.Ranges.For(ctx, ip)
	}
	return c.ServiceCIDRs
}

// Classify returns the class of err, seen while writing svc (may be nil),
// and a message for operators. ctx is the job's context.
func (c Classifier) Classify(ctx context.Context, err error, svc *corev1.Service) (Class, string) {
	if err == nil {
		return Transient, ""
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return Canceled, "job context ended"
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		// Transport errors (connection refused while the API server
		// restarts, timeouts, EOF): retry.
		return Transient, err.Error()
	}
	st := status.Status()
	switch {
	case apierrors.IsConflict(err):
		return Transient, "conflict: " + err.Error()
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err), apierrors.IsUnexpectedServerError(err),
		st.Code >= 500:
		return Transient, err.Error()
	case apierrors.IsForbidden(err):
		return Permanent, forbiddenMessage(st, err)
	case apierrors.IsUnauthorized(err):
		return Permanent, "unauthorized: the API server rejected matbus's credentials: " + err.Error()
	case apierrors.IsInvalid(err):
		if ip, ok := clusterIPCause(st, svc); ok {
			cidrs := c.ranges(ctx, ip)
			if inRange(cidrs, ip) {
				return Transient, fmt.Sprintf("cluster IP %s is allocated to another Service: %v", ip, err)
			}
			if len(cidrs) == 0 {
				return Transient, fmt.Sprintf("cluster IP %s refused (service range unknown, retrying): %v", ip, err)
			}
			return Permanent, fmt.Sprintf("cluster IP %s is outside the service range %v (create a ServiceCIDR that covers it, or use --bmc-ip-mode=external-ip): %v", ip, cidrs, err)
		}
		return Permanent, "invalid: " + err.Error()
	}
	return Permanent, err.Error()
}

// OutsideRange reports whether ip is known to lie outside every service
// range: false when the ranges are unknown or ip is not an IP address.
// Listed ranges are listed again first (see ServiceRanges).
func (c Classifier) OutsideRange(ctx context.Context, ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	cidrs := c.ranges(ctx, a)
	return len(cidrs) > 0 && !inRange(cidrs, a)
}

// Prefixes returns the ranges known now, without listing them again.
func (c Classifier) Prefixes() []netip.Prefix {
	if c.Ranges != nil {
		return c.Ranges.Prefixes()
	}
	return c.ServiceCIDRs
}

func inRange(cidrs []netip.Prefix, ip netip.Addr) bool {
	for _, p := range cidrs {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clusterIPCause reports whether a 422 names spec.clusterIP(s) and returns
// the requested IP.
func clusterIPCause(st metav1.Status, svc *corev1.Service) (netip.Addr, bool) {
	if st.Details == nil || svc == nil || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return netip.Addr{}, false
	}
	for _, cause := range st.Details.Causes {
		if cause.Type != metav1.CauseTypeFieldValueInvalid {
			continue
		}
		switch cause.Field {
		case "spec.clusterIP", "spec.clusterIPs", "spec.clusterIPs[0]":
			ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
			return ip, err == nil
		}
	}
	return netip.Addr{}, false
}

func forbiddenMessage(st metav1.Status, err error) string {
	what := "the requested operation"
	if st.Details != nil {
		what = fmt.Sprintf("%s %q", st.Details.Kind, st.Details.Name)
	}
	return fmt.Sprintf("forbidden: matbus's ServiceAccount lacks the RBAC permission for %s (grant get/list/watch/create/update/patch/delete on services and get on deployments in the target namespace): %v", what, err)
}

// ParseCIDRs parses comma-free CIDR strings, e.g. from --service-cidr.
func ParseCIDRs(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("worker: service CIDR %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ServiceCIDRs lists the cluster's service IP ranges from its ServiceCIDR
// objects (networking.k8s.io/v1) that are not being deleted, masked, in the
// API's order. An empty
// list with a nil error means the cluster has no such objects; the error
// is the API's (e.g. forbidden, or an API server without ServiceCIDRs).
func ServiceCIDRs(ctx context.Context, kube kubernetes.Interface) ([]netip.Prefix, error) {
	list, err := kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, sc := range list.Items {
		if sc.DeletionTimestamp != nil {
			continue // being deleted: the API server allocates nothing new from it
		}
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out, nil
}
