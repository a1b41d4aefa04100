package kubewatch_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/kubewatch"
)

// StripManagedFields drops managedFields and nothing else, and passes a
// tombstone through unchanged.
func TestStripManagedFields(t *testing.T) {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Name: "mat-bmc-a", Labels: map[string]string{"app.kubernetes.io/managed-by": "mat-k8s-controller"},
		Annotations:   map[string]string{"matbus.io/mat-id": "a"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "matbus", Operation: metav1.ManagedFieldsOperationUpdate}},
	}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	want := s.DeepCopy()
	want.ManagedFields = nil
	got, err := kubewatch.StripManagedFields(s)
	if err != nil {
		t.Fatal(err)
	}
	gs, ok := got.(*corev1.Service)
	if !ok || gs.ManagedFields != nil || gs.Name != want.Name || gs.Labels["app.kubernetes.io/managed-by"] != "mat-k8s-controller" ||
		gs.Annotations["matbus.io/mat-id"] != "a" || gs.Spec.ClusterIP != want.Spec.ClusterIP {
		t.Fatalf("stripped %+v, want %+v", got, want)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/mat-bmc-a", Obj: s}
	if got, err := kubewatch.StripManagedFields(tomb); err != nil || got != any(tomb) {
		t.Fatalf("tombstone: %v, %v", got, err)
	}
}
