package main

import (
	"fmt"

	"github.com/matbus/matbus/bench/internal/load"
)

// roundScale is what a round measured about its per-worker overhead and
// how its cost grows with the Services: CPU per Service written, what
// each worker's informer received, the sync jobs' delays, memory in the
// steady window (all N Services present).
type roundScale struct {
	// ConvergeCPU is the CPU of every program from the discovery start
	// until the last Service of the converge was seen.
	ConvergeCPU *load.CPUUse `json:"converge_cpu,omitempty"`
	// Converge, Reactions, Steady and Delete are the workers' work over
	// those phases (from their /metrics).
	Converge  *workerDelta `json:"converge_workers,omitempty"`
	Reactions *workerDelta `json:"reactions_workers,omitempty"`
	Steady    *workerDelta `json:"steady_workers,omitempty"`
	Delete    *workerDelta `json:"delete_workers,omitempty"`
	// ConvergeAudit and DeleteAudit are the converge's and the fan-out's
	// API requests by client (audit log).
	ConvergeAudit auditCounts `json:"converge_audit,omitempty"`
	DeleteAudit   auditCounts `json:"delete_audit,omitempty"`
	// SteadyWorkerRSS is the largest worker VmRSS at the end of the steady
	// window; SteadyDiscoveryRSS the discovery process's, bytes.
	SteadyWorkerRSS    int64 `json:"steady_worker_rss_bytes"`
	SteadyDiscoveryRSS int64 `json:"steady_discovery_rss_bytes"`
	// DiscoveryHWM is the discovery process's peak RSS after the run, bytes.
	DiscoveryHWM int64 `json:"discovery_hwm_bytes"`
}

// scaleRows are the rows of roundScale (and of the floor's create CPU).
func scaleRows(r *result) []rowDef {
	n := r.Config.Services
	createCPU := func(prog string) rowDef {
		return rowDef{"1. CPU per created Service, " + prog, "ms",
			func(f *floorResult) *float64 {
				if f.CreateCPU == nil || f.Create.TimedOut || f.Create.Failed > 0 || f.Services == 0 {
					return nil
				}
				return ptr(f.CreateCPU.ByProg[prog] * 1000 / float64(f.Services))
			},
			func(x *roundResult) (*float64, string) {
				if x.Scale == nil || x.Scale.ConvergeCPU == nil || x.Converge == nil || x.Converge.TimedOut || x.Services == 0 {
					return nil, ""
				}
				return ptr(x.Scale.ConvergeCPU.ByProg[prog] * 1000 / float64(x.Services)), ""
			}}
	}
	scale := func(get func(*roundScale) (*float64, string)) func(*roundResult) (*float64, string) {
		return func(x *roundResult) (*float64, string) {
			if x.Scale == nil {
				return nil, ""
			}
			return get(x.Scale)
		}
	}
	perWorker := func(d *workerDelta, pick func(*workerDelta) []float64) (*float64, string) {
		if d == nil || len(pick(d)) == 0 {
			return nil, ""
		}
		return ptr(mean(pick(d))), ""
	}
	events := func(d *workerDelta) []float64 { return d.WatchEvents }
	delayMS := func(d *workerDelta, v float64) (*float64, string) {
		if d == nil || mean(d.Syncs) == 0 {
			return nil, ""
		}
		return ptr(v * 1000), ""
	}
	return []rowDef{
		createCPU(roleMatbus), createCPU("kube-apiserver"), createCPU("etcd"), createCPU("nats-server"),
		{"1. matbus + nats-server CPU ÷ kube-apiserver's, per created Service", "×", nil,
			func(x *roundResult) (*float64, string) {
				if x.Scale == nil || x.Converge == nil || x.Converge.TimedOut {
					return nil, ""
				}
				return ownShare(x.Scale.ConvergeCPU), ""
			}},
		{"1. watch events received per worker, converge", "events", nil,
			scale(func(s *roundScale) (*float64, string) { return perWorker(s.Converge, events) })},
		{"4. watch events received per worker, fan-out", "events", nil,
			scale(func(s *roundScale) (*float64, string) { return perWorker(s.Delete, events) })},
		{"5. sync job published → status fetch, mean, reactions", "ms", nil,
			scale(func(s *roundScale) (*float64, string) {
				if s.Reactions == nil {
					return nil, ""
				}
				return delayMS(s.Reactions, s.Reactions.FetchDelay)
			})},
		{"5. sync job published → status fetch, p99 (bucket bound), reactions", "ms", nil,
			scale(func(s *roundScale) (*float64, string) {
				if s.Reactions == nil {
					return nil, ""
				}
				return delayMS(s.Reactions, s.Reactions.FetchDelayP99)
			})},
		{"6. API requests per steady minute from matbus (audit log)", "req/min", nil,
			func(x *roundResult) (*float64, string) {
				if x.API == nil || x.API.Audit == nil || x.API.Seconds <= 0 {
					return nil, ""
				}
				return ptr(x.API.Audit.Total(isMatbus) * 60 / x.API.Seconds), ""
			}},
		{"6. watch events received per worker per steady minute", "events/min", nil,
			func(x *roundResult) (*float64, string) {
				if x.Scale == nil || x.Scale.Steady == nil || x.API == nil || x.API.Seconds <= 0 {
					return nil, ""
				}
				return ptr(mean(x.Scale.Steady.WatchEvents) * 60 / x.API.Seconds), ""
			}},
		{"8. worker VmRSS at the end of the steady window, max", "MiB", nil,
			scale(func(s *roundScale) (*float64, string) { return memCell(s.SteadyWorkerRSS) })},
		{fmt.Sprintf("8. worker VmRSS per Service (steady, %d Services)", n), "KiB", nil,
			func(x *roundResult) (*float64, string) {
				if x.Scale == nil || x.Scale.SteadyWorkerRSS == 0 || x.Services == 0 {
					return nil, ""
				}
				return ptr(float64(x.Scale.SteadyWorkerRSS) / 1024 / float64(x.Services)), ""
			}},
		{"8. discovery VmRSS at the end of the steady window", "MiB", nil,
			scale(func(s *roundScale) (*float64, string) { return memCell(s.SteadyDiscoveryRSS) })},
		{"8. discovery VmHWM (peak RSS)", "MiB", nil,
			scale(func(s *roundScale) (*float64, string) { return memCell(s.DiscoveryHWM) })},
	}
}

// scaleNotes are the per-round lines under the table: each worker's
// informer events and calls and sync jobs, and the fan-out's requests by
// client.
func scaleNotes(rr *roundResult) []string {
	s := rr.Scale
	if s == nil {
		return nil
	}
	var out []string
	for _, p := range []struct {
		name string
		d    *workerDelta
	}{{"converge", s.Converge}, {"reactions", s.Reactions}, {"steady", s.Steady}, {"fan-out", s.Delete}} {
		if p.d == nil {
			continue
		}
		out = append(out, fmt.Sprintf("%s, per worker: watch events %v, listed %v, informer list+watch calls %v, Kubernetes requests %v, sync jobs %v; "+
			"job published → received %.1f ms, → fetch %.1f ms mean (p99 ≤ %s ms, max %s ms)",
			p.name, p.d.WatchEvents, p.d.Listed, p.d.InformerCalls, p.d.KubeRequests, p.d.Syncs,
			p.d.ReceiveDelay*1000, p.d.FetchDelay*1000, num(p.d.FetchDelayP99*1000), maxBound(p.d)))
	}
	if s.ConvergeAudit != nil {
		out = append(out, "converge requests by client (audit log): "+orNone(s.ConvergeAudit.String()))
	}
	if s.DeleteAudit != nil {
		out = append(out, "fan-out requests by client (audit log): "+orNone(s.DeleteAudit.String()))
	}
	return out
}

// maxBound prints the upper bound of d's highest fetch-delay bucket in
// milliseconds, "over N" when it lies above the largest finite bucket.
func maxBound(d *workerDelta) string {
	if d.FetchDelayOver {
		return "over " + num(d.FetchDelayMax*1000)
	}
	return "≤ " + num(d.FetchDelayMax*1000)
}
