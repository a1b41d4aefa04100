package kubelocal

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestClusterServesServices starts a real etcd + kube-apiserver and checks
// what the worker relies on: Services with a chosen clusterIP inside the
// range are created, a second one asking for the same IP gets 422 Invalid,
// and an IP outside the range is refused too.
func TestClusterServesServices(t *testing.T) {
	dir, err := FindBinaries()
	if errors.Is(err, ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{BinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	kc := kubernetes.NewForConfigOrDie(c.RESTConfig())
	svc := func(name, ip string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "redfish", Port: 443}}}}
	}
	got, err := kc.CoreV1().Services("default").Create(ctx, svc("a", "10.96.64.10"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.ClusterIP != "10.96.64.10" {
		t.Fatalf("clusterIP = %s", got.Spec.ClusterIP)
	}
	_, err = kc.CoreV1().Services("default").Create(ctx, svc("b", "10.96.64.10"), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("duplicate IP: want 422 Invalid, got %v", err)
	}
	_, err = kc.CoreV1().Services("default").Create(ctx, svc("c", "192.0.2.21"), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "192.0.2.21") {
		t.Fatalf("out-of-range IP: want 422 Invalid, got %v", err)
	}
	if _, err := os.Stat(c.Kubeconfig); err != nil {
		t.Fatalf("kubeconfig not written: %v", err)
	}
}
