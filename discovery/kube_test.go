package discovery

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/kubelocal"
)

func startKube(t *testing.T) kubernetes.Interface {
	t.Helper()
	return kubernetes.NewForConfigOrDie(startKubeConfig(t))
}

// startKubeConfig starts a kube-apiserver and etcd and returns the client
// configuration of the API server.
func startKubeConfig(t *testing.T) *rest.Config {
	t.Helper()
	dir, err := kubelocal.FindBinaries()
	if errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := kubelocal.Start(ctx, kubelocal.Config{BinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c.RESTConfig()
}

// TestKubeSourceOnRealAPIServer discovers MAT Services through the
// informer: URL from the port named redfish/bmc-mock (else the first), the
// annotation override, pod name and owner; an unlabelled Service is ignored;
// a deleted Service is reported gone by the publisher.
func TestKubeSourceOnRealAPIServer(t *testing.T) {
	kube := startKube(t)
	ctx := context.Background()
	ns := "mat-system"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, lbl map[string]string, ann map[string]string, ports ...corev1.ServicePort) {
		_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl, Annotations: ann},
			Spec:       corev1.ServiceSpec{Ports: ports}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	sel := map[string]string{"nvidia-infra-controller/mat-service": "true"}
	mk("mat-0-bmc-mock", map[string]string{"nvidia-infra-controller/mat-service": "true", PodNameLabel: "mat-0-pod"}, nil,
		corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "bmc-mock", Port: 1266})
	mk("mat-1", sel, map[string]string{URLAnnotation: "http://127.0.0.1:9999"}, corev1.ServicePort{Name: "x", Port: 1})
	mk("unrelated", nil, nil, corev1.ServicePort{Name: "redfish", Port: 443})

	src, err := NewKube(kube, KubeConfig{Namespace: ns}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newBus(t)
	runPublisher(t, b, src, time.Hour)
	eventually(t, "both MAT Services discovered", func() bool { return present(b, ns+".mat-0-bmc-mock")() && present(b, ns+".mat-1")() })

	insts, synced := src.Instances()
	if !synced || len(insts) != 2 {
		t.Fatalf("Instances = %+v synced=%v", insts, synced)
	}
	svc, _ := kube.CoreV1().Services(ns).Get(ctx, "mat-0-bmc-mock", metav1.GetOptions{})
	a := insts[0]
	// The default URL is the Service's DNS name, as the old controller's.
	if a.URL != "https://mat-0-bmc-mock.mat-system.svc.cluster.local:1266" || a.Owner != "mat-0" || a.PodName != "mat-0-pod" || a.Version != svc.ResourceVersion {
		t.Fatalf("instance from mat-0-bmc-mock = %+v", a)
	}
	// The other host modes, on the same Service as the API server stored it.
	for _, tc := range []struct {
		cfg  KubeConfig
		want string
	}{
		{KubeConfig{ClusterDomain: "corp.example"}, "https://mat-0-bmc-mock.mat-system.svc.corp.example:1266"},
		{KubeConfig{HostMode: HostModeDNS, Scheme: "http"}, "http://mat-0-bmc-mock.mat-system.svc.cluster.local:1266"},
		{KubeConfig{HostMode: HostModeClusterIP}, "https://" + svc.Spec.ClusterIP + ":1266"},
	} {
		s, err := NewKube(kube, tc.cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.instance(svc)
		if err != nil || got.URL != tc.want {
			t.Errorf("%+v: URL %q, %v; want %q", tc.cfg, got.URL, err, tc.want)
		}
	}
	if insts[1].URL != "http://127.0.0.1:9999" || insts[1].Owner != "" {
		t.Fatalf("instance from mat-1 = %+v", insts[1])
	}
	if err := kube.CoreV1().Services(ns).Delete(ctx, "mat-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "mat-1 gone", gone(b, ns+".mat-1"))
	if !present(b, ns+".mat-0-bmc-mock")() {
		t.Fatal("mat-0 must stay present")
	}
}

func TestNewKubeRejectsBadConfig(t *testing.T) {
	for _, c := range []KubeConfig{{Selector: "a in (("}, {Scheme: "ftp"}, {HostMode: "ip"}} {
		if _, err := NewKube(nil, c, nil, nil); err == nil {
			t.Errorf("NewKube(%+v) accepted", c)
		}
	}
}
