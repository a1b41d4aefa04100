package discovery

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/internal/testenv"
)

// TestSourcesAPIGatewayOnRealAPIServer: the sources API of a KubeSource
// (published URLs in cluster-ip mode) on a real API server, read by a
// client that applies the MAT protocol gateway's exit rules. It never
// exits when the MAT Service is deleted and re-created with a new cluster
// IP within the debounce, when the MAT pod restarts (the Service's
// endpoints change, its labels stay), or when the Service's pod label
// changes in place (served under the same generation once confirmed); it
// exits (set changed) when a MAT Service is really added, no sooner than
// the debounce after.
func TestSourcesAPIGatewayOnRealAPIServer(t *testing.T) {
	kube := startKube(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "mat-system"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	matLabels := func(pod string) map[string]string {
		l := map[string]string{"nvidia-infra-controller/mat-service": "true"}
		if pod != "" {
			l[PodNameLabel] = pod
		}
		return l
	}
	mat0 := func(clusterIP string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mat-0-bmc-mock", Labels: matLabels("mat-0-pod-a")},
			Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "bmc-mock", Port: 1266}}}}
	}
	create := func(svc *corev1.Service) {
		t.Helper()
		if _, err := kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(mat0("10.96.100.10"))
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mat-1", Labels: matLabels(""), Annotations: map[string]string{URLAnnotation: "https://mat-1.example:9999"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "x", Port: 1}}}})
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "unrelated"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "redfish", Port: 443}}}})

	src, err := NewKube(kube, KubeConfig{Namespace: ns, HostMode: HostModeClusterIP, ClusterDomain: "cluster.test"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sh := Share(src)
	if err := sh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Long enough for a delete and a create to reach the informer within
	// it on a loaded machine.
	const debounce = 3 * time.Second
	l := NewSourceList(debounce, nil)
	passes := make(chan struct{})
	go func() { defer close(passes); _ = l.Run(ctx, sh) }()
	defer func() { cancel(); <-passes }()
	addr, served, err := ServeSources(ctx, "127.0.0.1:0", l, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); <-served }()
	url := "http://" + addr.String() + SourcesPath
	// Long enough for a confirmed change to have been served.
	settle := debounce + 2*l.PassInterval() + 500*time.Millisecond

	g := testenv.StartGateway(t, url, 50*time.Millisecond, 600)
	set := g.WaitSet(t, 30*time.Second)
	want := []SourceEntry{
		{"mat-0-bmc-mock", "https://mat-0-bmc-mock.mat-system.svc.cluster.test:1266", "mat-0-pod-a"},
		{"mat-1", "https://mat-1.example:9999", ""},
	}
	if got := getSources(t, url); got.Generation != 1 || !got.Ready || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("served %+v, want generation 1 and %+v", got, want)
	}
	publishedURL := func() string {
		insts, _ := src.Instances()
		for _, in := range insts {
			if in.Key == ns+".mat-0-bmc-mock" {
				return in.URL
			}
		}
		return ""
	}
	if u := publishedURL(); u != "https://10.96.100.10:1266" {
		t.Fatalf("published URL %q, want the cluster IP (cluster-ip mode)", u)
	}

	// The MAT Service deleted and re-created with a new cluster IP.
	if err := kube.CoreV1().Services(ns).Delete(ctx, "mat-0-bmc-mock", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	create(mat0("10.96.100.11"))
	eventually(t, "the published URL has the new cluster IP", func() bool { return publishedURL() == "https://10.96.100.11:1266" })
	time.Sleep(settle)
	g.AssertRunning(t, "after the MAT Service was re-created")
	if got := getSources(t, url); got.Generation != 1 || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("after the re-create: %+v, want generation 1 and %+v", got, want)
	}

	// The MAT pod restarts: the Service's endpoints move to a new pod.
	slice := func(name, pod, ip string) *discoveryv1.EndpointSlice {
		port, proto := int32(1266), corev1.ProtocolTCP
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "mat-0-bmc-mock"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}}},
			Ports:       []discoveryv1.EndpointPort{{Name: new("bmc-mock"), Port: &port, Protocol: &proto}},
		}
	}
	if _, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("mat-0-bmc-mock-a", "mat-0-7d9f8c6b5-aaaaa", "10.244.0.5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(l.PassInterval())
	if err := kube.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "mat-0-bmc-mock-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("mat-0-bmc-mock-b", "mat-0-7d9f8c6b5-bbbbb", "10.244.0.6"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)
	g.AssertRunning(t, "after the MAT pod restarted")
	if got := getSources(t, url); got.Generation != 1 || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("after the pod restart: %+v, want generation 1 and %+v", got, want)
	}

	// The Service's pod label changes in place: served once confirmed,
	// under the same generation.
	svc, err := kube.CoreV1().Services(ns).Get(ctx, "mat-0-bmc-mock", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Labels[PodNameLabel] = "mat-0-pod-b"
	changedAt := time.Now()
	if _, err := kube.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for getSources(t, url).List[0].Pod != "mat-0-pod-b" {
		if time.Since(changedAt) > 30*time.Second {
			t.Fatal("the new pod was not served")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if el := time.Since(changedAt); el < debounce {
		t.Errorf("the new pod was served %s after the change, before the debounce %s", el, debounce)
	}
	want[0].Pod = "mat-0-pod-b"
	if got := getSources(t, url); got.Generation != 1 || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("after the pod label change: %+v, want generation 1 and %+v", got, want)
	}
	g.AssertRunning(t, "after the pod label changed")
	if !reflect.DeepEqual(g.Set(), set) {
		t.Fatalf("gateway set %v, started with %v", g.Set(), set)
	}

	// A MAT Service really added: the gateway exits, no sooner than the
	// debounce after.
	addedAt := time.Now()
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mat-2-bmc-mock", Labels: matLabels("")},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "redfish", Port: 443}}}})
	code, at := g.WaitExit(t, 30*time.Second)
	if code != testenv.GatewaySetChanged {
		_, reason, _ := g.Exit()
		t.Fatalf("gateway exit %d (%s), want %d", code, reason, testenv.GatewaySetChanged)
	}
	if el := at.Sub(addedAt); el < debounce {
		t.Errorf("gateway exited %s after the add, before the debounce %s", el, debounce)
	}
	got := getSources(t, url)
	if got.Generation != 2 || len(got.List) != 3 || got.List[2] != (SourceEntry{"mat-2-bmc-mock", "https://mat-2-bmc-mock.mat-system.svc.cluster.test:443", ""}) {
		t.Fatalf("after the add: %+v, want generation 2 with mat-2-bmc-mock", got)
	}
}
