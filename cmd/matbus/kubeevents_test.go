package main

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/matsim"
)

// TestKubeEventsFlag runs `matbus discovery` and `matbus worker` for two
// namespaces, each with a MAT whose status fetch fails: by default the MAT
// Service gets the worker's FetchFailed and the leader's OutOfRotation
// Event; with --kube-events=false (worker: MATBUS_KUBE_EVENTS=false) the
// namespace gets no Event object written by matbus.
func TestKubeEventsFlag(t *testing.T) {
	c := checkCluster(t)
	kube, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	nsrv, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nsrv.Shutdown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bin := buildMatbus(t)
	var procs []*proc
	sims := map[string]*matsim.Server{}
	for _, ns := range []string{"kev-on", "kev-off"} {
		sim, err := matsim.New(matsim.Options{Fleet: &matsim.Fleet{}})
		if err != nil {
			t.Fatal(err)
		}
		url, err := sim.Start(ctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer sim.Close()
		sim.SetFault(matsim.Fault500)
		sims[ns] = sim
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "mat-0-bmc-mock", Labels: map[string]string{"nvidia-infra-controller/mat-service": "true"},
				Annotations: map[string]string{discovery.URLAnnotation: url}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		common := []string{"--nats-url", nsrv.ClientURL(), "--namespace", ns, "--kubeconfig", c.Kubeconfig, "--health-addr", ""}
		disc := append([]string{"discovery", "--leader-elect=false", "--source-list-addr", "", "--sync-interval", "1s",
			"--poll-interval", "200ms", "--probe-max-interval", "1s"}, common...)
		work := append([]string{"worker", "--mat-timeout", "2s"}, common...)
		workerEnv := map[string]string{}
		if ns == "kev-off" {
			disc = append(disc, "--kube-events=false")
			workerEnv["MATBUS_KUBE_EVENTS"] = "false"
		}
		procs = append(procs, startProc(t, bin, "discovery "+ns, nil, disc...), startProc(t, bin, "worker "+ns, workerEnv, work...))
	}

	reasons := func(ns string) map[string]int {
		l, err := kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, ev := range l.Items {
			// The API server's own controllers (ipallocator-repair-controller
			// on a Service created while its repair loop runs) may write Events
			// here too; only matbus's count.
			if !strings.HasPrefix(ev.ReportingController, "matbus.io/") {
				continue
			}
			out[ev.Reason+" "+ev.ReportingController]++
		}
		return out
	}
	waitFor(t, time.Minute, "kev-on: FetchFailed from the worker and OutOfRotation from discovery", func() bool {
		r := reasons("kev-on")
		return r["FetchFailed "+kubeevents.ControllerWorker] > 0 && r["OutOfRotation "+kubeevents.ControllerDiscovery] > 0
	}, procs...)
	waitFor(t, time.Minute, "kev-off: four failed status fetches", func() bool { return sims["kev-off"].Requests() >= 4 }, procs...)
	time.Sleep(time.Second) // Events of these failures would be written by now
	if r := reasons("kev-off"); len(r) != 0 {
		t.Errorf("kev-off (--kube-events=false): Event objects %v, want none", r)
	}
}
