package worker

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/plan"
)

func memoService(name, instanceKey, ip string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "bmc", Name: name}}
	if instanceKey != "" {
		s.Labels = map[string]string{plan.LabelInstance: plan.LabelValue(instanceKey)}
	}
	if ip != "" {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
	}
	return s
}

// An instance that waits for a Service name or IP sees the delete of any
// Service with that name or IP as a change of its own Services, and
// nothing else of other instances; what it no longer waits for, or what a
// gone instance waited for, changes nothing.
func TestMemoWaitingInstance(t *testing.T) {
	const a, b = "ns.mat-a", "ns.mat-b"
	m := newMemo()
	h := m.handler()
	done := func() {
		t.Helper()
		m.completed(a, "fp", m.changeCount(a))
		if !m.unchanged(a, "fp") {
			t.Fatal("unchanged right after completed")
		}
	}
	m.waitFor(a, []*corev1.Service{memoService("mat-bmc-host-x", "", "10.0.0.1"), memoService("mat-bmc-host-y", "", "")})
	done()

	for _, tc := range []struct {
		name    string
		event   func()
		changed bool
	}{
		{"another Service of b deleted", func() { h.OnDelete(memoService("mat-bmc-host-z", b, "10.0.0.9")) }, false},
		{"b's Service holding a wanted name updated", func() {
			h.OnUpdate(memoService("mat-bmc-host-x", b, "10.0.0.5"), memoService("mat-bmc-host-x", b, "10.0.0.5"))
		}, false},
		{"b's Service holding a wanted name deleted", func() { h.OnDelete(memoService("mat-bmc-host-x", b, "10.0.0.5")) }, true},
		{"b's Service holding the wanted IP deleted", func() { h.OnDelete(memoService("mat-bmc-host-q", b, "10.0.0.1")) }, true},
		{"a wanted name's delete seen late", func() {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "bmc/mat-bmc-host-y", Obj: memoService("mat-bmc-host-y", b, "10.0.0.7")})
		}, true},
	} {
		tc.event()
		if got := !m.unchanged(a, "fp"); got != tc.changed {
			t.Errorf("%s: changed = %v, want %v", tc.name, got, tc.changed)
		}
		done()
	}

	m.waitFor(a, nil)
	h.OnDelete(memoService("mat-bmc-host-x", b, "10.0.0.1"))
	if !m.unchanged(a, "fp") {
		t.Error("a delete of what a no longer waits for changed a")
	}
	m.waitFor(a, []*corev1.Service{memoService("mat-bmc-host-x", "", "10.0.0.1")})
	m.waitFor(b, []*corev1.Service{memoService("mat-bmc-host-x", "", "10.0.0.1")})
	m.forget(a)
	m.forget(b)
	if len(m.byName)+len(m.byIP) != 0 {
		t.Errorf("indexes not empty after both instances were forgotten: %v %v", m.byName, m.byIP)
	}
}

// BenchmarkMemoWaitFor500 is the bookkeeping of one plan of an instance
// with 500 BMCs that got none of its Services (the worst case; a plan that
// got all of them records nothing).
func BenchmarkMemoWaitFor500(b *testing.B) {
	m := newMemo()
	svcs := make([]*corev1.Service, 500)
	for i := range svcs {
		svcs[i] = memoService(fmt.Sprintf("mat-bmc-host-%d", i), "", fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
	}
	for b.Loop() {
		m.waitFor("ns.mat-a", svcs)
	}
}

// BenchmarkMemoDeleteEvent is one informer delete event while 500 Services
// are waited for.
func BenchmarkMemoDeleteEvent(b *testing.B) {
	m := newMemo()
	svcs := make([]*corev1.Service, 500)
	for i := range svcs {
		svcs[i] = memoService(fmt.Sprintf("mat-bmc-host-%d", i), "", fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
	}
	m.waitFor("ns.mat-a", svcs)
	h := m.handler()
	del := memoService("mat-bmc-host-7", "ns.mat-b", "10.1.0.8")
	for b.Loop() {
		h.OnDelete(del)
	}
}

// The delete of a Service that the instance's plan deletes is no change of
// its Services, whoever deletes it and however late it is seen; any other
// event is. A Service a later plan keeps counts again, and so does every
// Service of a forgotten instance.
func TestMemoExpectedDeletes(t *testing.T) {
	const a = "ns.mat-a"
	m := newMemo()
	h := m.handler()
	svc := func(name, uid string) *corev1.Service {
		s := memoService(name, a, "")
		s.UID = types.UID(uid)
		return s
	}
	x, y, z := svc("mat-bmc-host-x", "u-x"), svc("mat-bmc-host-y", "u-y"), svc("mat-bmc-host-z", "u-z")
	done := func() {
		t.Helper()
		m.completed(a, "fp", m.changeCount(a))
	}
	m.expect(a, []*corev1.Service{x, y})
	done()
	for _, tc := range []struct {
		name    string
		event   func()
		changed bool
	}{
		{"expected Service deleted", func() { h.OnDelete(x) }, false},
		{"expected Service's delete seen late", func() {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "bmc/mat-bmc-host-y", Obj: y})
		}, false},
		{"expected Service deleted a second time (its UID is used up)", func() { h.OnDelete(x) }, true},
		{"another Service of the instance deleted", func() { h.OnDelete(z) }, true},
		{"a re-created Service of an expected name (another UID) deleted", func() {
			m.expect(a, []*corev1.Service{x})
			h.OnDelete(svc("mat-bmc-host-x", "u-x2"))
		}, true},
		{"an expected Service updated", func() { h.OnUpdate(x, x) }, true},
		{"a Service an earlier plan deleted and the last keeps", func() {
			m.expect(a, []*corev1.Service{y})
			h.OnDelete(x)
		}, true},
		{"an expected Service of a forgotten instance", func() {
			m.expect(a, []*corev1.Service{z})
			m.forget(a)
			done()
			h.OnDelete(z)
		}, true},
	} {
		done()
		tc.event()
		if got := !m.unchanged(a, "fp"); got != tc.changed {
			t.Errorf("%s: changed = %v, want %v", tc.name, got, tc.changed)
		}
	}

	m.setDeferred(a, true)
	if !m.deferredPlan(a) {
		t.Error("deferred plan not recorded")
	}
	m.setDeferred(a, false)
	if m.deferredPlan(a) {
		t.Error("deferred plan recorded after a plan that published everything")
	}
}
