package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// The integration tests of this package run the production pipeline on real
// parts: one kube-apiserver + etcd for the whole package (started on first
// use, stopped by TestMain), and per test an embedded NATS server with
// JetStream, its own namespace, matsim servers, a discovery publisher on a
// static source and one or more workers.

const (
	// waitTimeout bounds every wait for the system to converge.
	waitTimeout = 30 * time.Second
	// syncInterval is the publisher's tick: every instance gets a sync job this often.
	syncInterval = 500 * time.Millisecond
	// fixtureV2Mixed is the MAT status the fixture tests serve.
	fixtureV2Mixed = "../matclient/testdata/v2-mixed.json"
)

var (
	binDir, binErr = "", error(nil)

	clusterOnce sync.Once
	cluster     *kubelocal.Cluster
	clusterErr  error
	adminKube   kubernetes.Interface
)

func TestMain(m *testing.M) {
	binDir, binErr = kubelocal.FindBinaries()
	if binErr != nil && requireK8s() {
		fmt.Fprintf(os.Stderr, "worker tests: MATBUS_REQUIRE_K8S is set but %v\n", binErr)
		os.Exit(1)
	}
	code := m.Run()
	if cluster != nil {
		cluster.Stop()
	}
	os.Exit(code)
}

func requireK8s() bool { return os.Getenv("MATBUS_REQUIRE_K8S") != "" }

// requireCluster returns the package's API server, starting it on first use.
// Without binaries it skips the test (fails with MATBUS_REQUIRE_K8S set).
func requireCluster(t *testing.T) *kubelocal.Cluster {
	t.Helper()
	if binErr != nil {
		t.Skipf("integration test skipped: %v (set MATBUS_REQUIRE_K8S=1 to make this a failure)", binErr)
	}
	if testing.Short() && !requireK8s() {
		t.Skip("integration test skipped in -short mode")
	}
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, clusterErr = kubelocal.Start(ctx, kubelocal.Config{BinDir: binDir})
		if clusterErr == nil {
			adminKube, clusterErr = kubernetes.NewForConfig(restConfig(cluster.RESTConfig()))
		}
	})
	if clusterErr != nil {
		t.Fatalf("kubelocal: %v", clusterErr)
	}
	return cluster
}

// restConfig lifts client-go's default rate limit (5 QPS), as production does.
func restConfig(c *rest.Config) *rest.Config {
	c = rest.CopyConfig(c)
	c.QPS, c.Burst = 200, 400
	return c
}

// env is one test's world: namespace, NATS server, collected error events,
// and the parts the test starts. Everything is stopped, in reverse order of
// start, when the test ends; then no goroutine may be left behind.
type env struct {
	t     *testing.T
	ctx   context.Context
	ns    string
	kube  kubernetes.Interface // admin
	cidrs []netip.Prefix

	natsSrv *natsserver.Server
	nc      *nats.Conn
	bus     *events.Bus         // the test's own handle, for publishes and reads
	js      jetstream.JetStream // on nc, for raw publishes and stream reads past the bus
	errs    *errSink
	logs    *syncBuffer
	log     *slog.Logger

	mu    sync.Mutex
	stops []func()
}

func newEnv(t *testing.T) *env {
	t.Helper()
	c := requireCluster(t)
	// Goroutines that exist now (other packages' daemons, the shared API
	// client's connections) are not this test's.
	leakOpts := append(testenv.LeakOptions(), goleak.IgnoreCurrent())

	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, ctx: ctx, kube: adminKube, logs: &syncBuffer{}}
	var out io.Writer = e.logs
	if os.Getenv("MATBUS_TEST_LOG") != "" {
		out = io.MultiWriter(e.logs, os.Stderr)
	}
	e.log = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	cidr, err := netip.ParsePrefix(c.ServiceCIDR)
	if err != nil {
		t.Fatal(err)
	}
	e.cidrs = []netip.Prefix{cidr}

	e.ns = testenv.Namespace("t", t.Name())
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}},
		metav1.CreateOptions{}); err != nil {
		cancel()
		t.Fatalf("create namespace: %v", err)
	}

	t.Cleanup(func() {
		e.mu.Lock()
		stops := e.stops
		e.stops = nil
		e.mu.Unlock()
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		cancel()
		if e.nc != nil {
			e.nc.Close()
		}
		if e.natsSrv != nil {
			e.natsSrv.Shutdown()
		}
		e.deleteNamespace()
		if t.Failed() {
			t.Logf("error events seen:\n%s", e.errs)
			t.Logf("log (last 300 lines):\n%s", e.logs.Tail(300))
		}
		goleak.VerifyNone(t, leakOpts...)
	})

	e.natsSrv, err = natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	e.nc, e.bus = e.connect("test")
	if e.js, err = jetstream.New(e.nc); err != nil {
		t.Fatal(err)
	}
	if err := e.bus.EnsureStreams(ctx); err != nil {
		t.Fatalf("streams: %v", err)
	}
	e.errs = &errSink{}
	if _, err := e.nc.Subscribe(e.bus.Subjects().Errors(), e.errs.add); err != nil {
		t.Fatalf("subscribe errors: %v", err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return e
}

// deleteNamespace deletes every Service of the namespace (so their cluster
// IPs are free for the next test; no controller-manager runs to empty a
// terminating namespace) and then the namespace.
func (e *env) deleteNamespace() {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	svcs := e.kube.CoreV1().Services(e.ns)
	list, err := svcs.List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Errorf("cleanup: list Services: %v", err)
		return
	}
	for _, s := range list.Items {
		if err := svcs.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("cleanup: delete Service %s: %v", s.Name, err)
		}
	}
	for {
		list, err := svcs.List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			break
		}
		if ctx.Err() != nil {
			e.t.Errorf("cleanup: Services of %s not gone", e.ns)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := e.kube.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{}); err != nil {
		e.t.Errorf("cleanup: delete namespace: %v", err)
	}
}

func (e *env) onStop(f func()) {
	e.mu.Lock()
	e.stops = append(e.stops, f)
	e.mu.Unlock()
}

// connect opens a NATS connection and a Bus on it, as a separate process would.
func (e *env) connect(source string) (*nats.Conn, *events.Bus) {
	e.t.Helper()
	nc, err := nats.Connect(e.natsSrv.ClientURL(), nats.Name(source))
	if err != nil {
		e.t.Fatalf("nats connect: %v", err)
	}
	bus, err := events.New(nc, events.Config{Memory: true, Source: source, Namespace: e.ns}, e.log.With("part", source))
	if err != nil {
		nc.Close()
		e.t.Fatalf("bus: %v", err)
	}
	return nc, bus
}

// key is the instance key of a static instance of this test.
func (e *env) key(name string) string { return e.ns + "." + name }

// entry is a static instance in the test's namespace.
func (e *env) entry(name, url string) discovery.StaticEntry {
	return discovery.StaticEntry{Namespace: e.ns, Name: name, URL: url}
}

// startSim starts a matsim server on a free port.
func (e *env) startSim(opts matsim.Options) *matsim.Server {
	e.t.Helper()
	opts.Logger = e.log.With("part", "matsim")
	s, err := matsim.New(opts)
	if err != nil {
		e.t.Fatalf("matsim: %v", err)
	}
	if _, err := s.Start(e.ctx, "127.0.0.1:0"); err != nil {
		e.t.Fatalf("matsim start: %v", err)
	}
	e.onStop(func() {
		if err := s.Close(); err != nil {
			e.t.Errorf("matsim close: %v", err)
		}
	})
	return s
}

// fixtureFleet decodes a status fixture into a fleet, so that matsim can
// serve it and still change it device by device.
func fixtureFleet(t *testing.T, path string) *matsim.Fleet {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := matclient.Decode(b)
	if err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return &matsim.Fleet{InventoryID: st.InventoryID, Machines: st.Machines}
}

// generatedFleet is a small generated fleet with BMC IPs from subnet.
func generatedFleet(t *testing.T, subnet string, seed int64) *matsim.Fleet {
	t.Helper()
	f, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 1, PowerShelves: 1,
		IPMI: true, SSH: true, BMCSubnet: subnet, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// startDiscovery runs a Publisher of a static source with entries (see
// startPublisher).
func (e *env) startDiscovery(entries ...discovery.StaticEntry) *discovery.StaticSource {
	e.t.Helper()
	src, err := discovery.NewStatic("test", entries)
	if err != nil {
		e.t.Fatalf("static source: %v", err)
	}
	e.startPublisher(src)
	return src
}

// startPublisher runs a Publisher of src, ticking every syncInterval, as
// `matbus discovery` does while leading.
func (e *env) startPublisher(src discovery.Source) {
	e.t.Helper()
	e.startPublisherWith(src, discovery.PublisherConfig{SyncInterval: syncInterval})
}

// startPublisherWith runs a Publisher of src with cfg.
func (e *env) startPublisherWith(src discovery.Source, cfg discovery.PublisherConfig) {
	e.t.Helper()
	nc, bus := e.connect("discovery")
	log := e.log.With("part", "discovery")
	pub := discovery.NewPublisher(bus, src, cfg, events.NewReporter(bus, log, "discovery", 0), log)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	e.onStop(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("publisher: %v", err)
			}
		case <-time.After(waitTimeout):
			e.t.Errorf("publisher did not stop within %v", waitTimeout)
		}
		nc.Close()
	})
}

// workerOpts shape one test worker.
type workerOpts struct {
	Name string
	// Rest is the API client configuration; nil means the admin's.
	Rest *rest.Config
	// ClientTimeout is matclient's Timeout; 0 means 5 s.
	ClientTimeout time.Duration
	// Mat is the rest of the matclient configuration (TLS roots, a dial
	// hook); its Timeout is ClientTimeout's.
	Mat matclient.Config
	// CloseErr, when set, makes the Close of clients for that URL return it.
	CloseErr map[string]error
	// Tweak changes the worker configuration before New.
	Tweak func(*worker.Config)
}

// testWorker is a running worker with the factory that made its clients.
type testWorker struct {
	*worker.Worker
	clients *recFactory
	api     *apiCalls
	// Stop cancels Run and waits for it to return (once; cleanup calls it too).
	Stop func()
}

// startWorker starts a worker on its own NATS connection and waits until it
// is ready.
func (e *env) startWorker(o workerOpts) *testWorker {
	e.t.Helper()
	if o.Name == "" {
		o.Name = "worker"
	}
	rc := o.Rest
	if rc == nil {
		rc = cluster.RESTConfig()
	}
	calls := &apiCalls{n: map[string]int{}}
	rc = restConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return calls.wrap(rt) })
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		e.t.Fatal(err)
	}
	timeout := o.ClientTimeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	mcfg := o.Mat
	mcfg.Timeout = timeout
	f := &recFactory{cfg: mcfg, closeErr: o.CloseErr, byURL: map[string][]*recClient{}}
	cfg := worker.Config{
		Name:            o.Name,
		Plan:            plan.Options{Namespace: e.ns, IPMode: plan.IPModeClusterIP},
		RetryMaxElapsed: 2 * time.Second,
		ShutdownGrace:   3 * time.Second,
		InstanceResync:  5 * time.Second,
		Classifier:      worker.Classifier{ServiceCIDRs: e.cidrs},
	}
	if o.Tweak != nil {
		o.Tweak(&cfg)
	}
	nc, bus := e.connect(o.Name)
	log := e.log.With("part", o.Name)
	w, err := worker.New(cfg, bus, kube, f.New, nil, log)
	if err != nil {
		nc.Close()
		e.t.Fatalf("worker.New: %v", err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("worker %s: Run: %v", o.Name, err)
				}
			case <-time.After(waitTimeout):
				e.t.Errorf("worker %s did not stop within %v", o.Name, waitTimeout)
			}
			nc.Close()
		})
	}
	e.onStop(stop)
	waitFor(e.t, "worker "+o.Name+" ready", func() (bool, string) { return w.Ready(), "not ready" })
	return &testWorker{Worker: w, clients: f, api: calls, Stop: stop}
}

// apiCalls counts the worker's API requests by "METHOD resource[/name]"
// (watch and list requests are counted as GET of the collection).
type apiCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *apiCalls) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		// /api/v1/namespaces/<ns>/services[/<name>]
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		what := r.URL.Path
		if len(parts) >= 5 && parts[2] == "namespaces" {
			what = strings.Join(parts[4:], "/")
		}
		c.mu.Lock()
		c.n[r.Method+" "+what]++
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// Count returns how many requests "METHOD resource[/name]" were made.
func (c *apiCalls) Count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// recClient is a matclient.Client that counts Close calls and can fail them.
type recClient struct {
	*matclient.Client
	url      string
	closeErr error
	closes   atomic.Int32
}

func (c *recClient) Close() error {
	c.closes.Add(1)
	err := c.Client.Close()
	if c.closeErr != nil {
		return c.closeErr
	}
	return err
}

// recFactory wraps matclient.New and keeps every client it made.
type recFactory struct {
	cfg      matclient.Config
	closeErr map[string]error

	mu    sync.Mutex
	byURL map[string][]*recClient
}

func (f *recFactory) New(url string) (worker.StatusClient, error) {
	c, err := matclient.New(url, f.cfg)
	if err != nil {
		return nil, err
	}
	rc := &recClient{Client: c, url: url, closeErr: f.closeErr[url]}
	f.mu.Lock()
	f.byURL[url] = append(f.byURL[url], rc)
	f.mu.Unlock()
	return rc, nil
}

// For returns the clients made for url, oldest first.
func (f *recFactory) For(url string) []*recClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*recClient(nil), f.byURL[url]...)
}

// errSink collects the error events published on <prefix>.errors.>.
type errSink struct {
	mu   sync.Mutex
	list []errEvent
}

type errEvent struct {
	Subject string
	Err     events.Error
	Bad     string // set when the message was not a valid error event
}

func (s *errSink) add(m *nats.Msg) {
	ev := errEvent{Subject: m.Subject}
	env, err := events.Decode(m.Data)
	if err == nil {
		ev.Err, err = events.Into[events.Error](env, events.TypeError)
	}
	if err != nil {
		ev.Bad = err.Error()
	}
	s.mu.Lock()
	s.list = append(s.list, ev)
	s.mu.Unlock()
}

// Of returns the valid error events published on the subject of kind.
func (s *errSink) Of(kind events.ErrorKind) []events.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []events.Error
	for _, ev := range s.list {
		if ev.Bad == "" && ev.Subject == events.DefaultPrefix+".errors."+string(kind) {
			out = append(out, ev.Err)
		}
	}
	return out
}

// Bad returns messages on error subjects that were not valid error events.
func (s *errSink) Bad() []errEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []errEvent
	for _, ev := range s.list {
		if ev.Bad != "" {
			out = append(out, ev)
		}
	}
	return out
}

func (s *errSink) String() string {
	if s == nil {
		return "(none)"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, ev := range s.list {
		if ev.Bad != "" {
			fmt.Fprintf(&b, "  %s: INVALID: %s\n", ev.Subject, ev.Bad)
			continue
		}
		fmt.Fprintf(&b, "  %s: instance=%s service=%s url=%s permanent=%v attempts=%d suppressed=%d: %s\n",
			ev.Subject, ev.Err.Instance, ev.Err.Service, ev.Err.URL, ev.Err.Permanent, ev.Err.Attempts,
			ev.Err.Suppressed, ev.Err.Message)
	}
	return b.String()
}

// syncBuffer is a goroutine-safe log buffer.
type syncBuffer = testenv.Buffer

// waitFor polls cond until it holds, failing the test after waitTimeout
// with cond's last description of the state.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.Wait(t, waitTimeout, what, cond)
}

// services returns the Services of the test's namespace by name.
func (e *env) services() map[string]*corev1.Service {
	e.t.Helper()
	list, err := e.kube.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatalf("list Services: %v", err)
	}
	out := make(map[string]*corev1.Service, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// service returns one Service, or nil when it does not exist.
func (e *env) service(name string) *corev1.Service {
	e.t.Helper()
	s, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatalf("get Service %s: %v", name, err)
	}
	return s
}

// uids maps Service names to UIDs.
func uids(svcs map[string]*corev1.Service) map[string]string {
	out := make(map[string]string, len(svcs))
	for n, s := range svcs {
		out[n] = string(s.UID)
	}
	return out
}

func names(svcs map[string]*corev1.Service) []string {
	out := make([]string, 0, len(svcs))
	for n := range svcs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// waitServices waits until the namespace holds exactly want (by name).
func (e *env) waitServices(want ...string) map[string]*corev1.Service {
	e.t.Helper()
	sort.Strings(want)
	var got map[string]*corev1.Service
	waitFor(e.t, fmt.Sprintf("Services %v", want), func() (bool, string) {
		got = e.services()
		have := names(got)
		return strings.Join(have, ",") == strings.Join(want, ","), fmt.Sprintf("have %v", have)
	})
	return got
}

// waitSyncs waits until the worker has completed at least n more sync jobs than now.
func waitSyncs(t *testing.T, w *testWorker, n int64) {
	t.Helper()
	target := w.Stats().Syncs + n
	waitFor(t, fmt.Sprintf("%d more sync jobs", n), func() (bool, string) {
		s := w.Stats()
		return s.Syncs >= target, fmt.Sprintf("%+v", s)
	})
}

// wantServiceNames returns the Service names plan gives a fleet's devices
// with a BMC IP, and its switches with an NVOS IP.
func wantServiceNames(f *matsim.Fleet) []string {
	var out []string
	st := f.Status("", 1)
	st.Walk(func(d, _ *matclient.Device) {
		if d.BMC.IP != "" {
			out = append(out, plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID))
		}
		if d.Kind == matclient.KindSwitch && d.NvosIP != "" {
			out = append(out, plan.NVOSServiceName(d.MatID))
		}
	})
	sort.Strings(out)
	return out
}

var errInjectedClose = errors.New("injected close failure")

func errKind(s string) events.ErrorKind { return events.ErrorKind(s) }

// grant gives user the verbs on Services in the test's namespace through a
// Role and RoleBinding.
func (e *env) grant(user string, verbs ...string) {
	e.t.Helper()
	rbac := e.kube.RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: e.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: verbs}}}
	if _, err := rbac.Roles(e.ns).Create(e.ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create Role: %v", err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: e.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}
	if _, err := rbac.RoleBindings(e.ns).Create(e.ctx, rb, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create RoleBinding: %v", err)
	}
}
