package worker

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

// TestFreshDeletesSweepsExpiredEntries: a stale delete published within the
// duplicate window is not published again, an expired one is, whether or
// not it was swept yet; expired entries are swept at most once per eighth
// of the window, not on every plan.
func TestFreshDeletesSweepsExpiredEntries(t *testing.T) {
	bus, err := events.New(testenv.NATS(t), events.Config{Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{bus: bus}
	window := bus.Config().DuplicateWindow
	expired := time.Now().Add(-window - time.Second)
	const tag = "fp"
	key := func(uid string) string { return uid + staleSuffix(tag) }
	svc := func(uid string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s-" + uid, UID: types.UID(uid)}}
	}
	count := func() int {
		n := 0
		w.pendingDeletes.Range(func(any, any) bool { n++; return true })
		return n
	}
	names := func(svcs []*corev1.Service) []string {
		var out []string
		for _, s := range svcs {
			out = append(out, string(s.UID))
		}
		return out
	}

	for i := range 100 {
		w.pendingDeletes.Store(key(fmt.Sprintf("old-%d", i)), expired)
	}
	w.pendingDeletes.Store(key("recent"), time.Now())
	got := names(w.freshDeletes([]*corev1.Service{svc("recent"), svc("old-1"), svc("new")}, tag))
	if fmt.Sprint(got) != "[old-1 new]" {
		t.Errorf("fresh deletes = %v, want [old-1 new]: the recent one was published within the window", got)
	}
	if n := count(); n != 1 {
		t.Errorf("%d entries after the first sweep, want 1 (the recent one)", n)
	}

	// Within an eighth of the window: no sweep, but an expired entry is
	// still published again.
	for i := range 100 {
		w.pendingDeletes.Store(key(fmt.Sprintf("later-%d", i)), expired)
	}
	got = names(w.freshDeletes([]*corev1.Service{svc("recent"), svc("later-7")}, tag))
	if fmt.Sprint(got) != "[later-7]" {
		t.Errorf("fresh deletes = %v, want [later-7]", got)
	}
	if n := count(); n != 101 {
		t.Errorf("%d entries right after a sweep, want 101: a sweep ran again within %s", n, window/8)
	}

	// An eighth of the window later the next plan sweeps again.
	w.pendingSwept.Store(time.Now().Add(-window/8 - time.Second).UnixNano())
	w.freshDeletes(nil, tag)
	if n := count(); n != 1 {
		t.Errorf("%d entries after the second sweep, want 1", n)
	}
}
