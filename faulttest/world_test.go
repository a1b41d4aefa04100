package faulttest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// Timing of the processes under test. AckWait is short so that the jobs of
// a killed worker come back quickly; handlers report progress every AckWait/3.
const (
	ackWait       = 3 * time.Second
	shutdownGrace = 3 * time.Second
	syncInterval  = 2 * time.Second
	errorWindow   = 10 * time.Second
)

// world is one test's system: a nats-server process, a namespace, MAT
// simulators, matbus processes and the test's own NATS connection, which
// collects every error event.
type world struct {
	t    *testing.T
	ctx  context.Context
	ns   string
	dir  string
	nats *natsProc
	// cluster, when set, replaces nats: a JetStream cluster whose streams
	// have replicas replicas (newClusterWorld).
	cluster  *natsCluster
	replicas int
	// idents are the NATS identities of the matbus processes by role
	// ("discovery", "worker", "reader"); none: no authentication.
	idents map[string]natsIdent
	nc     *nats.Conn
	bus    *events.Bus
	js     jetstream.JetStream // on nc, for reads and writes past the bus
	errs   *errSink
	log    *slog.Logger

	mu    sync.Mutex
	stops []func()
	procs []*proc
	seq   atomic.Int32
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldOn(t, 0, natsAuth{}, nil)
}

// newClusterWorld is newWorld on a JetStream cluster of n nats-server
// processes, every stream with n replicas.
func newClusterWorld(t *testing.T, n int) *world {
	t.Helper()
	return newWorldOn(t, n, natsAuth{}, nil)
}

// newWorldOn starts a world on one nats-server (nodes 0) or a cluster,
// started with auth's configuration file; the matbus processes connect with
// idents (by role), the test's own connection with auth.opts.
func newWorldOn(t *testing.T, nodes int, auth natsAuth, idents map[string]natsIdent) *world {
	t.Helper()
	requireSetup(t)
	leak := append(testenv.LeakOptions(), goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	w := &world{t: t, ctx: ctx, dir: t.TempDir(), ns: testenv.Namespace("f", t.Name()), idents: idents}
	var out io.Writer = io.Discard
	if os.Getenv("MATBUS_TEST_LOG") != "" {
		out = os.Stderr
	}
	w.log = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo})).With("part", "test")
	if _, err := adminKube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil {
		cancel()
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		w.mu.Lock()
		stops, procs := w.stops, w.procs
		w.stops, w.procs = nil, nil
		w.mu.Unlock()
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		for _, p := range procs {
			p.stop()
		}
		if t.Failed() {
			t.Logf("error events seen:\n%s", w.errs)
		}
		if w.nc != nil {
			w.nc.Close()
		}
		if w.nats != nil {
			w.nats.stop()
		}
		if w.cluster != nil {
			w.cluster.stop()
		}
		cancel()
		w.deleteNamespace()
		goleak.VerifyNone(t, leak...)
	})
	if nodes > 0 {
		w.cluster, w.replicas = startNATSCluster(t, w.dir, nodes, auth), nodes
	} else {
		w.nats = startNATS(t, w.dir, auth)
	}
	var err error
	w.nc, err = nats.Connect(w.natsURL(), append([]nats.Option{nats.Name("faulttest"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond), nats.RetryOnFailedConnect(true)}, auth.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	w.bus, err = events.New(w.nc, events.Config{Source: "faulttest", Replicas: w.replicas}, w.log)
	if err != nil {
		t.Fatal(err)
	}
	if w.js, err = jetstream.New(w.nc); err != nil {
		t.Fatal(err)
	}
	w.errs = &errSink{seen: map[string]bool{}}
	if _, err := w.nc.Subscribe(w.bus.Subjects().Errors(), w.errs.add); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// natsURL is what matbus processes get as --nats-url: the server's URL,
// or the cluster's URLs comma separated.
func (w *world) natsURL() string {
	if w.cluster != nil {
		return w.cluster.URL()
	}
	return w.nats.URL()
}

// natsIdent is a NATS identity: a user and password (given in the URL) or
// a credentials file (--nats-creds).
type natsIdent struct {
	user, password, creds string
}

// natsArgsAs are the NATS flags of a matbus process of role ("worker",
// "discovery", "reader"): the world's URL(s) and stream replicas, with the
// role's identity if the world has one.
func (w *world) natsArgsAs(role string) []string {
	url := w.natsURL()
	id, ok := w.idents[role]
	if ok && id.user != "" {
		var urls []string
		for _, u := range strings.Split(url, ",") {
			urls = append(urls, strings.Replace(u, "nats://", "nats://"+id.user+":"+id.password+"@", 1))
		}
		url = strings.Join(urls, ",")
	}
	args := []string{"--nats-url", url}
	if ok && id.creds != "" {
		args = append(args, "--nats-creds", id.creds)
	}
	if w.replicas > 1 && role != "reader" { // status and errors take no --stream-replicas
		args = append(args, "--stream-replicas", strconv.Itoa(w.replicas))
	}
	return args
}

// deleteNamespace deletes every Service of the namespace (no
// controller-manager runs to empty a terminating namespace, and the cluster
// IPs must be free for later tests), then the namespace.
func (w *world) deleteNamespace() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svcs := adminKube.CoreV1().Services(w.ns)
	for {
		list, err := svcs.List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			break
		}
		if ctx.Err() != nil {
			w.t.Errorf("cleanup: Services of %s not gone: %v", w.ns, err)
			return
		}
		if err == nil {
			parallel(16, len(list.Items), func(i int) {
				_ = svcs.Delete(ctx, list.Items[i].Name, metav1.DeleteOptions{})
			})
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := adminKube.CoreV1().Namespaces().Delete(ctx, w.ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		w.t.Errorf("cleanup: delete namespace: %v", err)
	}
}

// parallel runs f(0..n-1) with at most k at once.
func parallel(k, n int, f func(i int)) {
	sem := make(chan struct{}, k)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

func (w *world) onStop(f func()) {
	w.mu.Lock()
	w.stops = append(w.stops, f)
	w.mu.Unlock()
}

// key is the instance key of a static instance of this test.
func (w *world) key(name string) string { return w.ns + "." + name }

// ---- matbus processes ----

// workerArgs are the flags every test worker gets; extra ones follow and
// win (the flag package keeps the last value).
func (w *world) workerArgs(name, health string) []string {
	return append([]string{"worker", "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns,
		"--worker-name", name, "--health-addr", health,
		"--ack-wait", ackWait.String(), "--shutdown-grace", shutdownGrace.String(),
		"--service-cidr", cluster.ServiceCIDR, "--error-window", errorWindow.String(),
		"--kube-qps", "200", "--kube-burst", "400", "--mat-timeout", "5s",
		"--enable-state-annotations", // power state changes are the updates some tests wait for
	}, w.natsArgsAs("worker")...)
}

// startWorker starts a `matbus worker` process and waits until it is ready.
func (w *world) startWorker(name string, extra ...string) *proc {
	w.t.Helper()
	p := w.startWorkerNoWait(name, extra...)
	w.waitReady(p)
	return p
}

func (w *world) startWorkerNoWait(name string, extra ...string) *proc {
	w.t.Helper()
	health := "127.0.0.1:" + strconv.Itoa(freePort(w.t))
	p := startProc(w.t, w.dir, name, matbusBin, append(w.workerArgs(name, health), extra...)...)
	p.health = health
	w.addProc(p)
	return p
}

func (w *world) addProc(p *proc) {
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
}

func (w *world) waitReady(p *proc) {
	w.t.Helper()
	w.waitFor(p.name+" ready", 60*time.Second, func() (bool, string) {
		if p.Exited() {
			w.t.Fatalf("%s exited: %v\n%s", p.name, p.state, p.log.Tail(40))
		}
		return p.Ready(), "not ready"
	})
}

// startDiscovery starts a `matbus discovery` process with Kubernetes
// discovery of the test namespace and leader election on a short Lease.
func (w *world) startDiscovery(ident string, extra ...string) *proc {
	w.t.Helper()
	health := "127.0.0.1:" + strconv.Itoa(freePort(w.t))
	args := append([]string{"discovery", "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns,
		"--identity", ident, "--health-addr", health, "--mat-scheme", "http",
		"--sync-interval", syncInterval.String(), "--leader-elect",
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms",
		"--source-list-addr", "", // several discovery processes share this host
	}, w.natsArgsAs("discovery")...)
	p := startProc(w.t, w.dir, ident, matbusBin, append(args, extra...)...)
	p.health = health
	w.addProc(p)
	w.waitReady(p)
	return p
}

// ---- in-process discovery (the production Publisher on a static source) ----

// staticDiscovery runs discovery.Publisher on a static source in the test
// process, on its own NATS connection, so the test can change the set.
type staticDiscovery struct {
	w   *world
	src *discovery.StaticSource
	mu  sync.Mutex
	set map[string]discovery.StaticEntry
}

func (w *world) startStaticDiscovery(insts ...*instance) *staticDiscovery {
	w.t.Helper()
	d := &staticDiscovery{w: w, set: map[string]discovery.StaticEntry{}}
	for _, in := range insts {
		d.set[in.name] = in.entry()
	}
	var err error
	d.src, err = discovery.NewStatic("faulttest", d.entries())
	if err != nil {
		w.t.Fatal(err)
	}
	nc, err := nats.Connect(w.natsURL(), nats.Name("faulttest-discovery"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		w.t.Fatal(err)
	}
	bus, err := events.New(nc, events.Config{Source: "discovery/faulttest", Replicas: w.replicas}, w.log)
	if err != nil {
		w.t.Fatal(err)
	}
	pub := discovery.NewPublisher(bus, d.src, discovery.PublisherConfig{SyncInterval: syncInterval},
		events.NewReporter(bus, w.log, "discovery", 0), w.log.With("part", "discovery"))
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	w.onStop(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				w.t.Errorf("publisher: %v", err)
			}
		case <-time.After(30 * time.Second):
			w.t.Errorf("publisher did not stop")
		}
		nc.Close()
	})
	return d
}

func (d *staticDiscovery) entries() []discovery.StaticEntry {
	var out []discovery.StaticEntry
	for _, e := range d.set {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Add and Remove change the discovered set.
func (d *staticDiscovery) Add(insts ...*instance) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, in := range insts {
		d.set[in.name] = in.entry()
	}
	if err := d.src.Set(d.entries()); err != nil {
		d.w.t.Fatal(err)
	}
}

func (d *staticDiscovery) Remove(insts ...*instance) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, in := range insts {
		delete(d.set, in.name)
	}
	if err := d.src.Set(d.entries()); err != nil {
		d.w.t.Fatal(err)
	}
}

// ---- MAT instances: a matsim fleet behind a connection-counting server ----

// instance is one simulated MAT instance served over plain HTTP by the test
// process. open counts the TCP connections currently open to it.
type instance struct {
	w     *world
	name  string
	sim   *matsim.Server
	fleet *matsim.Fleet
	url   string
	srv   *http.Server
	open  atomic.Int64
	total atomic.Int64
	// reqs holds the arrival time of each status request being served.
	// maxInflight is the most requests open at once as the client saw
	// them: with clientLife set, a request served for longer than that no
	// longer counts, because its client has given up (a timeout) and the
	// server is only late in noticing the closed connection.
	reqMu       sync.Mutex
	reqs        map[uint64]time.Time
	reqSeq      uint64
	clientLife  time.Duration
	maxInflight atomic.Int64
}

// setClientLife sets how long a client waits for one status at most (see
// instance.clientLife); 0 counts a request as open until it is served.
func (in *instance) setClientLife(d time.Duration) {
	in.reqMu.Lock()
	in.clientLife = d
	in.reqMu.Unlock()
}

// requestStarted records a status request that arrived at now and raises
// maxInflight to the number open with it; the returned func records its end.
func (in *instance) requestStarted(now time.Time) (done func()) {
	in.reqMu.Lock()
	defer in.reqMu.Unlock()
	n := int64(1)
	for _, at := range in.reqs {
		if in.clientLife == 0 || now.Sub(at) < in.clientLife {
			n++
		}
	}
	if n > in.maxInflight.Load() {
		in.maxInflight.Store(n)
	}
	in.reqSeq++
	id := in.reqSeq
	in.reqs[id] = now
	return func() {
		in.reqMu.Lock()
		delete(in.reqs, id)
		in.reqMu.Unlock()
	}
}

var subnetBlock atomic.Int64 // /22 blocks handed out from 10.100.0.0

// subnetFor returns a fresh /22 in the service range for up to 1,022
// devices, so the fleets of all tests have distinct BMC IPs.
func subnetFor(t *testing.T, n int) string {
	if n > 1022 {
		t.Fatalf("a fleet of %d devices does not fit a /22", n)
	}
	k := uint32(subnetBlock.Add(1) - 1)
	v := uint32(10)<<24 | uint32(100)<<16 + k*1024
	if v>>16 > 10<<8|111 {
		t.Fatal("out of BMC subnets in 10.96.0.0/12")
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 22).String()
}

// fleetSpec sizes a generated fleet: hosts with one DPU each, plus switches
// and power shelves.
type fleetSpec struct{ hosts, switches, shelves int }

func (s fleetSpec) devices() int { return 2*s.hosts + s.switches + s.shelves }

// newInstance starts a simulated MAT instance with a generated fleet.
func (w *world) newInstance(name string, spec fleetSpec, slow time.Duration) *instance {
	w.t.Helper()
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: spec.hosts, DPUsPerHost: 1, Switches: spec.switches,
		PowerShelves: spec.shelves, IPMI: true, BMCSubnet: subnetFor(w.t, spec.devices()), Seed: int64(w.seq.Add(1))})
	if err != nil {
		w.t.Fatal(err)
	}
	// No NVOS IPs: every Service here is a BMC's, so counts are BMCs
	// (NVOS Services are tested in the worker package).
	for i := range fleet.Machines {
		fleet.Machines[i].NvosIP = ""
	}
	sim, err := matsim.New(matsim.Options{Fleet: fleet, SlowDelay: slow})
	if err != nil {
		w.t.Fatal(err)
	}
	in := &instance{w: w, name: name, sim: sim, fleet: fleet, reqs: map[uint64]time.Time{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	in.url = "http://" + ln.Addr().String()
	counting := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		defer in.requestStarted(time.Now())()
		sim.ServeHTTP(rw, r)
	})
	in.srv = &http.Server{Handler: counting, ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				in.open.Add(1)
				in.total.Add(1)
			case http.StateClosed, http.StateHijacked:
				in.open.Add(-1)
			}
		}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = in.srv.Serve(ln)
	}()
	w.onStop(func() {
		_ = in.srv.Close()
		<-done
		_ = sim.Close()
	})
	return in
}

func (in *instance) key() string { return in.w.key(in.name) }

func (in *instance) entry() discovery.StaticEntry {
	return discovery.StaticEntry{Namespace: in.w.ns, Name: in.name, URL: in.url}
}

// want returns the Service names the instance's current fleet asks for.
func (in *instance) want() []string {
	var out []string
	st := in.sim.Fleet().Status("", 1)
	st.Walk(func(d, _ *matclient.Device) {
		if d.BMC.IP != "" {
			out = append(out, plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID))
		}
	})
	sort.Strings(out)
	return out
}

// devices returns the devices of the instance's current fleet that have a
// BMC IP, by the name of their Service.
func (in *instance) devices() map[string]matclient.Device {
	out := map[string]matclient.Device{}
	in.sim.Fleet().Status("", 1).Walk(func(d, _ *matclient.Device) {
		if d.BMC.IP != "" {
			out[plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)] = *d
		}
	})
	return out
}

// services returns the instance's Services (by its instance label), name → Service.
func (in *instance) services() map[string]corev1.Service {
	in.w.t.Helper()
	return in.w.servicesBy(plan.InstanceSelector(plan.Options{}, in.key()).String())
}

func (w *world) servicesBy(selector string) map[string]corev1.Service {
	w.t.Helper()
	var list *corev1.ServiceList
	var err error
	for i := 0; i < 100; i++ { // the API server may be restarting
		list, err = adminKube.CoreV1().Services(w.ns).List(w.ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		w.t.Fatalf("list Services: %v", err)
	}
	out := make(map[string]corev1.Service, len(list.Items))
	for _, s := range list.Items {
		out[s.Name] = s
	}
	return out
}

// waitConverged waits until the instance has exactly the Services its fleet
// asks for and returns them.
func (in *instance) waitConverged(timeout time.Duration) map[string]corev1.Service {
	in.w.t.Helper()
	want := in.want()
	var got map[string]corev1.Service
	in.w.waitFor(fmt.Sprintf("%s: %d Services", in.name, len(want)), timeout, func() (bool, string) {
		got = in.services()
		return sameNames(got, want), diffNames(got, want)
	})
	return got
}

// waitGone waits until the instance has no Service left.
func (in *instance) waitGone(timeout time.Duration) {
	in.w.t.Helper()
	in.w.waitFor(in.name+": no Services", timeout, func() (bool, string) {
		n := len(in.services())
		return n == 0, fmt.Sprintf("%d left", n)
	})
}

func sameNames(got map[string]corev1.Service, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, n := range want {
		if _, ok := got[n]; !ok {
			return false
		}
	}
	return true
}

func diffNames(got map[string]corev1.Service, want []string) string {
	missing := 0
	for _, n := range want {
		if _, ok := got[n]; !ok {
			missing++
		}
	}
	return fmt.Sprintf("have %d, want %d, missing %d", len(got), len(want), missing)
}

// uidsOf maps Service names to UID/resourceVersion.
func uidsOf(svcs map[string]corev1.Service) map[string]string {
	out := make(map[string]string, len(svcs))
	for n, s := range svcs {
		out[n] = string(s.UID)
	}
	return out
}

// ---- waiting and measuring ----

// waitFor polls cond every 50 ms until it holds and returns how long that
// took; after timeout it fails the test with cond's last description.
func (w *world) waitFor(what string, timeout time.Duration, cond func() (bool, string)) time.Duration {
	w.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out after %v waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// consumerInfo reads the state of the job consumer of role
// (events.SyncConsumer or DeleteConsumer) of the test's namespace.
func (w *world) consumerInfo(stream, role string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	c, err := w.js.Consumer(ctx, w.bus.StreamName(events.Role(stream)), events.ConsumerName(role, w.ns))
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// streamMsgs is the number of messages stored in a stream.
func (w *world) streamMsgs(stream string) (uint64, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	s, err := w.js.Stream(ctx, w.bus.StreamName(events.Role(stream)))
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// sumMetric adds a metric over processes.
func sumMetric(t *testing.T, name string, ps ...*proc) (float64, []float64) {
	t.Helper()
	var sum float64
	var each []float64
	for _, p := range ps {
		m, err := p.Metrics()
		if err != nil {
			t.Fatalf("metrics of %s: %v", p.name, err)
		}
		sum += m[name]
		each = append(each, m[name])
	}
	return sum, each
}

// ---- error events ----

// errSink collects the error events published on mat.errors.>, once per
// event id (a publish retried after a lost acknowledgement arrives twice).
type errSink struct {
	mu   sync.Mutex
	seen map[string]bool
	list []errEvent
}

type errEvent struct {
	Subject string
	At      time.Time
	Err     events.Error
	Bad     string
}

func (s *errSink) add(m *nats.Msg) {
	ev := errEvent{Subject: m.Subject, At: time.Now()}
	env, err := events.Decode(m.Data)
	if err == nil {
		ev.Err, err = events.Into[events.Error](env, events.TypeError)
	}
	if err != nil {
		ev.Bad = err.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if env.ID != "" {
		if s.seen[env.ID] {
			return
		}
		s.seen[env.ID] = true
	}
	s.list = append(s.list, ev)
}

// All returns every event so far.
func (s *errSink) All() []errEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]errEvent(nil), s.list...)
}

// Since returns the events that arrived after t0.
func (s *errSink) Since(t0 time.Time) []errEvent {
	var out []errEvent
	for _, e := range s.All() {
		if !e.At.Before(t0) {
			out = append(out, e)
		}
	}
	return out
}

// Len returns how many events arrived.
func (s *errSink) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.list)
}

func (s *errSink) String() string {
	if s == nil {
		return "(none)"
	}
	return formatErrs(s.All())
}

func formatErrs(list []errEvent) string {
	var b strings.Builder
	for _, ev := range list {
		if ev.Bad != "" {
			fmt.Fprintf(&b, "  %s: INVALID: %s\n", ev.Subject, ev.Bad)
			continue
		}
		fmt.Fprintf(&b, "  %s %s: worker=%s instance=%s service=%s permanent=%v attempts=%d suppressed=%d: %s\n",
			ev.At.Format("15:04:05.000"), ev.Subject, ev.Err.Worker, ev.Err.Instance, ev.Err.Service, ev.Err.Permanent,
			ev.Err.Attempts, ev.Err.Suppressed, ev.Err.Message)
	}
	if b.Len() == 0 {
		return "  (none)\n"
	}
	return b.String()
}

// ---- Kubernetes discovery: MAT API Services pointing at the simulators ----

// discover creates the MAT API Service that `matbus discovery` finds for
// in: the default discovery label and the URL annotation naming the
// simulator (headless, so it takes no cluster IP from the BMC ranges).
func (w *world) discover(in *instance) {
	w.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: in.name, Namespace: w.ns,
			Labels:      map[string]string{"nvidia-infra-controller/mat-service": "true"},
			Annotations: map[string]string{discovery.URLAnnotation: in.url}},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}},
	}
	if _, err := adminKube.CoreV1().Services(w.ns).Create(w.ctx, svc, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("create MAT Service %s: %v", in.name, err)
	}
}

// undiscover deletes in's MAT API Service.
func (w *world) undiscover(in *instance) {
	w.t.Helper()
	if err := adminKube.CoreV1().Services(w.ns).Delete(w.ctx, in.name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatalf("delete MAT Service %s: %v", in.name, err)
	}
}

// instancePresent reports whether the instances stream holds an appeared
// record for in.
func (w *world) instancePresent(in *instance) bool {
	rec, found, err := w.bus.LastInstance(w.ctx, in.key())
	return err == nil && found && rec.Present()
}
