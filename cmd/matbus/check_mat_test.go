package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/natsserver"
)

// TestCheckUnusableMATService: a discovered MAT Service that discovery
// cannot turn into an instance (here an ftp:// URL annotation) is a FAIL
// row naming it and the reason, and check exits 1; the worker's and
// discovery's --health-addr is accepted.
func TestCheckUnusableMATService(t *testing.T) {
	c := checkCluster(t)
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "mat-x-bmc-mock", Namespace: "default",
			Labels:      map[string]string{"nvidia-infra-controller/mat-service": "true"},
			Annotations: map[string]string{discovery.URLAnnotation: "ftp://mat.example:21"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "redfish", Port: 1266}}},
	}
	if _, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runArgs(t, nil, "check", "--kubeconfig", c.Kubeconfig, "--nats-url", ns.ClientURL(),
		"--namespace", "default", "--leader-elect=false", "--health-addr", ":8080", "--log-level", "error", "--timeout", "1m")
	t.Logf("exit %d\n%s%s", code, out, errOut)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got, line := checkRowResult(out, "MAT Service default.mat-x-bmc-mock")
	if got != "FAIL" || !strings.Contains(line, "ftp") {
		t.Errorf("row %q, want FAIL naming the ftp URL", line)
	}
}
