package discovery

import (
	"context"
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// leaseLabels are the labels of a Lease this process creates, so that an
// operator can find it (`kubectl get lease -l app.kubernetes.io/part-of=matbus`).
var leaseLabels = map[string]string{
	"app.kubernetes.io/part-of":   "matbus",
	"app.kubernetes.io/component": "discovery",
}

// leaseOwner puts an owner reference to the discovery Deployment on the
// election Lease once per process, after this process wrote the Lease as
// its holder: a Lease made by the create of client-go's lock carries none,
// and a Lease left by an earlier version has none either. The update is a
// separate write of the whole Lease (get, add the reference, update); a
// conflict with a renew is tried again after the next one. Errors are
// logged, not returned: the holder keeps leading without an owner.
type leaseOwner struct {
	kube                         kubernetes.Interface
	namespace, lease, deployment string
	log                          *slog.Logger

	mu   sync.Mutex
	done bool   // the Lease has the reference
	last string // the last error logged, so a repeated one is logged once
}

// ensure adds the reference unless it is there; it reports whether it
// wrote the Lease (the lock's cached copy is then stale).
func (o *leaseOwner) ensure(ctx context.Context) (wrote bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return false
	}
	wrote, err := o.set(ctx)
	if err != nil {
		if msg := err.Error(); msg != o.last {
			o.last = msg
			o.log.Warn("the leader-election Lease has no owner reference; it will outlive the Deployment (tried again at the next renew)",
				"lease", o.namespace+"/"+o.lease, "deployment", o.deployment, "error", err)
		}
		return wrote
	}
	o.done = true
	return wrote
}

func (o *leaseOwner) set(ctx context.Context) (wrote bool, err error) {
	d, err := o.kube.AppsV1().Deployments(o.namespace).Get(ctx, o.deployment, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	// Not a controller reference and no blockOwnerDeletion: the Lease never
	// holds up the Deployment's deletion.
	ref := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}
	leases := o.kube.CoordinationV1().Leases(o.namespace)
	l, err := leases.Get(ctx, o.lease, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, r := range l.OwnerReferences {
		if r.UID == ref.UID {
			return false, nil
		}
	}
	// Drop a reference to an earlier Deployment of the same name (a
	// re-install): its UID is gone, and the garbage collector would delete
	// the Lease for it.
	refs := []metav1.OwnerReference{ref}
	for _, r := range l.OwnerReferences {
		if !(r.Kind == "Deployment" && r.Name == ref.Name) {
			refs = append(refs, r)
		}
	}
	l.OwnerReferences = refs
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	for k, v := range leaseLabels {
		if _, ok := l.Labels[k]; !ok {
			l.Labels[k] = v
		}
	}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return false, err
	}
	o.log.Info("leader-election Lease owned by the Deployment", "lease", o.namespace+"/"+o.lease, "deployment", o.deployment)
	return true, nil
}
