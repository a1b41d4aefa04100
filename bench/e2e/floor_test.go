package main

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/kubelocal"
)

// TestFloorDeletePreconditions, against a real API server: floorCreate
// records each Service's UID and resourceVersion; floorDelete with
// preconditions (--floor-as-worker) refuses a Service changed since, as a
// worker's delete job does, and deletes the rest; without them it deletes
// the changed one too.
func TestFloorDeletePreconditions(t *testing.T) {
	binDir, err := kubelocal.FindBinaries()
	if err != nil {
		if os.Getenv("MATBUS_REQUIRE_K8S") != "" {
			t.Fatalf("MATBUS_REQUIRE_K8S is set but %v", err)
		}
		t.Skipf("needs the API server binaries: %v (set MATBUS_REQUIRE_K8S=1 to make this a failure)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := kubelocal.Start(ctx, kubelocal.Config{BinDir: binDir})
	if err != nil {
		t.Fatalf("kubelocal: %v", err)
	}
	defer cluster.Stop()
	kube, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "floor"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var svcs []*corev1.Service
	for _, name := range []string{"a", "b", "c"} {
		svcs = append(svcs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443}}}})
	}
	if c := floorCreate(ctx, kube, svcs, 2); c.Failed != 0 {
		t.Fatalf("floorCreate: %d of 3 failed", c.Failed)
	}
	for _, s := range svcs {
		if s.UID == "" || s.ResourceVersion == "" {
			t.Fatalf("floorCreate did not record %s's UID and resourceVersion", s.Name)
		}
	}
	changed, err := kube.CoreV1().Services(ns).Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	changed.Labels = map[string]string{"changed": "yes"}
	if _, err := kube.CoreV1().Services(ns).Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	if d := floorDelete(ctx, kube, svcs, 2, true); d.Failed != 1 {
		t.Fatalf("with preconditions %d of 3 deletes failed, want 1 (the changed Service)", d.Failed)
	}
	for _, s := range svcs {
		_, err := kube.CoreV1().Services(ns).Get(ctx, s.Name, metav1.GetOptions{})
		if gone := apierrors.IsNotFound(err); gone != (s.Name != "b") {
			t.Errorf("after the deletes with preconditions, %s gone = %v (err %v)", s.Name, gone, err)
		}
	}
	if d := floorDelete(ctx, kube, svcs[1:2], 1, false); d.Failed != 0 {
		t.Fatalf("without preconditions the changed Service was not deleted")
	}
	if _, err := kube.CoreV1().Services(ns).Get(ctx, "b", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("b is still there after a delete without preconditions: %v", err)
	}
}
