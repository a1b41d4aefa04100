package main

import (
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/bench/internal/load"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"p50 of four is the second", ms(40, 10, 30, 20), 50, 20 * time.Millisecond},
		{"p99 of 40 is the largest", ms(make40()...), 99, 40 * time.Millisecond},
		{"p50 of 40 is the 20th", ms(make40()...), 50, 20 * time.Millisecond},
		{"p100", ms(3, 1, 2), 100, 3 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tc.in...)
			if got := percentile(tc.in, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.in, tc.p, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.in[i] {
					t.Fatalf("input modified: %v", tc.in)
				}
			}
		})
	}
}

func make40() []int {
	out := make([]int, 40)
	for i := range out {
		out[i] = 40 - i
	}
	return out
}

const metricsText = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="namespace",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} 2000
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="PUT",version="v1"} 1
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 1.5e+01
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="openapi/v3",verb="GET",version=""} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1",odd="a\"b,c}\\"} 12
apiserver_request_total_other{verb="GET"} 99
apiserver_request_totals 7
`

func TestParseRequestTotal(t *testing.T) {
	got, err := parseRequestTotal(metricsText)
	if err != nil {
		t.Fatal(err)
	}
	want := requestCounts{
		"LIST services":       3,
		"POST services":       2000,
		"POST services 409":   5,
		"PUT services/status": 1,
		"GET /readyz":         15,
		"GET /openapi/v3":     2,
		"PUT leases":          12,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if got.Total() != 2038 {
		t.Errorf("Total = %v, want 2038", got.Total())
	}
	later := requestCounts{"LIST services": 4, "POST services": 2000, "POST services 409": 5, "WATCH services": 1}
	d := later.Sub(got)
	if d["LIST services"] != 1 || d["WATCH services"] != 1 || d["PUT leases"] != -12 || len(d) != 6 {
		t.Errorf("Sub = %v", d)
	}
	if s := (requestCounts{"A x": 1, "B y": 3}).String(); s != "B y=3, A x=1" {
		t.Errorf("String = %q", s)
	}
	if _, err := parseRequestTotal(`apiserver_request_total{verb="GET} 1`); err == nil {
		t.Error("unterminated label value parsed")
	}
	if _, err := parseRequestTotal(`apiserver_request_total{verb="GET"} x`); err == nil {
		t.Error("bad value parsed")
	}
}

func TestParseHelpDefaults(t *testing.T) {
	help := `Usage: matbus discovery [flags]

Watch for MAT instances.

Flags (each also read from the environment variable shown):
  --leader-elect  [env MATBUS_LEADER_ELECT]
      campaign for a Lease (needs the Kubernetes API) (default true)
  --static  [env MATBUS_STATIC]
      static instances: [namespace/]name=url
  --sync-interval  [env SYNC_INTERVAL]
      how often every instance gets a sync job (default 30s)
`
	got := parseHelpDefaults(help)
	if got["sync-interval"] != "30s" || got["leader-elect"] != "true" {
		t.Errorf("got %v", got)
	}
	if _, ok := got["static"]; ok {
		t.Errorf("static has no default: %v", got)
	}
}

func TestMemStatus(t *testing.T) {
	st := "Name:\tmatbus\nVmPeak:\t 1 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n"
	rss, hwm, err := memStatus(st)
	if err != nil || rss != 40<<20 || hwm != 50<<20 {
		t.Errorf("memStatus = %d, %d, %v", rss, hwm, err)
	}
	if _, _, err := memStatus("Name:\tx\n"); err == nil {
		t.Error("missing fields accepted")
	}
}

func TestFleets(t *testing.T) {
	if got := splitSizes(10, 3); got[0] != 4 || got[1] != 3 || got[2] != 3 {
		t.Errorf("splitSizes(10, 3) = %v", got)
	}
	f, err := makeFleets(splitSizes(2003, 5), 40, 1)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	seen := map[string]bool{}
	for _, fl := range f.base {
		names := serviceNames(fl.Machines)
		total += len(names)
		for _, n := range names {
			if seen[n] {
				t.Fatalf("duplicate Service name %s", n)
			}
			seen[n] = true
		}
	}
	if total != 2003 {
		t.Errorf("base fleets ask for %d Services, want 2003", total)
	}
	if n := len(serviceNames(f.grow)); n != growBMCs {
		t.Errorf("grow asks for %d Services, want %d", n, growBMCs)
	}
	if len(f.extraHosts) != 21 || len(f.extraShelves) != 21 {
		t.Errorf("%d extra hosts and %d extra shelves, want 21 each", len(f.extraHosts), len(f.extraShelves))
	}
	for _, h := range f.extraHosts {
		if len(h.DPUs) != 0 || serviceName(&h) == "" {
			t.Fatalf("extra host %s has DPUs", h.MatID)
		}
	}
	// 10,000 Services fit the service range.
	if _, err := makeFleets(splitSizes(10000, 5), 40, 1); err != nil {
		t.Errorf("10,000 Services: %v", err)
	}
	var ips ipBlocks
	a, _ := ips.block(400)
	b, _ := ips.block(101)
	c, _ := ips.block(2)
	if a != "10.100.0.0/23" || b != "10.100.2.0/25" || c != "10.100.2.128/30" {
		t.Errorf("blocks %s %s %s", a, b, c)
	}
}

func TestTable(t *testing.T) {
	cfg, err := parseFlags([]string{"--services", "200", "--workers", "1,3", "--steady", "10s"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	r := &result{Config: cfg, Defaults: map[string]map[string]string{"discovery": {"sync-interval": "30s"}},
		Floors: []*floorResult{{Repeat: 1, Services: 200, Create: load.Timed{Seconds: 2, Calls: 200}, Delete: load.Timed{Seconds: 1, Calls: 200}}},
		Idle:   &apiWindow{Seconds: 30, PerMinute: 30},
		Rounds: []*roundResult{
			{Workers: 1, Repeat: 1, Converge: &phase{Seconds: 8, Count: 200}, Delete: &phase{Seconds: 4, Count: 200},
				API: &apiWindow{Seconds: 60, PerMinute: 30}},
			{Workers: 3, Repeat: 1, Column: 1, Converge: &phase{TimedOut: true, Missing: 3, Count: 200, Why: "timeout"},
				API: &apiWindow{Seconds: 3, PerMinute: 81, Interrupted: true}},
		}}
	out := r.table()
	for _, want := range []string{"| 1 worker | 3 workers |", "| 8.00 (4.00×) | timeout (3 of 200 missing) |",
		"| 4. delete rate | Services/s | 200 | 50.0 (0.25×) | — |", "discovery --sync-interval 30s",
		// a steady window cut short by Ctrl-C is no measurement
		"| 6. API requests per steady minute | req/min | 30.0 | 30.0 (1.00×) | interrupted |"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "repetitions") || strings.Contains(out, "interrupted (") {
		t.Errorf("one complete repetition described as several or as interrupted:\n%s", out)
	}
	if strings.Contains(out, "a worker's requests") {
		t.Errorf("a raw floor described as sending a worker's requests:\n%s", out)
	}
	r.Config.FloorAsWorker = true
	if out := r.table(); !strings.Contains(out, "50 calls in flight sending a worker's requests (protobuf, deletes with UID and resourceVersion preconditions) under two Service watches") {
		t.Errorf("--floor-as-worker is not described in the floor line:\n%s", out)
	}
	r.Interrupted = "interrupt signal received"
	if out := r.table(); !strings.Contains(out, "**interrupted** (interrupt signal received)") {
		t.Errorf("an interrupted run is not marked:\n%s", out)
	}
}

// With --repeat, each cell is the median over the repetitions and its
// ratio the median of per-repetition ratios, each against the floor of
// its own repetition (not against the median floor).
func TestTableRepeats(t *testing.T) {
	cfg, err := parseFlags([]string{"--services", "100", "--workers", "3", "--repeat", "3"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	floor := func(rep int, create, del float64) *floorResult {
		return &floorResult{Repeat: rep, Services: 100, Create: load.Timed{Seconds: create, Calls: 100}, Delete: load.Timed{Seconds: del, Calls: 100}}
	}
	round := func(rep int, converge, del float64) *roundResult {
		return &roundResult{Workers: 3, Repeat: rep, Converge: &phase{Seconds: converge, Count: 100}, Delete: &phase{Seconds: del, Count: 100}}
	}
	// Delete: repetitions 1 and 2 measured 10 s against a 5 s floor (2×)
	// and 12 s against 12 s (1×): the cell is 11 s at 1.5×, not 11 s ÷ the
	// median floor of 10 s; repetition 3 timed out before its delete.
	r := &result{Config: cfg, Idle: &apiWindow{Seconds: 30, PerMinute: 30},
		Floors: []*floorResult{floor(1, 2, 5), floor(2, 4, 12), floor(3, 3, 10)},
		Rounds: []*roundResult{round(1, 4, 10), round(2, 5, 12), {Workers: 3, Repeat: 3, Converge: &phase{TimedOut: true, Missing: 1, Count: 100, Why: "timeout"}}},
	}
	for _, x := range r.Rounds {
		x.API = &apiWindow{Seconds: 60, PerMinute: 30}
	}
	out := r.table()
	for _, want := range []string{
		"3 repetitions",
		"| 4. delete fan-out, 100 Services | s | 10.0 (5.00–12.0) | 11.0 (1.50×; 1.00×–2.00×) |",
		// converge: repetition 2 timed out; the others are 4/2 and 5/4.
		"| 1. converge from empty, 100 Services | s | 3.00 (2.00–4.00) | 4.50 (1.62×; 1.25×–2.00×) timeout (1 of 100 missing) |",
		// one idle window, equal values: no range
		"| 6. API requests per steady minute | req/min | 30.0 | 30.0 (1.00×) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if v := median([]float64{3, 1, 2}); v == nil || *v != 2 {
		t.Errorf("median of 3 values = %v", v)
	}
	if v := median([]float64{4, 1}); v == nil || *v != 2.5 {
		t.Errorf("median of 2 values = %v", v)
	}
	if median(nil) != nil {
		t.Error("median of nothing is not nil")
	}
	for _, args := range [][]string{{"--repeat", "0"}, {"--workers", "1,,3"}, {"--workers", ","}, {"--workers", " "}} {
		if _, err := parseFlags(args, &strings.Builder{}); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// The rows of matbus's own CPU against the API server's are, like every
// cell, the median over the repetitions of each repetition's ratio; a
// phase that timed out has none.
func TestOwnShareRows(t *testing.T) {
	cfg, err := parseFlags([]string{"--services", "100", "--workers", "3", "--repeat", "3"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	cpu := func(api, matbus, nats float64) *load.CPUUse {
		return &load.CPUUse{Wall: 1, ByProg: map[string]float64{"kube-apiserver": api, roleMatbus: matbus, "nats-server": nats, "etcd": 1}}
	}
	round := func(rep int, converge, del *load.CPUUse) *roundResult {
		return &roundResult{Workers: 3, Repeat: rep, Services: 100,
			Converge: &phase{Seconds: 5, Count: 100}, Delete: &phase{Seconds: 5, Count: 100}, DeleteCPU: del,
			Scale: &roundScale{ConvergeCPU: converge}}
	}
	timedOut := round(3, cpu(10, 0.5, 0.5), cpu(4, 4, 4))
	timedOut.Delete = &phase{TimedOut: true, Missing: 1, Count: 100, Why: "timeout"}
	r := &result{Config: cfg, Rounds: []*roundResult{
		round(1, cpu(10, 1, 1), cpu(4, 1, 0.2)),
		round(2, cpu(10, 2, 1), cpu(4, 2, 0.4)),
		timedOut,
	}}
	out := r.table()
	for _, want := range []string{
		"| 1. matbus + nats-server CPU ÷ kube-apiserver's, per created Service | × | — | 0.20 (0.10–0.30) |",
		"| 4. matbus + nats-server CPU ÷ kube-apiserver's, per deleted Service | × | — | 0.45 (0.30–0.60) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if v := ownShare(cpu(0, 1, 1)); v != nil {
		t.Errorf("ratio against an API server that used no CPU = %v, want none", *v)
	}
}
