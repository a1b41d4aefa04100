package worker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
)

// Job outcomes counted by Metrics, as JetStream saw each delivery end.
const (
	JobOK         = "ok"         // acknowledged: the job's effect is done (a sync job's result may still be a failed fetch: see matbus_worker_sync_results_total)
	JobRetried    = "retried"    // nak'ed for redelivery: a transient failure, or shutdown cut it short
	JobFailed     = "failed"     // its last allowed delivery failed: error event, terminated
	JobTerminated = "terminated" // refused at once (permanent failure, undecodable or wrong job): error event, terminated
)

// Metrics are a worker's Prometheus metrics. NewMetrics registers them;
// pass them in Config.Metrics. A nil *Metrics records nothing.
type Metrics struct {
	jobs          *prometheus.CounterVec   // type, outcome
	jobDuration   *prometheus.HistogramVec // type
	syncResults   *prometheus.CounterVec   // outcome
	fetchDuration prometheus.Histogram
	fetchFailures prometheus.Counter
	lastSync      *prometheus.GaugeVec     // mat_instance
	jobDelay      *prometheus.HistogramVec // stage
	held          *prometheus.GaugeVec     // mat_instance
	holdUntil     *prometheus.GaugeVec     // mat_instance
	holds         *prometheus.CounterVec   // reason
	standby       prometheus.Gauge
}

// instanceLabel names the MAT instance in the worker's per-instance series.
const instanceLabel = "mat_instance"

// NewMetrics creates the worker metrics and registers them with reg:
//
//	matbus_worker_jobs_total{type,outcome}                 counter: deliveries ended, type sync|cleanup|delete|unknown, outcome ok|retried|failed|terminated
//	matbus_worker_job_duration_seconds{type}               histogram: time a job's handler ran
//	matbus_worker_sync_results_total{outcome}              counter: sync job results sent to the scheduler (synced, unchanged, skipped, fetch-failed, apply-failed)
//	matbus_worker_mat_fetch_duration_seconds               histogram: one MAT status request, success or not
//	matbus_worker_mat_fetch_failures_total                 counter: sync jobs whose status fetch failed (nothing changed)
//	matbus_worker_sync_job_delay_seconds{stage}            histogram: from a sync job's publication (its envelope time) to stage received (its handler starts) and fetch (its status request starts)
//	matbus_instance_last_sync_success_timestamp_seconds{mat_instance}  gauge: Unix time of the instance's last sync job that fetched its status and converged it (synced or unchanged); the series goes with the instance
//	matbus_worker_held_deletes{mat_instance}              gauge: Services whose deletes a hold keeps back now (0 once released); the series goes with the hold record
//	matbus_worker_delete_hold_until_timestamp_seconds{mat_instance}  gauge: Unix time the hold of the instance's deletes ends, while its record exists (in force or released, until its deletes are done)
//	matbus_worker_delete_holds_total{reason}               counter: holds this worker started, by reason (all, share, epoch)
//	matbus_worker_standby                                  gauge: 1 while the worker stands by for a worker of another configuration that started later (it takes no jobs), else 0
//
// The instance's label is mat_instance, not instance: Prometheus gives every
// scraped series the target's own instance label (the pod's address) and
// renames an exported one to exported_instance.
//
// Every worker reports the hold gauges of every hold record of its
// namespace (it watches them), so aggregate them with max by (mat_instance).
//
// It returns an error when a name is already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "matbus", Subsystem: "worker", Name: "jobs_total",
			Help: "Job deliveries ended, by job type (sync, cleanup, delete) and outcome (ok, retried, failed, terminated)."}, []string{"type", "outcome"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "matbus", Subsystem: "worker", Name: "job_duration_seconds",
			Help: "Time a job's handler ran, by job type.", Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"type"}),
		syncResults: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "matbus", Subsystem: "worker", Name: "sync_results_total",
			Help: "Sync job results sent to the discovery scheduler, by outcome (synced, unchanged, skipped, fetch-failed, apply-failed)."}, []string{"outcome"}),
		fetchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "matbus", Subsystem: "worker", Name: "mat_fetch_duration_seconds",
			Help: "Duration of one MAT status request, successful or not.", Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		fetchFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "matbus", Subsystem: "worker", Name: "mat_fetch_failures_total",
			Help: "Sync jobs whose MAT status fetch failed (no Service was changed)."}),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "matbus", Name: "instance_last_sync_success_timestamp_seconds",
			Help: "Unix time of the instance's last sync job on this worker that fetched its status and converged its Services."}, []string{instanceLabel}),
		jobDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "matbus", Subsystem: "worker", Name: "sync_job_delay_seconds",
			Help:    "Time from a sync job's publication to its handler's start (stage received) and to the start of its status fetch (stage fetch).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"stage"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "worker", Name: "held_deletes",
			Help: "Services of the instance whose deletes a hold keeps back now (many devices vanished at once); 0 once the window ended and they are being deleted."}, []string{instanceLabel}),
		holdUntil: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "worker", Name: "delete_hold_until_timestamp_seconds",
			Help: "Unix time the confirmation window of the instance's held deletes ends, while the hold record exists."}, []string{instanceLabel}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "matbus", Subsystem: "worker", Name: "delete_holds_total",
			Help: "Holds of mass deletes this worker started, by reason (all, share, epoch)."}, []string{"reason"}),
	}
	m.standby = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "worker", Name: "standby",
		Help: "1 while the worker stands by (takes no jobs) for a worker with another configuration that started later, else 0."})
	for _, c := range []prometheus.Collector{m.jobs, m.jobDuration, m.syncResults, m.fetchDuration, m.fetchFailures, m.lastSync, m.jobDelay,
		m.held, m.holdUntil, m.holds, m.standby} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// jobType names a job type in metrics.
func jobType(t events.Type) string {
	switch t {
	case events.TypeSyncJob:
		return "sync"
	case events.TypeCleanupJob:
		return "cleanup"
	case events.TypeDeleteJob:
		return "delete"
	default:
		return "unknown"
	}
}

// jobOutcomes are the outcome labels of the runtime's outcomes.
var jobOutcomes = map[jobs.Outcome]string{jobs.OK: JobOK, jobs.Retried: JobRetried, jobs.Failed: JobFailed,
	jobs.Terminated: JobTerminated, jobs.Undecodable: JobTerminated}

func (m *Metrics) jobEnded(t events.Type, o jobs.Outcome, d time.Duration) {
	if m == nil {
		return
	}
	m.jobs.WithLabelValues(jobType(t), jobOutcomes[o]).Inc()
	if d >= 0 {
		m.jobDuration.WithLabelValues(jobType(t)).Observe(d.Seconds())
	}
}

// Stages of matbus_worker_sync_job_delay_seconds.
const (
	delayReceived = "received"
	delayFetch    = "fetch"
)

// jobDelayed records the time from a sync job's publication (published;
// zero: not a job) to stage.
func (m *Metrics) jobDelayed(stage string, published, at time.Time) {
	if m == nil || published.IsZero() {
		return
	}
	m.jobDelay.WithLabelValues(stage).Observe(max(at.Sub(published), 0).Seconds())
}

func (m *Metrics) fetched(d time.Duration) {
	if m != nil {
		m.fetchDuration.Observe(d.Seconds())
	}
}

func (m *Metrics) syncResult(key, outcome string, at time.Time) {
	if m == nil {
		return
	}
	m.syncResults.WithLabelValues(outcome).Inc()
	switch outcome {
	case events.OutcomeFetchFailed:
		m.fetchFailures.Inc()
	case events.OutcomeSynced, events.OutcomeUnchanged:
		m.lastSync.WithLabelValues(key).Set(float64(at.UnixNano()) / 1e9)
	}
}

// forget drops the series of an instance that is gone.
func (m *Metrics) forget(key string) {
	if m != nil {
		m.lastSync.DeleteLabelValues(key)
	}
}

// series counts the per-instance series of the last sync's time.
func (m *Metrics) series() int {
	if m == nil {
		return 0
	}
	ch := make(chan prometheus.Metric, 16)
	go func() { m.lastSync.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// holdSeen records hold record r.
func (m *Metrics) holdSeen(r events.HoldRecord) {
	if m == nil {
		return
	}
	n := r.Held
	if !r.InForce() {
		n = 0
	}
	m.held.WithLabelValues(r.Key).Set(float64(n))
	m.holdUntil.WithLabelValues(r.Key).Set(float64(r.Until.UnixNano()) / 1e9)
}

// holdGone drops the hold series of instance key.
func (m *Metrics) holdGone(key string) {
	if m != nil {
		m.held.DeleteLabelValues(key)
		m.holdUntil.DeleteLabelValues(key)
	}
}

// holdStarted counts a hold this worker started.
func (m *Metrics) holdStarted(reason string) {
	if m != nil {
		m.holds.WithLabelValues(reason).Inc()
	}
}

// setStandby sets matbus_worker_standby.
func (m *Metrics) setStandby(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.standby.Set(v)
}
