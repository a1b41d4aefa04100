package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderConfig configures leader election on a coordination.k8s.io Lease.
type LeaderConfig struct {
	Namespace, LeaseName, Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as in client-go;
	// defaults 15 s, 10 s and 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// RunLeaderElected runs lead whenever this process holds the Lease and
// cancels lead's context when it loses it; it campaigns again after a loss.
// It returns when ctx ends (releasing the Lease), or an error for an
// invalid configuration.
func RunLeaderElected(ctx context.Context, kube kubernetes.Interface, cfg LeaderConfig, log *slog.Logger, lead func(ctx context.Context)) error {
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = 10 * time.Second
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	if cfg.Namespace == "" || cfg.LeaseName == "" || cfg.Identity == "" {
		return fmt.Errorf("discovery: leader election needs namespace, lease name and identity")
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1ObjectMeta(cfg.Namespace, cfg.LeaseName),
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline,
			RetryPeriod: cfg.RetryPeriod, ReleaseOnCancel: true, Name: cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					log.Info("leading", "lease", cfg.Namespace+"/"+cfg.LeaseName, "identity", cfg.Identity)
					lead(ctx)
				},
				OnStoppedLeading: func() { log.Info("not leading", "identity", cfg.Identity) },
				OnNewLeader: func(id string) {
					if id != cfg.Identity {
						log.Info("following", "leader", id)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("discovery: leader election: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}

func metav1ObjectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
