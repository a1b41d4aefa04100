package kuberate

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a Limiter's state as Prometheus metrics (names below,
// prefixed with namespace, e.g. "matbus"):
//
//	<ns>_kube_rate_limit_qps                     gauge: current rate limit, requests/s
//	<ns>_kube_rate_max_qps                       gauge: its hard ceiling, requests/s
//	<ns>_kube_inflight_limit                     gauge: current limit of requests in flight (watches not counted)
//	<ns>_kube_inflight                           gauge: requests in flight now
//	<ns>_kube_inflight_waiting                   gauge: requests waiting for an in-flight slot
//	<ns>_kube_write_latency_ratio                gauge: last control period's fastest write latency ÷ baseline
//	<ns>_kube_write_latency_baseline_seconds{method}  gauge: windowed minimum write latency
//	<ns>_kube_rate_decreases_total{reason}       counter: decreases, reason throttled|overload|latency
//	<ns>_kube_rate_paused_seconds_total          counter: time new requests were held by Retry-After
//	<ns>_kube_apf_responses_total{flow_schema_uid,priority_level_uid}  counter: responses by the API Priority and Fairness classification the API server reported
//
// Register it with a registry of the process (prometheus.Registerer.Register).
func (l *Limiter) Collector(namespace string) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "kube", name), help, labels, nil)
	}
	return &collector{l: l,
		qps:       d("rate_limit_qps", "Current client-side rate limit of Kubernetes API requests, requests/s."),
		maxQPS:    d("rate_max_qps", "Hard ceiling of the adaptive rate limit, requests/s."),
		limit:     d("inflight_limit", "Current limit of Kubernetes API requests in flight (watches not counted)."),
		inflight:  d("inflight", "Kubernetes API requests in flight now (watches not counted)."),
		waiting:   d("inflight_waiting", "Kubernetes API requests waiting for an in-flight slot."),
		ratio:     d("write_latency_ratio", "Fastest write latency of the last control period divided by its method's baseline, the largest over the methods; above the tolerance (3) it lowers the in-flight limit (0 before the first write)."),
		baseline:  d("write_latency_baseline_seconds", "Windowed minimum latency of Kubernetes API writes, by HTTP method.", "method"),
		decreases: d("rate_decreases_total", "Decreases of the adaptive limits, by reason (throttled: 429; overload: 502/503/504; latency: writes slower than the tolerance allows).", "reason"),
		paused:    d("rate_paused_seconds_total", "Seconds new Kubernetes API requests were held back by Retry-After."),
		apf:       d("apf_responses_total", "Kubernetes API responses by the API Priority and Fairness flow schema and priority level UIDs they carried.", "flow_schema_uid", "priority_level_uid"),
	}
}

type collector struct {
	l                                                                              *Limiter
	qps, maxQPS, limit, inflight, waiting, ratio, baseline, decreases, paused, apf *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.qps, c.maxQPS, c.limit, c.inflight, c.waiting, c.ratio, c.baseline, c.decreases, c.paused, c.apf} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.l.Stats()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(c.qps, s.QPS)
	g(c.maxQPS, s.MaxQPS)
	g(c.limit, float64(s.InFlightLimit))
	g(c.inflight, float64(s.InFlight))
	g(c.waiting, float64(s.Waiting))
	g(c.ratio, s.LatencyRatio)
	for m, b := range s.Baselines {
		g(c.baseline, b.Seconds(), m)
	}
	for _, r := range []Reason{ReasonThrottled, ReasonOverload, ReasonLatency} {
		ch <- prometheus.MustNewConstMetric(c.decreases, prometheus.CounterValue, float64(s.Decreases[r]), string(r))
	}
	ch <- prometheus.MustNewConstMetric(c.paused, prometheus.CounterValue, s.PausedTotal.Seconds())
	for k, n := range s.Responses {
		ch <- prometheus.MustNewConstMetric(c.apf, prometheus.CounterValue, float64(n), k[0], k[1])
	}
}
