package health

import (
	"net/http"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubewatch"
	"github.com/matbus/matbus/worker"
)

// NewRegistry returns a registry with the Go runtime (go_*) and process
// (process_*) collectors and matbus_build_info{version,revision,goversion}
// (always 1), of the build version and VCS revision given.
func NewRegistry(version, revision string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Name: "build_info",
		Help:        "Always 1; the labels name the build.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()}},
		func() float64 { return 1 }))
	return reg
}

// EventMetrics registers the publish counts of bus and the failure counts
// of rep (either may be nil) with reg:
//
//	matbus_events_published_total{type}             events this process published, by CloudEvents type
//	matbus_publish_failures_total{type}             publishes that gave up after retries, by type
//	matbus_error_events_total{kind}                 failures reported (each is logged; published unless rate limited)
//	matbus_error_events_suppressed_total{kind}      of those, kept from NATS by the --error-window rate limit
func EventMetrics(reg *prometheus.Registry, bus *events.Bus, rep *events.Reporter) {
	if bus != nil {
		typed := func(pick func() map[events.Type]int64) func() map[string]int64 {
			return func() map[string]int64 {
				out := map[string]int64{}
				for t, n := range pick() {
					out[string(t)] = n
				}
				return out
			}
		}
		reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_events_published_total", "Events this process published, by type.", []string{"type"}, nil),
			Values: typed(func() map[events.Type]int64 { p, _ := bus.PublishStats(); return p })})
		reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_publish_failures_total", "Publishes that gave up after their retries, by event type.", []string{"type"}, nil),
			Values: typed(func() map[events.Type]int64 { _, f := bus.PublishStats(); return f })})
	}
	if rep != nil {
		kinds := func(pick func() map[events.ErrorKind]int64) func() map[string]int64 {
			return func() map[string]int64 {
				out := map[string]int64{}
				for k, n := range pick() {
					out[string(k)] = n
				}
				return out
			}
		}
		reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_error_events_total", "Failures reported, by error kind; each is logged and published on <prefix>.errors.<kind> unless rate limited.", []string{"kind"}, nil),
			Values: kinds(func() map[events.ErrorKind]int64 { r, _ := rep.Stats(); return r })})
		reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_error_events_suppressed_total", "Failures reported but not published because of the --error-window rate limit, by error kind.", []string{"kind"}, nil),
			Values: kinds(func() map[events.ErrorKind]int64 { _, s := rep.Stats(); return s })})
	}
}

// ReadyMetric registers matbus_ready{component}: 1 while ready returns nil
// (what /readyz answers 200 for), else 0.
func ReadyMetric(reg *prometheus.Registry, component string, ready func() error) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Name: "ready",
		Help: "1 while the process is ready (/readyz answers 200), else 0.", ConstLabels: prometheus.Labels{"component": component}},
		func() float64 {
			if ready() != nil {
				return 0
			}
			return 1
		}))
}

// SchedulerMetrics exports the stats of the scheduler that sched points at
// (nil while this process does not lead: every value is then 0).
func SchedulerMetrics(reg *prometheus.Registry, sched *atomic.Pointer[discovery.Scheduler]) {
	stats := func() discovery.SchedulerStats {
		if s := sched.Load(); s != nil {
			return s.Stats()
		}
		return discovery.SchedulerStats{}
	}
	gauge := func(name, help string, f func(discovery.SchedulerStats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "scheduler", Name: name, Help: help},
			func() float64 { return f(stats()) }))
	}
	gauge("instances", "Instances scheduled for sync jobs.", func(s discovery.SchedulerStats) float64 { return float64(s.Instances) })
	gauge("instances_in_flight", "Instances with a sync job out.", func(s discovery.SchedulerStats) float64 { return float64(s.InFlight) })
	gauge("instances_out_of_rotation", "Instances probed at a backoff interval after failed status fetches.",
		func(s discovery.SchedulerStats) float64 { return float64(s.OutOfRotation) })
	gauge("instances_overdue", "Instances whose last good sync is older than the sync interval plus the poll interval.",
		func(s discovery.SchedulerStats) float64 { return float64(s.Overdue) })
	gauge("instances_stretched", "Instances polled at more than --poll-interval (up to --poll-max-interval) because MAT answers their polls 304 Not Modified.",
		func(s discovery.SchedulerStats) float64 { return float64(s.Stretched) })
	reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_scheduler_jobs_dispatched_total", "Sync jobs published, by reason.", []string{"reason"}, nil),
		Values: func() map[string]int64 { return stats().Dispatched }})
	reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_scheduler_results_total", "Sync results received from workers, by outcome.", []string{"outcome"}, nil),
		Values: func() map[string]int64 { return stats().Results }})
	reg.MustRegister(&MapCounter{Desc: prometheus.NewDesc("matbus_scheduler_missed_intervals_total", "Times an instance fell behind its sync interval, by cause (capacity, backoff).", []string{"cause"}, nil),
		Values: func() map[string]int64 { return stats().Missed }})
}

// MapCounter exports a map of counts as one counter per label value.
type MapCounter struct {
	Desc   *prometheus.Desc
	Values func() map[string]int64
}

func (m *MapCounter) Describe(ch chan<- *prometheus.Desc) { ch <- m.Desc }

func (m *MapCounter) Collect(ch chan<- prometheus.Metric) {
	for k, v := range m.Values() {
		ch <- prometheus.MustNewConstMetric(m.Desc, prometheus.CounterValue, float64(v), k)
	}
}

// WorkerMetrics registers the worker's counters (matbus_worker_*), its
// client cache size and its informer's list and watch calls with reg.
func WorkerMetrics(reg *prometheus.Registry, w *worker.Worker) {
	stat := func(name, help string, f func(worker.Stats) int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "matbus", Subsystem: "worker", Name: name, Help: help},
			func() float64 { return float64(f(w.Stats())) }))
	}
	stat("syncs_total", "Sync jobs completed.", func(s worker.Stats) int64 { return s.Syncs })
	stat("syncs_unchanged_total", "Poll jobs that found the status and the Services unchanged (no planning, no API request).", func(s worker.Stats) int64 { return s.Unchanged })
	stat("deletes_kept_total", "Delete jobs not run because the newest status still wants the Service.", func(s worker.Stats) int64 { return s.DeletesKept })
	stat("cleanups_total", "Clean-up jobs completed.", func(s worker.Stats) int64 { return s.Cleanups })
	stat("services_created_total", "Services created.", func(s worker.Stats) int64 { return s.Created })
	stat("services_updated_total", "Services updated.", func(s worker.Stats) int64 { return s.Updated })
	stat("services_recreated_total", "Services recreated after a BMC IP change.", func(s worker.Stats) int64 { return s.Recreated })
	stat("services_deleted_total", "Services deleted by delete jobs.", func(s worker.Stats) int64 { return s.Deleted })
	stat("delete_jobs_published_total", "Delete jobs published.", func(s worker.Stats) int64 { return s.DeleteJobs })
	stat("jobs_failed_total", "Jobs that failed: sync jobs whose status fetch or apply failed, jobs that gave up after their deliveries or were refused.", func(s worker.Stats) int64 { return s.Failed })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "worker", Name: "cached_clients", Help: "MAT clients in the cache."},
		func() float64 { return float64(len(w.Cache().Stats().URLs)) }))
	reg.MustRegister(kubewatch.NewCollector(w.WatchHealth()))
}

// CountKubeRequests counts every request of cfg's clients by HTTP method
// in matbus_kube_requests_total{method} (a watch counts once, when it
// starts). In steady state a worker's work makes none: every read comes
// from its informer. The readiness probe (GET /version every 5 s while
// the Service informer is not synced and healthy) uses another client and
// is not counted.
func CountKubeRequests(cfg *rest.Config, reg *prometheus.Registry) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "matbus", Name: "kube_requests_total",
		Help: "Kubernetes API requests sent, by HTTP method (a watch counts once, when it starts)."}, []string{"method"})
	writes := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "matbus", Name: "kube_write_duration_seconds",
		Help:    "Duration of Kubernetes API writes (POST, PUT, PATCH, DELETE) until the response headers, by HTTP method; failed ones included.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"method"})
	reg.MustRegister(c, writes)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			c.WithLabelValues(r.Method).Inc()
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				return rt.RoundTrip(r)
			}
			start := time.Now()
			resp, err := rt.RoundTrip(r)
			writes.WithLabelValues(r.Method).Observe(time.Since(start).Seconds())
			return resp, err
		})
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
