package owner

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/events"
)

// Lookup returns the owner reference (apps/v1 Deployment, its name and UID)
// to the MAT Deployment of inst: nil when inst names no owner, its key has
// no namespace, or the Deployment does not exist (NotFound). Errors: the
// GET failed otherwise, as "get Deployment <namespace>/<name>: <API
// error>" wrapping the API server's error (errors.Unwrap gives it back
// alone).
func Lookup(ctx context.Context, kube kubernetes.Interface, inst events.Instance) (*metav1.OwnerReference, error) {
	if inst.Owner == "" {
		return nil, nil
	}
	ns, _, err := events.SplitKey(inst.Key)
	if err != nil {
		return nil, nil
	}
	d, err := kube.AppsV1().Deployments(ns).Get(ctx, inst.Owner, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Deployment %s/%s: %w", ns, inst.Owner, err)
	}
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}, nil
}
