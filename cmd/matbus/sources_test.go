package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
)

// TestDiscoverySourcesAPI: `matbus discovery` serves its static instances
// (name without the namespace, URL as is) on --source-list-addr, and stops
// serving when it stops.
func TestDiscoverySourcesAPI(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"discovery", "--nats-url", ns.ClientURL(), "--namespace", "mat",
			"--static", "mat-b=https://10.0.0.2:1266,mat-a=https://10.0.0.1:1266", "--leader-elect=false",
			"--health-addr", "", "--source-list-addr", addr, "--source-list-debounce", "0s"}, envT(&out, &errOut, nil))
	}()
	url := "http://" + addr + discovery.SourcesPath
	var got discovery.Sources
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
		}
		if err == nil && got.Ready {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("sources API not ready: %v %+v\n%s", err, got, errOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := []discovery.SourceEntry{{Name: "mat-a", BaseURL: "https://10.0.0.1:1266"}, {Name: "mat-b", BaseURL: "https://10.0.0.2:1266"}}
	if got.Generation != 1 || len(got.List) != 2 || got.List[0] != want[0] || got.List[1] != want[1] {
		t.Errorf("served %+v, want generation 1 and %+v", got, want)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d\n%s", code, errOut.String())
	}
	if _, err := http.Get(url); err == nil {
		t.Error("sources API still served after discovery stopped")
	}
}

// TestDiscoverySourcesAPIOnEveryReplica: two `matbus discovery` processes
// with leader election on a real API server and NATS, each with a gateway
// client that applies the MAT protocol gateway's exit rules to its own
// replica. The follower serves the set, ready; when the leader stops
// (SIGTERM), the follower takes the Lease and its gateway does not exit; a
// restarted replica serves the same set as a follower.
func TestDiscoverySourcesAPIOnEveryReplica(t *testing.T) {
	cluster := checkCluster(t)
	kube, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	namespace := testenv.Namespace("src", t.Name())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mat-0-bmc-mock", "mat-1-bmc-mock"} {
		if _, err := kube.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia-infra-controller/mat-service": "true"}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	bin := buildMatbus(t)

	const debounce = time.Second
	// Processes of their own: subcommands in one process share klog's
	// global logger.
	start := func(ident string) (*proc, string) {
		t.Helper()
		port, err := kubelocal.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := startProc(t, bin, ident, nil, "discovery", "--nats-url", ns.ClientURL(), "--namespace", namespace,
			"--kubeconfig", cluster.Kubeconfig, "--identity", ident, "--health-addr", "",
			"--source-list-addr", addr, "--source-list-debounce", debounce.String(),
			"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "250ms")
		return p, "http://" + addr + discovery.SourcesPath
	}
	holder := func() string {
		l, err := kube.CoordinationV1().Leases(namespace).Get(ctx, "matbus-discovery", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}

	a, urlA := start("disc-a")
	waitFor(t, 60*time.Second, "disc-a leading", func() bool { return holder() == "disc-a" }, a)
	b, urlB := start("disc-b")
	gA := testenv.StartGateway(t, urlA, 50*time.Millisecond, 600)
	gB := testenv.StartGateway(t, urlB, 50*time.Millisecond, 600)
	set := gB.WaitSet(t, 60*time.Second)
	if h := holder(); h != "disc-a" {
		t.Fatalf("Lease held by %q while the follower's gateway took its set", h)
	}
	want := []string{
		"mat-0-bmc-mock https://mat-0-bmc-mock." + namespace + ".svc.cluster.local:1266",
		"mat-1-bmc-mock https://mat-1-bmc-mock." + namespace + ".svc.cluster.local:1266",
	}
	if !reflect.DeepEqual(set, want) || !reflect.DeepEqual(gA.WaitSet(t, 60*time.Second), want) {
		t.Fatalf("follower's set %v, leader's %v, want %v", set, gA.Set(), want)
	}

	// Leader failover: the leader stops and releases the Lease.
	gA.AssertRunning(t, "beside the leader")
	a.halt(t)
	gA.Stop()
	waitFor(t, 60*time.Second, "disc-b leading", func() bool { return holder() == "disc-b" }, b)
	time.Sleep(debounce + 2*time.Second)
	gB.AssertRunning(t, "after the failover")

	// The old leader restarts as a follower: the same set.
	a, urlA = start("disc-a")
	gA = testenv.StartGateway(t, urlA, 50*time.Millisecond, 600)
	if got := gA.WaitSet(t, 60*time.Second); !reflect.DeepEqual(got, want) {
		t.Fatalf("restarted replica's set %v, want %v", got, want)
	}
	time.Sleep(debounce + 2*time.Second)
	gA.AssertRunning(t, "beside the restarted replica")
	gB.AssertRunning(t, "after the old leader restarted")
	if h := holder(); h != "disc-b" {
		t.Errorf("Lease held by %q, want disc-b", h)
	}
	if t.Failed() {
		t.Logf("disc-a:\n%s\ndisc-b:\n%s", tail(a.out.String(), 40), tail(b.out.String(), 40))
	}
}
