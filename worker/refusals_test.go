package worker

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRecreateRefusalsBackOff(t *testing.T) {
	svc := func(ip string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: corev1.ServiceSpec{ClusterIP: ip}}
	}
	var r recreateRefusals
	now := time.Unix(1000, 0)
	a, b := svc("10.96.0.1"), svc("10.96.0.2")
	if _, ok := r.blocked("k", a, now); ok {
		t.Fatal("blocked before any refusal")
	}
	waits := []time.Duration{}
	for range 8 {
		f := r.refused("k", a, "no", now)
		waits = append(waits, f.wait)
		if _, ok := r.blocked("k", a, now.Add(f.wait-time.Second)); !ok {
			t.Fatalf("not blocked within its backoff %v", f.wait)
		}
		if _, ok := r.blocked("k", a, now.Add(f.wait)); ok {
			t.Fatalf("still blocked after its backoff %v", f.wait)
		}
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute, 32 * time.Minute, time.Hour, time.Hour}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", waits, want)
		}
	}
	if _, ok := r.blocked("k", b, now); ok {
		t.Error("a changed replacement is blocked")
	}
	if f := r.refused("k", b, "no", now); f.wait != time.Minute {
		t.Errorf("a changed replacement's first backoff %v, want 1m", f.wait)
	}
	if _, ok := r.blocked("other", b, now); ok {
		t.Error("blocked for another instance")
	}
	r.done("k", "s")
	if _, ok := r.blocked("k", b, now); ok || r.len() != 0 {
		t.Errorf("blocked after done (%d instances kept)", r.len())
	}
	r.refused("k", a, "no", now)
	r.forget("k")
	if r.len() != 0 {
		t.Error("kept after forget")
	}
}
