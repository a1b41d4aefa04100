package discovery

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func createDeployment(t *testing.T, kube kubernetes.Interface, name string) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	d, err := kube.AppsV1().Deployments("default").Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// With OwnerDeployment, the Lease the leader creates, and a Lease an
// earlier version left without owner, get an owner reference to the
// Deployment (so its deletion lets the garbage collector delete the Lease)
// and the part-of label; the leader keeps renewing afterwards (its cached
// Lease was read again after the extra write). A Deployment that does not
// exist costs the owner, not the leadership.
func TestLeaseOwnedByDeployment(t *testing.T) {
	kube := startKube(t)
	ctx := context.Background()
	d := createDeployment(t, kube, "matbus-discovery")
	leases := kube.CoordinationV1().Leases("default")
	// A Lease left by an earlier version: no owner, no labels.
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "old"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fresh", "old"} {
		t.Run(name, func(t *testing.T) {
			term, _ := startLeading(t, kube, LeaderConfig{Namespace: "default", LeaseName: name, Identity: "a", OwnerDeployment: d.Name})
			var l *coordinationv1.Lease
			deadline := time.Now().Add(20 * time.Second)
			for {
				var err error
				l, err = leases.Get(ctx, name, metav1.GetOptions{})
				if err == nil && len(l.OwnerReferences) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("Lease %s has owner references %v (%v), want the Deployment", name, l.OwnerReferences, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			ref := l.OwnerReferences[0]
			if ref.UID != d.UID || ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != d.Name {
				t.Fatalf("owner reference %+v, want the Deployment %s (%s)", ref, d.Name, d.UID)
			}
			if ref.Controller != nil && *ref.Controller || ref.BlockOwnerDeletion != nil && *ref.BlockOwnerDeletion {
				t.Fatalf("owner reference %+v: want neither controller nor blockOwnerDeletion", ref)
			}
			if l.Labels["app.kubernetes.io/part-of"] != "matbus" {
				t.Fatalf("Lease labels %v", l.Labels)
			}
			renewed := l.Spec.RenewTime.Time
			time.Sleep(time.Second) // several renews (retry period 200 ms)
			if err := term.Check(); err != nil {
				t.Fatalf("term after the owner was written: %v", err)
			}
			l, err := leases.Get(ctx, name, metav1.GetOptions{})
			if err != nil || !l.Spec.RenewTime.After(renewed) || *l.Spec.HolderIdentity != "a" {
				t.Fatalf("not renewed after the owner was written: %+v %v", l.Spec, err)
			}
		})
	}

	t.Run("missing deployment", func(t *testing.T) {
		term, _ := startLeading(t, kube, LeaderConfig{Namespace: "default", LeaseName: "orphan", Identity: "a", OwnerDeployment: "gone"})
		time.Sleep(time.Second)
		if err := term.Check(); err != nil {
			t.Fatalf("term: %v", err)
		}
		l, err := leases.Get(ctx, "orphan", metav1.GetOptions{})
		if err != nil || len(l.OwnerReferences) != 0 || *l.Spec.HolderIdentity != "a" {
			t.Fatalf("Lease %+v %+v (%v): want held by a, no owner", l.ObjectMeta.OwnerReferences, l.Spec, err)
		}
	})
}
