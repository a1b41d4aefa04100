package discovery

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubeevents"
)

// TestSchedulerRecordsRotationEvents: an instance taken out of rotation
// gets an OutOfRotation Warning on its MAT Service, and a Recovered one
// when a fetch succeeds again, from the discovery controller, on the real
// API server.
func TestSchedulerRecordsRotationEvents(t *testing.T) {
	kube := startKube(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "mat-rotation"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mat, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mat-0-bmc-mock"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kubeevents.Start(ctx, kube, kubeevents.Config{Controller: kubeevents.ControllerDiscovery})
	if err != nil {
		t.Fatal(err)
	}

	b := newBus(t)
	var mu sync.Mutex
	failing := true
	runFakeWorkers(t, b, func(events.SyncJob, string) *events.SyncResult {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return &events.SyncResult{Outcome: events.OutcomeFetchFailed, Transient: true, Error: "HTTP 500"}
		}
		return &events.SyncResult{Outcome: events.OutcomeUnchanged}
	})
	s := runScheduler(t, b, SchedulerConfig{PollInterval: 20 * time.Millisecond, SyncInterval: time.Hour,
		FailuresBeforeBackoff: 3, ProbeMaxInterval: 200 * time.Millisecond, Events: rec}, nil)
	s.Set([]string{ns + "." + mat.Name})

	find := func(reason kubeevents.Reason) *eventsv1.Event {
		l, err := kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + mat.Name})
		if err != nil {
			t.Fatal(err)
		}
		for i := range l.Items {
			if l.Items[i].Reason == string(reason) {
				return &l.Items[i]
			}
		}
		return nil
	}
	var out *eventsv1.Event
	eventually(t, "an OutOfRotation Event", func() bool { out = find(kubeevents.OutOfRotation); return out != nil })
	if out.Type != corev1.EventTypeWarning || out.Regarding.UID != mat.UID || out.ReportingController != kubeevents.ControllerDiscovery {
		t.Errorf("OutOfRotation: %s on uid %s by %s; want a Warning on uid %s by %s", out.Type, out.Regarding.UID, out.ReportingController, mat.UID, kubeevents.ControllerDiscovery)
	}
	if find(kubeevents.Recovered) != nil {
		t.Error("Recovered before any fetch succeeded")
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	var back *eventsv1.Event
	eventually(t, "a Recovered Event", func() bool { back = find(kubeevents.Recovered); return back != nil })
	if back.Type != corev1.EventTypeNormal || back.Regarding.UID != mat.UID {
		t.Errorf("Recovered: %s on uid %s; want Normal on uid %s", back.Type, back.Regarding.UID, mat.UID)
	}
}
