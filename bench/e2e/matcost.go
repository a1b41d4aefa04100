package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
)

// What MAT pays for being polled, in the steady window: the simulator
// host that matbus polls, and beside it two more hosts serving the same
// fleets (same simulator build and options) that the harness polls the
// way the old controller does: one plain GET /machines/status per
// instance every 30 s, and every 10 s (no conditional headers, one
// keep-alive client per instance; each client's connection is opened
// before the window, as a long-running controller's would be). Each host
// is a process of its own, so its CPU time is exactly its serving work:
// HTTP, TLS, rendering, the garbage collector. All three windows run at
// the same time, over the same steady window.

// oldIntervals are the poll intervals of the old-controller rows.
var oldIntervals = []time.Duration{30 * time.Second, 10 * time.Second}

// matCostRun is one simulator host over the steady window.
type matCostRun struct {
	Poller      string  `json:"poller"`                // "matbus", "old controller 30s", …
	Interval    float64 `json:"interval_seconds"`      // 0 for matbus (its own schedule)
	Instances   int     `json:"instances"`             // simulators of the host
	Seconds     float64 `json:"seconds"`               // window length
	CPUSeconds  float64 `json:"cpu_seconds"`           // the host process's user+system CPU (getrusage)
	Requests    int64   `json:"requests"`              // status GETs answered
	NotModified int64   `json:"not_modified"`          // of them 304
	Bytes       int64   `json:"bytes_sent"`            // on the wire, TLS included
	Errors      int64   `json:"poll_errors,omitempty"` // failed polls (old-controller pollers)
	// Per instance and minute.
	CPUMillisPerMin float64 `json:"cpu_ms_per_instance_minute"`
	KiBPerMin       float64 `json:"kib_per_instance_minute"`
	GETsPerMin      float64 `json:"gets_per_instance_minute"`
}

// matCost is the MAT-cost measurement of one round.
type matCost struct {
	ETag bool          `json:"etag"` // the simulators sent ETags and answered 304
	Runs []*matCostRun `json:"runs"` // matbus first, then oldIntervals in order

	hosts   []*simHost
	clients [][]*matclient.Client // per old host, per instance
	cnt0    []simCounters
	t0      time.Time
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	errs    []int64
	mu      sync.Mutex
}

// startMATCost starts the old-controller hosts serving fleets and opens
// their pollers' connections; main is the host matbus polls.
func (b *bench) startMATCost(ctx context.Context, dir string, main *simHost, fleets []*matsim.Fleet) (*matCost, error) {
	m := &matCost{ETag: !b.cfg.MATNoETag, hosts: []*simHost{main}}
	m.Runs = append(m.Runs, &matCostRun{Poller: "matbus", Instances: len(fleets)})
	for _, iv := range oldIntervals {
		h, err := startSimHost(ctx, dir, fmt.Sprintf("matsim-old-%s", iv), fleets, b.cfg.MATNoETag)
		if err != nil {
			m.Stop()
			return nil, err
		}
		m.hosts = append(m.hosts, h)
		var cs []*matclient.Client
		for _, u := range h.urls {
			c, err := matclient.New(u, matclient.Config{InsecureSkipVerify: true, UserAgent: "old-controller-poller"})
			if err != nil {
				m.Stop()
				return nil, err
			}
			if _, err := c.Status(ctx); err != nil { // the connection a running controller holds
				m.Stop()
				return nil, fmt.Errorf("old-controller poller: %w", err)
			}
			cs = append(cs, c)
		}
		m.clients = append(m.clients, cs)
		m.Runs = append(m.Runs, &matCostRun{Poller: "old controller " + iv.String(), Interval: iv.Seconds(), Instances: len(fleets)})
	}
	return m, nil
}

// begin samples every host and starts the old-controller pollers; the
// first poll of instance i comes i/n of an interval after the start.
func (m *matCost) begin(ctx context.Context) {
	m.cnt0 = make([]simCounters, len(m.hosts))
	for i, h := range m.hosts {
		m.cnt0[i], _ = h.counters()
	}
	m.t0 = time.Now()
	ctx, m.cancel = context.WithCancel(ctx)
	m.errs = make([]int64, len(m.hosts))
	for k, cs := range m.clients {
		iv := oldIntervals[k]
		for i, c := range cs {
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				next := m.t0.Add(iv * time.Duration(i) / time.Duration(len(cs)))
				for {
					select {
					case <-ctx.Done():
						return
					case <-time.After(time.Until(next)):
					}
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := c.Status(pctx)
					cancel()
					if err != nil && ctx.Err() == nil {
						m.mu.Lock()
						m.errs[k+1]++
						m.mu.Unlock()
					}
					next = next.Add(iv)
				}
			}()
		}
	}
}

// end stops the pollers and fills Runs with the window's differences.
func (m *matCost) end() *matCost {
	if m.cancel == nil {
		return nil
	}
	m.cancel()
	m.wg.Wait()
	secs := time.Since(m.t0).Seconds()
	for i, h := range m.hosts {
		r := m.Runs[i]
		cnt, err := h.counters()
		if err != nil || m.cnt0[i].CPUNanos == 0 {
			continue
		}
		r.Seconds, r.Errors = secs, m.errs[i]
		r.CPUSeconds = float64(cnt.CPUNanos-m.cnt0[i].CPUNanos) / 1e9
		r.Requests = sum(cnt.Requests) - sum(m.cnt0[i].Requests)
		r.NotModified = sum(cnt.NotModified) - sum(m.cnt0[i].NotModified)
		r.Bytes = sum(cnt.Bytes) - sum(m.cnt0[i].Bytes)
		perMin := float64(r.Instances) * secs / 60
		r.CPUMillisPerMin = r.CPUSeconds * 1000 / perMin
		r.KiBPerMin = float64(r.Bytes) / 1024 / perMin
		r.GETsPerMin = float64(r.Requests) / perMin
	}
	return m
}

// Stop closes the pollers' clients and ends the old-controller hosts (not
// the matbus host, which the round owns).
func (m *matCost) Stop() {
	if m.cancel != nil {
		m.cancel()
		m.wg.Wait()
	}
	for _, cs := range m.clients {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	for _, h := range m.hosts[1:] {
		h.Stop()
	}
}

// String is one log line per host.
func (m *matCost) String() string {
	s := ""
	for _, r := range m.Runs {
		s += fmt.Sprintf("\n  %s: %.1f ms CPU, %.1f KiB, %.1f GETs (%d of %d 304) per instance-minute; %.2f s CPU in %.0f s",
			r.Poller, r.CPUMillisPerMin, r.KiBPerMin, r.GETsPerMin, r.NotModified, r.Requests, r.CPUSeconds, r.Seconds)
		if r.Errors > 0 {
			s += fmt.Sprintf(", %d failed polls", r.Errors)
		}
	}
	return s
}

// run returns the run of poller i (0 matbus, then oldIntervals), nil
// when not measured.
func (m *matCost) run(i int) *matCostRun {
	if m == nil || i >= len(m.Runs) || m.Runs[i].Seconds == 0 {
		return nil
	}
	return m.Runs[i]
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

// matCostRows are the table's MAT-cost rows.
func matCostRows() []rowDef {
	cell := func(i int, f func(*matCostRun) float64) func(*roundResult) (*float64, string) {
		return func(x *roundResult) (*float64, string) {
			r := x.MATCost.run(i)
			if r == nil {
				return nil, ""
			}
			return ptr(f(r)), ""
		}
	}
	cpu := func(r *matCostRun) float64 { return r.CPUMillisPerMin }
	kib := func(r *matCostRun) float64 { return r.KiBPerMin }
	names := []string{"matbus", "old controller, 30 s poll", "old controller, 10 s poll"}
	var defs []rowDef
	for i, n := range names {
		defs = append(defs, rowDef{"9. MAT CPU per instance-minute, " + n, "ms", nil, cell(i, cpu)})
	}
	for i, n := range names {
		defs = append(defs, rowDef{"9. MAT bytes sent per instance-minute, " + n, "KiB", nil, cell(i, kib)})
	}
	defs = append(defs, rowDef{"9. MAT CPU: matbus ÷ old controller 10 s", "×", nil,
		func(x *roundResult) (*float64, string) {
			a, o := x.MATCost.run(0), x.MATCost.run(2)
			if a == nil || o == nil || o.CPUSeconds <= 0 {
				return nil, ""
			}
			return ptr(a.CPUSeconds / o.CPUSeconds), ""
		}})
	defs = append(defs, rowDef{"9. matbus status GETs answered 304", "%", nil,
		cell(0, func(r *matCostRun) float64 { return 100 * float64(r.NotModified) / max(float64(r.Requests), 1) })})
	return defs
}
