package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

// TestKubeSourceWithoutWatchOrList runs the discovery informer, on the
// real API server, under an identity whose Role lacks watch and then one
// that lacks list on Services. Without watch it still syncs by listing,
// but WatchHealth names "watch services: … cannot watch …", with one
// watch error event and one log line however often client-go retries;
// when watch is granted back it recovers with one more event, and a new
// MAT Service reaches the source through the watch. Without list it
// syncs through the watch alone (a watch-list request) and is healthy.
func TestKubeSourceWithoutWatch(t *testing.T) {
	cfg := startKubeConfig(t)
	admin := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	const ns, user = "mat-rbac", "matbus-discovery"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list"}}}}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setVerbs := func(verbs ...string) {
		t.Helper()
		r, err := admin.RbacV1().Roles(ns).Get(ctx, user, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.Rules[0].Verbs = verbs
		if _, err := admin.RbacV1().Roles(ns).Update(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(name string) {
		t.Helper()
		_, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia-infra-controller/mat-service": "true"}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	mk("mat-0-bmc-mock")
	rc := rest.CopyConfig(cfg)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	kube := kubernetes.NewForConfigOrDie(rc)

	nc := testenv.NATS(t)
	bus, err := events.New(nc, events.Config{Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	if _, err := nc.Subscribe(bus.Subjects().Error(events.ErrorWatch), func(m *nats.Msg) {
		env, err := events.Decode(m.Data)
		if err == nil {
			var e events.Error
			if e, err = events.Into[events.Error](env, events.TypeError); err == nil {
				mu.Lock()
				seen = append(seen, e.Message)
				mu.Unlock()
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	watchEvents := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
	logs := &testenv.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	start := func() *KubeSource {
		t.Helper()
		src, err := NewKube(kube, KubeConfig{Namespace: ns, Report: events.NewReporter(bus, log, "discovery-0", 0)}, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		if err := src.Run(sctx, func() {}); err != nil {
			t.Fatal(err)
		}
		return src
	}
	src := start()
	testenv.Wait(t, 20*time.Second, "synced by listing, watch refused", func() (bool, string) {
		insts, synced := src.Instances()
		err := src.WatchHealth().Err()
		return synced && len(insts) == 1 && err != nil && strings.HasPrefix(err.Error(), "watch services: ") &&
			strings.Contains(err.Error(), `cannot watch resource "services"`), fmt.Sprintf("synced %v, %d instances, health %v", synced, len(insts), err)
	})
	testenv.Wait(t, 10*time.Second, "one watch event", func() (bool, string) {
		evs := watchEvents()
		return len(evs) == 1 && strings.Contains(evs[0], `cannot watch resource "services"`), fmt.Sprintf("%q", evs)
	})
	// client-go retries (a list and a refused watch each time) after 0.8 s,
	// 1.6 s, …: more failures, no more events or log lines.
	testenv.Wait(t, 20*time.Second, "client-go to retry the watch", func() (bool, string) {
		n := src.WatchHealth().Failures()["watch"]
		return n >= 3, fmt.Sprintf("%d refused watches", n)
	})
	if evs := watchEvents(); len(evs) != 1 {
		t.Errorf("watch events while the watch keeps failing: %q, want one", evs)
	}
	if n := strings.Count(logs.String(), "kind=watch"); n != 1 {
		t.Errorf("%d log lines of kind watch, want one:\n%s", n, logs)
	}

	setVerbs("get", "list", "watch")
	testenv.Wait(t, 90*time.Second, "the watch to work again", func() (bool, string) {
		err := src.WatchHealth().Err()
		return err == nil, fmt.Sprintf("health %v", err)
	})
	testenv.Wait(t, 10*time.Second, "the end event", func() (bool, string) {
		evs := watchEvents()
		return len(evs) == 2 && strings.HasPrefix(evs[1], "list and watch services work again after "), fmt.Sprintf("%q", evs)
	})
	t.Logf("measured: %s (counting from the first refused call)", watchEvents()[1])
	mk("mat-1-bmc-mock")
	testenv.Wait(t, 20*time.Second, "the new Service through the watch", func() (bool, string) {
		insts, _ := src.Instances()
		return len(insts) == 2, fmt.Sprintf("%d instances", len(insts))
	})

	// Without list a new source still syncs: client-go streams the
	// initial objects through a watch (a watch-list request) where the API
	// server supports it, as this one does; only a plain list would fail.
	setVerbs("get", "watch")
	src2 := start()
	testenv.Wait(t, 20*time.Second, "synced through the watch alone", func() (bool, string) {
		insts, synced := src2.Instances()
		return synced && len(insts) == 2, fmt.Sprintf("synced %v, %d instances", synced, len(insts))
	})
	if err := src2.WatchHealth().Err(); err != nil {
		t.Errorf("health of a source that synced through the watch: %v", err)
	}
	if n := src2.WatchHealth().Failures()["list"]; n != 0 {
		t.Errorf("%d list calls failed, want none (the watch-list needs no list)", n)
	}
}
