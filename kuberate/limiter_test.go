package kuberate

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeServer is a RoundTripper that answers on a fake clock: each
// request takes latency (the clock steps by it) and gets status and
// headers.
type fakeServer struct {
	clk     *testingclock.FakeClock
	mu      sync.Mutex
	latency time.Duration
	status  int
	header  http.Header
	calls   int
}

func (f *fakeServer) set(status int, latency time.Duration, header http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.latency, f.header = status, latency, header
}

func (f *fakeServer) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.calls++
	lat, status, h := f.latency, f.status, f.header.Clone()
	f.mu.Unlock()
	if status == 0 {
		status = 200
	}
	if h == nil {
		h = http.Header{}
	}
	f.clk.Step(lat)
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
}

func newTest(t *testing.T, cfg Config) (*Limiter, *fakeServer, http.RoundTripper) {
	t.Helper()
	clk := testingclock.NewFakeClock(t0)
	cfg.Clock = clk
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &fakeServer{clk: clk, latency: 10 * time.Millisecond}
	return l, srv, l.Wrap(srv)
}

func send(t *testing.T, rt http.RoundTripper, method, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

const svcURL = "https://api.test/api/v1/namespaces/ns/services"

func TestConfigDefaultsAndErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"no ceiling", Config{}, false},
		{"negative ceiling", Config{MaxQPS: -1}, false},
		{"tolerance 1", Config{MaxQPS: 10, Tolerance: 1}, false},
		{"backoff 1", Config{MaxQPS: 10, Backoff: 1}, false},
		{"ceiling only", Config{MaxQPS: 10}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%+v) = %v, want ok %v", tc.cfg, err, tc.ok)
			}
		})
	}
	l, err := New(Config{MaxQPS: 1000, InitialQPS: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.QPS != 1000 || s.InFlightLimit != 16 || s.MaxInFlight != 64 {
		t.Errorf("defaults: QPS %v (want the ceiling 1000), in-flight limit %d of %d (want 16 of 64)", s.QPS, s.InFlightLimit, s.MaxInFlight)
	}
}

// The rate rises by RateIncrease × Interval per period only when a
// request found the bucket empty, never above MaxQPS.
func TestRateRisesOnlyWhileDemandHitsIt(t *testing.T) {
	l, _, _ := newTest(t, Config{MaxQPS: 130, InitialQPS: 100, Burst: 10, RateIncrease: 200})
	clk := l.clk.(*testingclock.FakeClock)
	// A period without demand: no rise.
	clk.Step(100 * time.Millisecond)
	if !l.TryAccept() {
		t.Fatal("the first token is refused")
	}
	clk.Step(100 * time.Millisecond)
	l.TryAccept()
	if q := l.QPS(); q != 100 {
		t.Fatalf("QPS %v after a period without waits, want 100", q)
	}
	// Empty the bucket: demand hits the limit.
	for l.TryAccept() {
	}
	clk.Step(100 * time.Millisecond)
	l.TryAccept()
	if q := l.QPS(); q != 120 {
		t.Fatalf("QPS %v after a saturated period, want 100 + 200/s × 0.1 s = 120", q)
	}
	for range 3 {
		for l.TryAccept() {
		}
		clk.Step(100 * time.Millisecond)
		l.TryAccept()
	}
	if q := l.QPS(); q != 130 {
		t.Fatalf("QPS %v, want the ceiling 130", q)
	}
}

// A 429 with Retry-After pauses every new request for that long and halves
// the rate (from what was achieved) and the in-flight limit; one decrease
// per period however many 429s arrive.
func TestRetryAfterPausesAndBacksOff(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 400, InitialQPS: 400, Burst: 400, InitialInFlight: 20})
	// 20 answered in a 100 ms period: 200 req/s achieved.
	srv.set(200, 4*time.Millisecond, nil)
	for range 20 {
		send(t, rt, http.MethodPost, svcURL)
	}
	srv.clk.Step(20 * time.Millisecond)
	l.TryAccept() // ends the period
	srv.set(429, time.Millisecond, http.Header{"Retry-After": {"2"}})
	for range 5 {
		send(t, rt, http.MethodPost, svcURL)
	}
	s := l.Stats()
	if s.Decreases[ReasonThrottled] != 1 {
		t.Fatalf("decreases %v, want one throttled decrease for one burst of 429s", s.Decreases)
	}
	if s.QPS != 100 {
		t.Errorf("QPS %v, want half the 200 req/s achieved", s.QPS)
	}
	if s.InFlightLimit != 2 {
		t.Errorf("in-flight limit %d, want MinInFlight 2 (half of the 1 in use, floored)", s.InFlightLimit)
	}
	if s.Paused <= 1990*time.Millisecond || s.Paused > 2*time.Second {
		t.Errorf("paused %v, want about 2 s", s.Paused)
	}
	if l.TryAccept() {
		t.Fatal("TryAccept during the Retry-After pause")
	}
	srv.clk.Step(2 * time.Second)
	if !l.TryAccept() {
		t.Fatal("TryAccept refused after the pause")
	}
}

// After the pushback stops, the limits climb back while demand hits them.
func TestRecoversAfterPushback(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 100, InitialQPS: 100, Burst: 5, RateIncrease: 100})
	srv.set(503, time.Millisecond, nil)
	send(t, rt, http.MethodPost, svcURL)
	if s := l.Stats(); s.Decreases[ReasonOverload] != 1 || s.QPS >= 100 {
		t.Fatalf("after a 503: %+v, want an overload decrease", s)
	}
	srv.set(200, time.Millisecond, nil)
	for range 30 {
		for l.TryAccept() {
		}
		srv.clk.Step(100 * time.Millisecond)
	}
	if q := l.QPS(); q != 100 {
		t.Fatalf("QPS %v 3 s after the last 503 with demand above the rate, want the ceiling 100", q)
	}
}

// Writes slower than Tolerance × their baseline lower the in-flight
// limit; reads and watches, however slow, do not count.
func TestLatencyRiseLowersInFlight(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 1000, InitialInFlight: 10, MaxInFlight: 10, MinInFlight: 1})
	held := holdSlots(t, l, 9) // 10 in use with the request below
	for range 5 {
		send(t, rt, http.MethodPost, svcURL) // baseline 10 ms
	}
	srv.clk.Step(100 * time.Millisecond)
	send(t, rt, http.MethodPost, svcURL)
	srv.set(200, time.Second, nil)
	send(t, rt, http.MethodGet, svcURL)                             // a slow read
	send(t, rt, http.MethodGet, svcURL+"?watch=true")               // a slow watch
	send(t, rt, http.MethodGet, "https://api.test/api/v1/watch/ns") // old-style watch
	srv.set(200, 0, nil)
	srv.clk.Step(100 * time.Millisecond)
	l.TryAccept()
	if s := l.Stats(); s.Decreases[ReasonLatency] != 0 || s.InFlightLimit != 10 {
		t.Fatalf("slow reads and watches: %+v, want no decrease", s)
	}
	srv.set(200, 45*time.Millisecond, nil) // 4.5× the baseline
	send(t, rt, http.MethodPost, svcURL)
	srv.set(200, 5*time.Millisecond, nil)
	send(t, rt, http.MethodDelete, svcURL+"/a") // first DELETE: its own baseline, ratio 1
	srv.set(200, 45*time.Millisecond, nil)
	send(t, rt, http.MethodPost, svcURL)
	srv.clk.Step(100 * time.Millisecond)
	l.TryAccept()
	s := l.Stats()
	if s.Decreases[ReasonLatency] != 1 || s.InFlightLimit != 8 {
		t.Fatalf("writes at (4.5+1+4.5)/3 ≈ 3.3× the baseline: %+v, want one latency decrease to 10 × 0.8 = 8", s)
	}
	if s.Baselines["POST"] != 10*time.Millisecond || s.Baselines["DELETE"] != 5*time.Millisecond {
		t.Errorf("baselines %v, want POST 10ms and DELETE 5ms", s.Baselines)
	}
	held()
}

// holdSlots takes n in-flight slots and returns a func giving them back.
func holdSlots(t *testing.T, l *Limiter, n int) func() {
	t.Helper()
	for range n {
		if err := l.acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for range n {
			l.release()
		}
	}
}

// The in-flight limit rises by one per period in which a request took the
// last slot or waited for one, up to MaxInFlight; a waiter is let through
// when a slot frees, and gives up when its context ends.
func TestInFlightGate(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 1000, InitialInFlight: 2, MaxInFlight: 3})
	release := holdSlots(t, l, 2)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- l.acquire(ctx) }()
	waitFor(t, func() bool { return l.Stats().Waiting == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire after cancel: %v", err)
	}
	go func() { errc <- l.acquire(context.Background()) }()
	waitFor(t, func() bool { return l.Stats().Waiting == 1 })
	srv.clk.Step(100 * time.Millisecond)
	l.TryAccept() // ends the saturated period: limit 3, the waiter gets a slot
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.InFlightLimit != 3 || s.InFlight != 3 {
		t.Fatalf("after a saturated period: %+v, want limit 3 with 3 in flight", s)
	}
	srv.clk.Step(100 * time.Millisecond)
	l.TryAccept()
	if s := l.Stats(); s.InFlightLimit != 3 {
		t.Fatalf("limit %d, want the ceiling 3", s.InFlightLimit)
	}
	release()
	l.mu.Lock()
	l.release()
	l.mu.Unlock()
	send(t, rt, http.MethodGet, svcURL)
}

// The APF headers of the responses are recorded and exported with the
// limits on the registry passed in.
func TestAPFAndMetrics(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 50})
	h := http.Header{}
	h.Set(HeaderFlowSchemaUID, "fs-1")
	h.Set(HeaderPriorityLevelUID, "pl-1")
	srv.set(200, time.Millisecond, h)
	send(t, rt, http.MethodPost, svcURL)
	send(t, rt, http.MethodGet, svcURL+"?watch=true")
	s := l.Stats()
	if s.PriorityLevelUID != "pl-1" || s.FlowSchemaUID != "fs-1" || s.Responses[[2]string{"fs-1", "pl-1"}] != 2 {
		t.Fatalf("APF: %+v", s)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(l.Collector("matbus")); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP matbus_kube_apf_responses_total Kubernetes API responses by the API Priority and Fairness flow schema and priority level UIDs they carried.
# TYPE matbus_kube_apf_responses_total counter
matbus_kube_apf_responses_total{flow_schema_uid="fs-1",priority_level_uid="pl-1"} 2
# HELP matbus_kube_rate_limit_qps Current client-side rate limit of Kubernetes API requests, requests/s.
# TYPE matbus_kube_rate_limit_qps gauge
matbus_kube_rate_limit_qps 50
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "matbus_kube_apf_responses_total", "matbus_kube_rate_limit_qps"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 11 {
		t.Fatalf("%d series (%v), want every metric", n, err)
	}
}

// Wait blocks for the token's delay on the limiter's clock and gives up
// with the context.
func TestWait(t *testing.T) {
	l, srv, _ := newTest(t, Config{MaxQPS: 10, Burst: 1})
	if err := l.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(context.Background()) }()
	waitFor(t, func() bool { return srv.clk.HasWaiters() })
	srv.clk.Step(100 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- l.Wait(ctx) }()
	waitFor(t, func() bool { return srv.clk.HasWaiters() })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: %v", err)
	}
	l.Stop()
	if err := l.Wait(context.Background()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Wait after Stop: %v", err)
	}
}

func TestRetryAfterParsing(t *testing.T) {
	now := t0
	for v, want := range map[string]time.Duration{
		"":     0,
		"3":    3 * time.Second,
		"0":    0,
		"junk": 0,
		now.Add(5 * time.Second).Format(http.TimeFormat): 5 * time.Second,
	} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestMinWindow(t *testing.T) {
	w := &minWindow{window: time.Minute}
	w.add(t0, 10*time.Millisecond)
	w.add(t0.Add(30*time.Second), 20*time.Millisecond)
	if d, _ := w.current(); d != 10*time.Millisecond {
		t.Fatalf("min %v, want 10ms", d)
	}
	// An hour of silence does not age the baseline.
	w.add(t0.Add(61*time.Second+time.Hour), 30*time.Millisecond)
	if d, _ := w.current(); d != 30*time.Millisecond {
		t.Fatalf("min %v, want 30ms (older entries are more than a minute before the newest)", d)
	}
	w.add(t0.Add(62*time.Second+time.Hour), 25*time.Millisecond)
	if d, _ := w.current(); d != 25*time.Millisecond || len(w.entries) != 1 {
		t.Fatalf("min %v with %d entries, want 25ms alone", d, len(w.entries))
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Slow start: while demand fills it, the in-flight limit doubles per
// period until its first decrease (16 → 32 → 64, the ceiling), and after a
// decrease it rises by one per period.
func TestInFlightSlowStart(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 1000, InitialInFlight: 16, MaxInFlight: 64})
	saturate := func() {
		t.Helper()
		release := holdSlots(t, l, l.InFlightLimit()) // demand takes the last slot
		release()
		srv.clk.Step(100 * time.Millisecond)
	}
	var got []int
	for range 3 {
		saturate()
		got = append(got, l.InFlightLimit())
	}
	if want := []int{32, 64, 64}; !slices.Equal(got, want) {
		t.Fatalf("in-flight limit per saturated period %v, want %v", got, want)
	}
	srv.set(429, 10*time.Millisecond, nil)
	release := holdSlots(t, l, 39) // 40 in flight with the request below
	send(t, rt, http.MethodPost, svcURL)
	release()
	if n := l.InFlightLimit(); n != 20 {
		t.Fatalf("after a 429 with 40 in flight: limit %d, want 40 × 0.5 = 20", n)
	}
	srv.set(200, 10*time.Millisecond, nil)
	got = got[:0]
	for range 3 {
		saturate()
		got = append(got, l.InFlightLimit())
	}
	// The 429's own period raises nothing; then one per period.
	if want := []int{20, 21, 22}; !slices.Equal(got, want) {
		t.Fatalf("after the first decrease: limit per saturated period %v, want %v (additive)", got, want)
	}
}

// A period whose writes are slow on average but whose fastest write is
// within Tolerance of the baseline is no standing queue (a burst, or a
// server that answers in batches): the limit is not lowered. Once even
// the fastest write of a period is slower than Tolerance × the baseline,
// it is.
func TestLatencyStandingQueue(t *testing.T) {
	l, srv, rt := newTest(t, Config{MaxQPS: 1000, InitialInFlight: 10, MaxInFlight: 10, MinInFlight: 1, Interval: 2 * time.Second})
	held := holdSlots(t, l, 9)
	defer held()
	send(t, rt, http.MethodPost, svcURL) // baseline 10 ms
	srv.clk.Step(2 * time.Second)
	l.TryAccept()
	for _, lat := range []time.Duration{200, 20, 200, 200} { // mean 15.5×, fastest 2×
		srv.set(200, lat*time.Millisecond, nil)
		send(t, rt, http.MethodPost, svcURL)
	}
	srv.clk.Step(2 * time.Second)
	l.TryAccept()
	if s := l.Stats(); s.Decreases[ReasonLatency] != 0 || s.InFlightLimit != 10 || s.LatencyRatio != 2 {
		t.Fatalf("slow writes with one within tolerance: %+v, want no decrease and a ratio of 2", s)
	}
	for _, lat := range []time.Duration{200, 40, 200} { // fastest 4×
		srv.set(200, lat*time.Millisecond, nil)
		send(t, rt, http.MethodPost, svcURL)
	}
	srv.clk.Step(2 * time.Second)
	l.TryAccept()
	if s := l.Stats(); s.Decreases[ReasonLatency] != 1 || s.InFlightLimit != 8 {
		t.Fatalf("every write of the period above 3× the baseline: %+v, want one latency decrease to 8", s)
	}
}
