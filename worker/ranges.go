package worker

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// DefaultRangesRelist is the least time between two lists of the
// ServiceCIDR objects by a ServiceRanges.
const DefaultRangesRelist = 10 * time.Second

// ServiceRanges are the cluster's service IP ranges listed from its
// ServiceCIDR objects (networking.k8s.io/v1, cluster-scoped: list needs a
// ClusterRole), kept fresh without a watch: asked about an IP that lies
// outside them, it lists them again first, at most once per Relist. So a
// ServiceCIDR that an operator creates after the worker started covers the
// next write that needs it, without a restart. A failed list keeps the
// ranges of the last good one (none: unknown). Safe for concurrent use.
type ServiceRanges struct {
	list   func(context.Context) ([]netip.Prefix, error)
	relist time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	cur    []netip.Prefix
	listed time.Time // of the last attempt
	failed bool      // the last attempt failed (logged once per failure run)
}

// ListServiceRanges lists the ServiceCIDR objects through kube within 5 s
// and returns ranges that list them again as described on ServiceRanges.
// It logs the ranges, or why they are unknown (then a refused cluster IP is
// retried rather than reported as out of range).
func ListServiceRanges(ctx context.Context, kube kubernetes.Interface, log *slog.Logger) *ServiceRanges {
	r := &ServiceRanges{
		list:   func(ctx context.Context) ([]netip.Prefix, error) { return ServiceCIDRs(ctx, kube) },
		relist: DefaultRangesRelist,
		log:    log,
	}
	r.refresh(ctx)
	return r
}

// Prefixes returns the ranges of the last good list (nil: unknown).
func (r *ServiceRanges) Prefixes() []netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.cur)
}

// For returns the ranges to judge ip by: the known ones when they contain
// ip, else those of a fresh list when the last list is at least Relist old.
func (r *ServiceRanges) For(ctx context.Context, ip netip.Addr) []netip.Prefix {
	r.mu.Lock()
	in := inRange(r.cur, ip)
	due := time.Since(r.listed) >= r.relist
	r.mu.Unlock()
	if !in && due {
		r.refresh(ctx)
	}
	return r.Prefixes()
}

func (r *ServiceRanges) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := r.list(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listed = time.Now()
	if err != nil {
		if !r.failed {
			r.log.Info("service range not listed (set --service-cidr, or allow list on servicecidrs); a refused cluster IP is retried", "error", err, "known", r.cur)
		}
		r.failed = true
		return
	}
	if r.failed || !slices.Equal(out, r.cur) {
		r.log.Info("service range", "cidrs", out)
	}
	r.failed = false
	r.cur = out
}
