package main

// The noisy-neighbour scenario (--neighbour, on by default): how much a
// bulk converge hurts another tenant of the same API server.
//
// The neighbour is a second client of its own (user agent
// "matbus-bench-neighbour", no client-side rate limit) in a namespace of
// its own. It sends, open loop at a fixed rate (--neighbour-rate, 40
// requests/s: a slow API server does not make it send fewer), a cycle of
// three requests: an update (PUT) of one of 20 ConfigMaps, a GET of one,
// and a LIST of all 20. Each request's latency is measured from sending to
// the response.
//
// It is measured three times per repetition:
//
//	(a) alone: over a window of neighbourAlone with nothing else running
//	    (after the floor, before any round);
//	(b) during a converge of the N floor Services by the old controller's
//	    budget: a client-go client with QPS 100 / burst 200, 50 calls in
//	    flight, in a namespace of its own;
//	(c) during a converge of the same N Services by matbus with its
//	    default flags: after a round's delete fan-out (every simulator
//	    empty, workers and discovery running), every simulator gets its
//	    base fleet back.
//
// The windows of (b) and (c) are the same work: the span in which the N
// Services are written, from the first to the last. For (b) that is from
// the first create sent to the last create answered; for (c) from the
// watch event of the first of the N Services to the watch event of the
// last (the poll that sees the new fleets, up to 1 s, is not in it). The
// samples of a window are the neighbour's requests sent inside it. A
// rise is a window's p50 or p99 ÷ the same percentile alone. A faster
// converge has a shorter window and so fewer samples (the table gives
// the count): at 40 requests/s a 3.5 s window holds about 140, so its
// p99 is about its second-slowest request.
//
// On the local API server every client is the admin (system:masters),
// which API Priority and Fairness exempts: the neighbour's latency here
// measures CPU contention in the API server and etcd, not APF queueing.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/matsim"
)

const (
	neighbourAlone      = 5 * time.Second // window (a)
	neighbourConfigMaps = 20
	neighbourWarmup     = time.Second // neighbour traffic before a window opens
	oldControllerQPS    = 100         // (b): the old controller's budget
	oldControllerBurst  = 200
)

// neighbourWindow is the neighbour's latency over one window.
type neighbourWindow struct {
	Seconds float64 `json:"seconds"` // window length
	N       int     `json:"requests"`
	Failed  int     `json:"failed,omitempty"`
	P50     float64 `json:"p50_seconds"`
	P99     float64 `json:"p99_seconds"`
	// Converge is the bulk converge that defined the window ((b) and (c)).
	Converge *phase `json:"converge,omitempty"`
}

// neighbourFloor is what one repetition measured of (a) and (b).
type neighbourFloor struct {
	Alone *neighbourWindow `json:"alone,omitempty"`
	Fixed *neighbourWindow `json:"fixed_qps_100,omitempty"`
}

// neighbour is a running neighbour client.
type neighbour struct {
	kube kubernetes.Interface
	ns   string
	mu   sync.Mutex
	reqs []neighbourReq
}

type neighbourReq struct {
	sent    time.Time
	latency time.Duration
	failed  bool
}

// newNeighbour creates the neighbour's namespace and ConfigMaps.
func (b *bench) newNeighbour(ctx context.Context, ns string) (*neighbour, error) {
	cfg := b.cluster.RESTConfig()
	cfg.UserAgent = "matbus-bench-neighbour"
	cfg.QPS = -1
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := b.createNamespace(ctx, ns); err != nil {
		return nil, err
	}
	for i := range neighbourConfigMaps {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "n-" + strconv.Itoa(i)}, Data: map[string]string{"v": "0"}}
		if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("neighbour: create ConfigMap: %w", err)
		}
	}
	return &neighbour{kube: kube, ns: ns}, nil
}

// run sends the neighbour's requests at rate per second until ctx ends;
// it returns when every request sent has been answered.
func (n *neighbour) run(ctx context.Context, rate float64) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	cms := n.kube.CoreV1().ConfigMaps(n.ns)
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			name := "n-" + strconv.Itoa(i%neighbourConfigMaps)
			t := time.Now()
			var err error
			switch i % 3 {
			case 0:
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": strconv.Itoa(i)}}
				_, err = cms.Update(rctx, cm, metav1.UpdateOptions{}) // no resourceVersion: unconditional
			case 1:
				_, err = cms.Get(rctx, name, metav1.GetOptions{})
			default:
				_, err = cms.List(rctx, metav1.ListOptions{})
			}
			r := neighbourReq{sent: t, latency: time.Since(t), failed: err != nil}
			n.mu.Lock()
			n.reqs = append(n.reqs, r)
			n.mu.Unlock()
		}()
	}
}

// window summarizes the requests sent in [from, to].
func (n *neighbour) window(from, to time.Time) *neighbourWindow {
	n.mu.Lock()
	defer n.mu.Unlock()
	w := &neighbourWindow{Seconds: to.Sub(from).Seconds()}
	var ds []time.Duration
	for _, r := range n.reqs {
		if r.sent.Before(from) || r.sent.After(to) {
			continue
		}
		if r.failed {
			w.Failed++
			continue
		}
		ds = append(ds, r.latency)
	}
	w.N = len(ds)
	w.P50, w.P99 = percentile(ds, 50).Seconds(), percentile(ds, 99).Seconds()
	return w
}

// during runs the neighbour around measure, which returns the window's
// bounds; it returns the neighbour's latency in that window.
func (b *bench) during(ctx context.Context, ns string, measure func(ctx context.Context) (from, to time.Time, conv *phase, err error)) (*neighbourWindow, error) {
	n, err := b.newNeighbour(ctx, ns)
	if err != nil {
		return nil, err
	}
	defer b.cleanNamespace(ns)
	nctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.run(nctx, b.cfg.NeighbourRate) }()
	defer func() { stop(); <-done }()
	select {
	case <-ctx.Done():
		return nil, nil
	case <-time.After(neighbourWarmup):
	}
	from, to, conv, err := measure(ctx)
	if err != nil || from.IsZero() || to.IsZero() {
		return nil, err
	}
	stop()
	<-done
	w := n.window(from, to)
	w.Converge = conv
	return w, nil
}

// neighbourFloor measures (a) and (b) of repetition rep.
func (b *bench) neighbourFloor(ctx context.Context, rep int) error {
	if !b.cfg.Neighbour || len(b.result.Floors) == 0 {
		return nil
	}
	nf := &neighbourFloor{}
	b.result.Floors[len(b.result.Floors)-1].Neighbour = nf
	var err error
	nf.Alone, err = b.during(ctx, fmt.Sprintf("bench-neighbour-a%d", rep), func(ctx context.Context) (time.Time, time.Time, *phase, error) {
		from := time.Now()
		select {
		case <-ctx.Done():
		case <-time.After(neighbourAlone):
		}
		return from, time.Now(), nil, nil
	})
	if err != nil {
		return err
	}
	if nf.Alone != nil {
		b.logf("neighbour alone: %s", nf.Alone)
	}
	ns := fmt.Sprintf("bench-fixed-r%d", rep)
	if err := b.createNamespace(ctx, ns); err != nil {
		return err
	}
	defer b.cleanNamespace(ns)
	cfg := b.cluster.RESTConfig()
	cfg.UserAgent = "matbus-bench-fixed-qps"
	cfg.QPS, cfg.Burst = oldControllerQPS, oldControllerBurst
	fixed, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	svcs := floorServices(ns, b.fleets.base)
	nf.Fixed, err = b.during(ctx, fmt.Sprintf("bench-neighbour-b%d", rep), func(ctx context.Context) (time.Time, time.Time, *phase, error) {
		cctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		defer cancel()
		from := time.Now()
		t := floorCreate(cctx, fixed, svcs, b.cfg.InFlight)
		p := &phase{Seconds: t.Seconds, Count: len(svcs), TimedOut: t.TimedOut}
		if t.Failed > 0 || t.TimedOut {
			p.TimedOut, p.Why, p.Missing = true, fmt.Sprintf("%d of %d creates failed", t.Failed, len(svcs)), t.Failed
		}
		return from, from.Add(time.Duration(t.Seconds * float64(time.Second))), p, nil
	})
	if err != nil {
		return err
	}
	if nf.Fixed != nil {
		b.logf("neighbour during a QPS-%d client's %d creates: %s", oldControllerQPS, len(svcs), nf.Fixed)
	}
	return nil
}

// neighbourRound measures (c) in a round whose fleets are all empty (after
// the delete fan-out): every simulator gets its base fleet back, and the
// neighbour's window spans the first to the last of its Services' watch
// events; then the fleets are emptied again and the Services awaited gone.
func (b *bench) neighbourRound(ctx context.Context, r *roundResult, tr *tracker, sims []simulator, cur []*matsim.Fleet, alive func() error, tag string) error {
	if !b.cfg.Neighbour || ctx.Err() != nil {
		return nil
	}
	idx := len(b.result.Rounds)
	var err error
	r.Neighbour, err = b.during(ctx, fmt.Sprintf("bench-neighbour-c%d", idx), func(ctx context.Context) (time.Time, time.Time, *phase, error) {
		names := allNames(b.fleets.base)
		w := tr.Expect(names, true)
		first := make(chan time.Time, 1)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { // the first Service's watch event, from the informer's cache
			for wctx.Err() == nil {
				if tr.Count() > 0 {
					first <- time.Now()
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
		t0 := time.Now()
		for i, s := range sims {
			if err := s.SetFleet(b.fleets.base[i]); err != nil {
				return time.Time{}, time.Time{}, nil, err
			}
			cur[i] = b.fleets.base[i].Clone()
		}
		p := b.await(ctx, tr, w, t0, alive, tag, fmt.Sprintf("converge with the neighbour: %d Services", len(names)))
		if p.TimedOut {
			return time.Time{}, time.Time{}, p, nil
		}
		var from time.Time
		select {
		case from = <-first:
		case <-ctx.Done():
			return time.Time{}, time.Time{}, p, nil
		}
		to := t0.Add(time.Duration(p.Seconds * float64(time.Second)))
		p.Seconds = to.Sub(from).Seconds()
		return from, to, p, nil
	})
	if err != nil {
		return err
	}
	if r.Neighbour != nil {
		b.logf("%s: neighbour during matbus's converge: %s", tag, r.Neighbour)
	}
	// Empty again, so that the namespace's clean-up has little to do.
	w := tr.Expect(allNames(cur), false)
	t0 := time.Now()
	for i, s := range sims {
		empty := &matsim.Fleet{InventoryID: cur[i].InventoryID}
		if err := s.SetFleet(empty); err != nil {
			return err
		}
		cur[i] = empty
	}
	b.await(ctx, tr, w, t0, alive, tag, "delete after the neighbour's converge")
	return nil
}

func (w *neighbourWindow) String() string {
	if w == nil {
		return "not measured"
	}
	return fmt.Sprintf("%d requests in %.2fs (%d failed), p50 %.1f ms, p99 %.1f ms", w.N, w.Seconds, w.Failed, w.P50*1e3, w.P99*1e3)
}

// neighbourRows are the table rows of the scenario (none when it is off):
// each compares the neighbour's latency during matbus's converge with its
// latency alone (the ratio is the rise) and with its latency during the
// QPS-100 client's converge (the ratio is matbus's rise over the old
// budget's; ≤ 1× means matbus hurts the neighbour no more).
func neighbourRows(r *result) []rowDef {
	if !r.Config.Neighbour {
		return nil
	}
	pick := func(w *neighbourWindow, p99 bool) *float64 {
		if w == nil || w.N == 0 {
			return nil
		}
		if p99 {
			return ptr(w.P99 * 1e3)
		}
		return ptr(w.P50 * 1e3)
	}
	alone := func(p99 bool) func(*floorResult) *float64 {
		return func(f *floorResult) *float64 {
			if f.Neighbour == nil {
				return nil
			}
			return pick(f.Neighbour.Alone, p99)
		}
	}
	fixed := func(p99 bool) func(*floorResult) *float64 {
		return func(f *floorResult) *float64 {
			if f.Neighbour == nil {
				return nil
			}
			return pick(f.Neighbour.Fixed, p99)
		}
	}
	ours := func(p99 bool) func(*roundResult) (*float64, string) {
		return func(x *roundResult) (*float64, string) { return pick(x.Neighbour, p99), "" }
	}
	n := r.Config.Services
	return []rowDef{
		{"9. neighbour p50 (floor: alone; matbus: during its converge)", "ms", alone(false), ours(false)},
		{"9. neighbour p99 (floor: alone; matbus: during its converge)", "ms", alone(true), ours(true)},
		{fmt.Sprintf("9. neighbour p50 (floor: during a QPS-%d client's converge; matbus: during its)", oldControllerQPS), "ms", fixed(false), ours(false)},
		{fmt.Sprintf("9. neighbour p99 (floor: during a QPS-%d client's converge; matbus: during its)", oldControllerQPS), "ms", fixed(true), ours(true)},
		{fmt.Sprintf("9. neighbour's window: %d Services written (floor: QPS-%d client; matbus)", n, oldControllerQPS), "s",
			func(f *floorResult) *float64 {
				if f.Neighbour == nil || f.Neighbour.Fixed == nil {
					return nil
				}
				return ptr(f.Neighbour.Fixed.Seconds)
			},
			func(x *roundResult) (*float64, string) {
				if x.Neighbour == nil {
					return nil, ""
				}
				return ptr(x.Neighbour.Seconds), ""
			}},
		{fmt.Sprintf("9. neighbour requests in the window (floor: QPS-%d client; matbus)", oldControllerQPS), "req",
			func(f *floorResult) *float64 {
				if f.Neighbour == nil || f.Neighbour.Fixed == nil {
					return nil
				}
				return ptr(float64(f.Neighbour.Fixed.N))
			},
			func(x *roundResult) (*float64, string) {
				if x.Neighbour == nil {
					return nil, ""
				}
				return ptr(float64(x.Neighbour.N)), ""
			}},
	}
}
