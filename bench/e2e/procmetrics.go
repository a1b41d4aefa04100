package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// promSamples are the samples of a Prometheus text exposition: series
// (`name{k="v",…}` with the labels sorted by name, or `name` without
// labels) → value.
type promSamples map[string]float64

// parseProm reads the samples of the metrics whose names start with
// prefix from a Prometheus text exposition (Prometheus' own parser,
// expfmt): counters, gauges and untyped metrics as `name{…}`, histograms
// as `name_bucket{…,le="…"}` (+Inf included), `name_sum` and `name_count`,
// summaries as `name{…,quantile="…"}`, `name_sum` and `name_count`. Text
// that does not parse is an error.
func parseProm(text, prefix string) (promSamples, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	out := promSamples{}
	for name, fam := range families {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			with := func(k, v string) map[string]string {
				l := maps.Clone(labels)
				l[k] = v
				return l
			}
			switch fam.GetType() {
			case dto.MetricType_COUNTER:
				out[seriesName(name, labels)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[seriesName(name, labels)] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					out[seriesName(name+"_bucket", with("le", formatBound(b.GetUpperBound())))] = float64(b.GetCumulativeCount())
				}
				out[seriesName(name+"_bucket", with("le", "+Inf"))] = float64(h.GetSampleCount())
				out[seriesName(name+"_sum", labels)] = h.GetSampleSum()
				out[seriesName(name+"_count", labels)] = float64(h.GetSampleCount())
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					out[seriesName(name, with("quantile", formatBound(q.GetQuantile())))] = q.GetValue()
				}
				out[seriesName(name+"_sum", labels)] = sm.GetSampleSum()
				out[seriesName(name+"_count", labels)] = float64(sm.GetSampleCount())
			default:
				out[seriesName(name, labels)] = m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}

// formatBound prints a bucket bound or quantile as Prometheus does.
func formatBound(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// seriesName is `name{k="v",…}` with the labels sorted by name.
func seriesName(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(name + "{")
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, labels[k])
	}
	b.WriteByte('}')
	return b.String()
}

// Sum adds the samples of metric name whose labels include every pair of
// match ("k", "v", …).
func (s promSamples) Sum(name string, match ...string) float64 {
	var t float64
	for series, v := range s {
		n, labels, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(match); i += 2 {
			if !strings.Contains(labels, fmt.Sprintf("%s=%q", match[i], match[i+1])) {
				ok = false
				break
			}
		}
		if ok {
			t += v
		}
	}
	return t
}

// Sub is s − base per series (series missing from base count from 0).
func (s promSamples) Sub(base promSamples) promSamples {
	out := make(promSamples, len(s))
	for k, v := range s {
		out[k] = v - base[k]
	}
	return out
}

// Add sums s and o per series into a new map.
func (s promSamples) Add(o promSamples) promSamples {
	out := make(promSamples, len(s)+len(o))
	for k, v := range s {
		out[k] += v
	}
	for k, v := range o {
		out[k] += v
	}
	return out
}

// scrapeProc reads the matbus_ metrics of a process serving /metrics on
// its health address.
func scrapeProc(ctx context.Context, p *proc) (promSamples, error) {
	if p.health == "" {
		return nil, fmt.Errorf("%s: no health address", p.name)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := httpGet(ctx, "http://"+p.health+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("%s /metrics: %w", p.name, err)
	}
	return parseProm(string(body), "matbus_")
}

// procSnapshot is one reading of every worker's metrics (nil where a
// scrape failed) and of the worker and discovery memory.
type procSnapshot struct {
	at      time.Time
	workers []promSamples
}

// snapshot scrapes every worker; failures are logged and leave a nil.
func (b *bench) snapshot(ctx context.Context, workers []*proc) procSnapshot {
	s := procSnapshot{at: time.Now(), workers: make([]promSamples, len(workers))}
	for i, p := range workers {
		m, err := scrapeProc(ctx, p)
		if err != nil {
			b.logf("%v", err)
			continue
		}
		s.workers[i] = m
	}
	return s
}

// workerDelta is what the workers did between two snapshots.
type workerDelta struct {
	// WatchEvents is the Service informer events (added, updated,
	// deleted) each worker received, by worker index.
	WatchEvents []float64 `json:"watch_events"`
	// Listed is the objects each worker's informer listed.
	Listed []float64 `json:"listed"`
	// InformerCalls is the informer's list and watch calls, by worker.
	InformerCalls []float64 `json:"informer_calls"`
	// KubeRequests is the Kubernetes requests each worker sent
	// (matbus_kube_requests_total: every method, a watch once).
	KubeRequests []float64 `json:"kube_requests"`
	// Syncs is the sync jobs each worker handled.
	Syncs []float64 `json:"sync_jobs"`
	// FetchDelay is the mean time from a sync job's publication to its
	// status fetch, over every worker, in seconds (0 without jobs);
	// FetchDelayP99 is the upper bound of the histogram bucket holding the
	// 99th percentile; FetchDelayMax the upper bound of the highest
	// non-empty bucket. A bound above the largest finite bucket (10 s) is
	// given as that bucket's bound with FetchDelayOver set (JSON has no
	// +Inf).
	FetchDelay     float64 `json:"fetch_delay_seconds"`
	FetchDelayP99  float64 `json:"fetch_delay_p99_bucket_seconds"`
	FetchDelayMax  float64 `json:"fetch_delay_max_bucket_seconds"`
	FetchDelayOver bool    `json:"fetch_delay_above_largest_bucket,omitempty"`
	// ReceiveDelay is the mean time from publication to the handler's start.
	ReceiveDelay float64 `json:"receive_delay_seconds"`
}

// deltaOf is the workers' work from a to b; workers whose scrape failed
// in either count 0.
func deltaOf(a, b procSnapshot) *workerDelta {
	d := &workerDelta{}
	all := promSamples{}
	for i := range b.workers {
		var m promSamples
		if i < len(a.workers) && a.workers[i] != nil && b.workers[i] != nil {
			m = b.workers[i].Sub(a.workers[i])
			all = all.Add(m)
		}
		d.WatchEvents = append(d.WatchEvents, m.Sum("matbus_informer_events_total", "informer", "services")-
			m.Sum("matbus_informer_events_total", "informer", "services", "type", "listed"))
		d.Listed = append(d.Listed, m.Sum("matbus_informer_events_total", "informer", "services", "type", "listed"))
		d.InformerCalls = append(d.InformerCalls, m.Sum("matbus_informer_calls_total", "informer", "services"))
		d.KubeRequests = append(d.KubeRequests, m.Sum("matbus_kube_requests_total"))
		d.Syncs = append(d.Syncs, m.Sum("matbus_worker_jobs_total", "type", "sync"))
	}
	const h = "matbus_worker_sync_job_delay_seconds"
	if n := all.Sum(h+"_count", "stage", "fetch"); n > 0 {
		d.FetchDelay = all.Sum(h+"_sum", "stage", "fetch") / n
		d.FetchDelayP99, d.FetchDelayMax, d.FetchDelayOver = bucketBounds(all, h+"_bucket", "fetch", n)
	}
	if n := all.Sum(h+"_count", "stage", "received"); n > 0 {
		d.ReceiveDelay = all.Sum(h+"_sum", "stage", "received") / n
	}
	return d
}

// bucketBounds returns the upper bounds of the buckets of histogram name
// (cumulative, label le) holding the 99th percentile and the largest
// observation of count observations with stage. A bound of +Inf is
// returned as the largest finite bound, with over true.
func bucketBounds(s promSamples, name, stage string, count float64) (p99, top float64, over bool) {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for series, v := range s {
		n, labels, _ := strings.Cut(series, "{")
		if n != name || !strings.Contains(labels, fmt.Sprintf("stage=%q", stage)) {
			continue
		}
		_, le, _ := strings.Cut(labels, `le="`)
		le, _, _ = strings.Cut(le, `"`)
		f, err := strconv.ParseFloat(le, 64) // "+Inf" parses
		if err == nil {
			bs = append(bs, bucket{f, v})
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	p99, top = -1, 0
	for i, b := range bs {
		if p99 < 0 && b.n >= 0.99*count {
			p99 = b.le
		}
		if b.n >= count && (i == 0 || bs[i-1].n < count) {
			top = b.le
		}
	}
	finite := 0.0
	for _, b := range bs {
		if !math.IsInf(b.le, 1) {
			finite = b.le
		}
	}
	if math.IsInf(p99, 1) {
		p99, over = finite, true
	}
	if math.IsInf(top, 1) {
		top, over = finite, true
	}
	return max(p99, 0), top, over
}

// mean is the mean of vs, 0 for none.
func mean(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	var t float64
	for _, v := range vs {
		t += v
	}
	return t / float64(len(vs))
}
