package kuberate_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/kuberate"
)

var binDir, binErr = kubelocal.FindBinaries()

func TestMain(m *testing.M) {
	if binErr != nil && os.Getenv("MATBUS_REQUIRE_K8S") != "" {
		fmt.Fprintf(os.Stderr, "kuberate tests: MATBUS_REQUIRE_K8S is set but %v\n", binErr)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// rejecter is a reverse proxy in front of the API server that, while
// on, answers every other write with what API Priority and Fairness
// answers a rejected request: 429 with Retry-After: 1.
type rejecter struct {
	proxy    *httputil.ReverseProxy
	on       atomic.Bool
	n        atomic.Int64
	rejected atomic.Int64
}

func (p *rejecter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.on.Load() && r.Method == http.MethodPost && p.n.Add(1)%2 == 0 {
		p.rejected.Add(1)
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too many requests, please try again later","reason":"TooManyRequests","code":429}`)
		return
	}
	p.proxy.ServeHTTP(w, r)
}

// TestBacksOffOnRetryAfterAndRecovers: a client writing ConfigMaps as fast
// as its limiter lets it, through a proxy in front of a real API server,
// rides its rate up to the ceiling; while the proxy rejects every other
// write with 429 + Retry-After: 1 the limiter cuts its rate and pauses;
// when the rejections stop it climbs back to the ceiling; and every write
// succeeds in the end (client-go retries a 429 after its Retry-After).
func TestBacksOffOnRetryAfterAndRecovers(t *testing.T) {
	if binErr != nil {
		t.Skipf("needs the API server binaries: %v (set MATBUS_REQUIRE_K8S=1 to make this a failure)", binErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// kubelocal turns API Priority and Fairness off; this test needs its
	// response headers.
	cluster, err := kubelocal.Start(ctx, kubelocal.Config{BinDir: binDir, APIServerArgs: []string{"--enable-priority-and-fairness=true"}})
	if err != nil {
		t.Fatalf("kubelocal: %v", err)
	}
	defer cluster.Stop()

	target, err := url.Parse(cluster.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 100} // kubelocal's certificate is self-signed
	rej := &rejecter{proxy: rp}
	srv := httptest.NewTLSServer(rej)
	defer srv.Close()

	// The writer is a service account (bound to cluster-admin), so API
	// Priority and Fairness classifies its requests (the admin's
	// system:masters requests are exempt and carry no APF headers).
	admin, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Namespace("kr", t.Name())
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const sa = "writer"
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: srv.URL, BearerToken: tok.Status.Token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	const ceiling = 100
	lim, err := kuberate.New(kuberate.Config{MaxQPS: ceiling, InitialQPS: 20, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	lim.Apply(cfg)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// 8 writers, each creating ConfigMaps until stop.
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var created, failed atomic.Int64
	var firstErr atomic.Value
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; wctx.Err() == nil; i++ {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d-%d", w, i)}}
				if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				created.Add(1)
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	// 1. Rises to the ceiling from 20 req/s while the writers want more.
	waitStats(t, 10*time.Second, lim, "the rate reaches the ceiling", func(s kuberate.Stats) bool { return s.QPS == ceiling })
	before := lim.Stats()
	t.Logf("before: %.0f req/s, in-flight limit %d, baselines %v, APF priority level %q", before.QPS, before.InFlightLimit, before.Baselines, before.PriorityLevelUID)
	if before.PriorityLevelUID == "" || before.FlowSchemaUID == "" {
		t.Errorf("no API Priority and Fairness classification recorded: %+v", before)
	}

	// 2. Every other write rejected with Retry-After: 1.
	rej.on.Store(true)
	waitStats(t, 10*time.Second, lim, "a throttled decrease with a pause", func(s kuberate.Stats) bool {
		return s.Decreases[kuberate.ReasonThrottled] > 0 && s.PausedTotal >= time.Second && s.QPS <= ceiling/2
	})
	time.Sleep(2 * time.Second)
	during := lim.Stats()
	n0 := created.Load()
	t.Logf("during: %.0f req/s, in-flight limit %d, %d throttled decreases, paused %v in total, %d writes rejected",
		during.QPS, during.InFlightLimit, during.Decreases[kuberate.ReasonThrottled], during.PausedTotal, rej.rejected.Load())

	// 3. Recovers once the rejections stop.
	rej.on.Store(false)
	t1 := time.Now()
	waitStats(t, 15*time.Second, lim, "the rate back at the ceiling", func(s kuberate.Stats) bool { return s.QPS == ceiling })
	t.Logf("back at %d req/s %v after the last rejection; %d writes created meanwhile", ceiling, time.Since(t1).Round(10*time.Millisecond), created.Load()-n0)
	stop()
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Errorf("%d writes failed (first: %v); client-go should have retried every 429 after its Retry-After", f, firstErr.Load())
	}
	if rej.rejected.Load() == 0 || created.Load() == 0 {
		t.Fatalf("rejected %d, created %d", rej.rejected.Load(), created.Load())
	}
}

func waitStats(t *testing.T, d time.Duration, l *kuberate.Limiter, what string, cond func(kuberate.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond(l.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %+v", what, d, l.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
