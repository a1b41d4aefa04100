package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"

	"github.com/matbus/matbus/events"
)

// LeaderConfig configures leader election on a coordination.k8s.io Lease.
type LeaderConfig struct {
	Namespace, LeaseName, Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as in client-go;
	// defaults 15 s, 10 s and 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Margin is how much sooner than LeaseDuration after its last renew
	// was sent a leader stops acting (see Term), and how late a timer may
	// fire before the process counts it as paused and steps down; default
	// LeaseDuration − RenewDeadline (5 s with the defaults), at most half
	// the LeaseDuration.
	Margin time.Duration
	// OwnerDeployment, when set, names the Deployment (in Namespace) that
	// owns the Lease: a Lease this process creates, or holds without that
	// owner, gets an owner reference to it (apps/v1 Deployment, its UID read
	// when the Lease is written), so deleting the Deployment (helm
	// uninstall) lets the garbage collector delete the Lease. A Deployment
	// that cannot be read is logged and the Lease is written without owner:
	// leading matters more than clean-up.
	OwnerDeployment string
	// Bus, when set, is read when this process creates the Lease (none
	// exists, e.g. it was deleted): the first term starts one above the
	// newest term of the Lease on the instances stream, so workers that
	// saw the old Lease's terms do not refuse the new one's messages.
	Bus *events.Bus
}

// RunLeaderElected runs lead whenever this process holds the Lease and
// cancels lead's context when it loses it; it campaigns again after a loss,
// once lead has returned. lead is given the term: every publish of the
// leader checks it (Publisher.Lead), and a term that may have passed to
// another process (its last renew older than LeaseDuration − Margin, a
// detected pause, the Lease read with another holder) steps down at once:
// lead's context ends and the Lease is released. It returns when ctx ends
// (releasing the Lease), or an error for an invalid configuration.
func RunLeaderElected(ctx context.Context, kube kubernetes.Interface, cfg LeaderConfig, log *slog.Logger, lead func(ctx context.Context, term *Term)) error {
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = 10 * time.Second
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	if cfg.Margin <= 0 {
		cfg.Margin = cfg.LeaseDuration - cfg.RenewDeadline
	}
	cfg.Margin = min(cfg.Margin, cfg.LeaseDuration/2)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Namespace == "" || cfg.LeaseName == "" || cfg.Identity == "" {
		return fmt.Errorf("discovery: leader election needs namespace, lease name and identity")
	}
	lease := &resourcelock.LeaseLock{
		LeaseMeta:  metav1ObjectMeta(cfg.Namespace, cfg.LeaseName),
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
		Labels:     leaseLabels,
	}
	var owner *leaseOwner
	if cfg.OwnerDeployment != "" {
		owner = &leaseOwner{kube: kube, namespace: cfg.Namespace, lease: cfg.LeaseName, deployment: cfg.OwnerDeployment, log: log}
	}
	var floor func(context.Context) (int, error)
	if cfg.Bus != nil {
		floor = termFloor(cfg.Bus, cfg.Namespace+"/"+cfg.LeaseName)
	}
	for ctx.Err() == nil {
		// One term per campaign: the term steps down by ending cctx.
		cctx, stop := context.WithCancelCause(ctx)
		term := newTerm(clock.RealClock{}, cfg.Namespace+"/"+cfg.LeaseName, cfg.Identity, cfg.LeaseDuration, cfg.Margin, log, stop)
		led := make(chan struct{}) // closed when lead has returned
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &fencedLock{Interface: lease, term: term, floor: floor, owner: owner}, LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline,
			RetryPeriod: cfg.RetryPeriod, ReleaseOnCancel: true, Name: cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					defer close(led)
					if err := term.Check(); err != nil {
						return
					}
					log.Info("leading", "lease", cfg.Namespace+"/"+cfg.LeaseName, "identity", cfg.Identity, "epoch", term.Epoch().String())
					wctx, stopWatch := context.WithCancel(ctx)
					watched := make(chan struct{})
					go func() { defer close(watched); term.watchPauses(wctx, min(cfg.RetryPeriod, cfg.Margin)/2) }()
					defer func() { stopWatch(); <-watched }()
					lead(ctx, term)
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
			stop(nil)
			return fmt.Errorf("discovery: leader election: %w", err)
		}
		le.Run(cctx)
		term.end(fmt.Errorf("%w: the campaign ended", ErrNotLeading))
		stop(nil)
		if term.acquired() {
			<-led // lead has returned before the next campaign
		}
	}
	return nil
}

func metav1ObjectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}

// RunElected is RunLeaderElected for a lead that can fail: a failure
// other than the term's end (context.Canceled) is logged, and the last one
// is returned once ctx ends; an invalid configuration is returned at once.
func RunElected(ctx context.Context, kube kubernetes.Interface, cfg LeaderConfig, log *slog.Logger, lead func(ctx context.Context, term *Term) error) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var leadErr error
	err := RunLeaderElected(ctx, kube, cfg, log, func(lctx context.Context, term *Term) {
		if err := lead(lctx, term); err != nil && !errors.Is(err, context.Canceled) {
			leadErr = err
			log.Error("publisher failed", "error", err)
		}
	})
	if err != nil {
		return err
	}
	return leadErr
}
