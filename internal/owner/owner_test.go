package owner

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/matbus/matbus/events"
)

// TestLookup: the owner reference of an existing Deployment; nil without
// an owner, for a key without a namespace and for a missing Deployment;
// the API error, wrapped with the Deployment's name, otherwise.
func TestLookup(t *testing.T) {
	kube := fake.NewClientset(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mat-0", UID: "uid-0"}})
	ctx := context.Background()
	ref, err := Lookup(ctx, kube, events.Instance{Key: "ns.mat-0-bmc-mock", Owner: "mat-0"})
	if err != nil || ref == nil || ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != "mat-0" || ref.UID != "uid-0" {
		t.Fatalf("Lookup = %+v, %v", ref, err)
	}
	for _, in := range []events.Instance{
		{Key: "ns.mat-0-bmc-mock"},
		{Key: "no-namespace", Owner: "mat-0"},
		{Key: "ns.mat-1-bmc-mock", Owner: "mat-1"},
	} {
		if ref, err := Lookup(ctx, kube, in); ref != nil || err != nil {
			t.Errorf("%+v: Lookup = %+v, %v; want nil, nil", in, ref, err)
		}
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "mat-0", errors.New("no"))
	kube.PrependReactor("get", "deployments", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, forbidden })
	ref, err = Lookup(ctx, kube, events.Instance{Key: "ns.mat-0-bmc-mock", Owner: "mat-0"})
	if ref != nil || !apierrors.IsForbidden(err) || errors.Unwrap(err) != forbidden || !strings.HasPrefix(err.Error(), "get Deployment ns/mat-0: ") {
		t.Errorf("forbidden: Lookup = %+v, %v", ref, err)
	}
}
