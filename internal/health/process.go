package health

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubewatch"
	"github.com/matbus/matbus/worker"
)

// Revision is the VCS revision the binary was built from, with "-dirty"
// for a modified tree: the Go build info's, else commit (set at link
// time), else "unknown".
func Revision(commit string) string {
	fallback := commit
	if fallback == "" {
		fallback = "unknown"
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fallback
	}
	rev, dirty := fallback, false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && rev != fallback {
		rev += "-dirty"
	}
	return rev
}

// Lead is what a leading discovery process runs, as its metrics and
// readiness read it; the process keeps an atomic.Pointer[Lead] that is
// nil while it follows.
type Lead struct {
	Publisher *discovery.Publisher
	Source    discovery.Source
	Since     time.Time // when this process took the lead
}

// DiscoveryRegistry returns the registry of a discovery process of the
// given version and revision: NewRegistry, EventMetrics, the scheduler's
// (SchedulerMetrics), watch's (kubewatch.NewCollector; watch is nil for a
// static source) and
//
//	matbus_discovery_leader                           1 while this process holds the Lease
//	matbus_discovery_instances                        instances the leader's source reports
//	matbus_discovery_last_success_timestamp_seconds   the leader's last successful sync tick
//
// The pointers are what the process leads with (nil while following).
func DiscoveryRegistry(version, revision string, bus *events.Bus, rep *events.Reporter, leading *atomic.Bool, sched *atomic.Pointer[discovery.Scheduler],
	cur *atomic.Pointer[Lead], watch *kubewatch.Tracker) *prometheus.Registry {
	reg := NewRegistry(version, revision)
	EventMetrics(reg, bus, rep)
	reg.MustRegister(kubewatch.NewCollector(watch))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "discovery", Name: "leader",
		Help: "1 while this publisher holds the Lease."}, func() float64 {
		if leading.Load() {
			return 1
		}
		return 0
	}))
	SchedulerMetrics(reg, sched)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "discovery", Name: "last_success_timestamp_seconds",
		Help: "Unix time of the leader's last sync tick that read the instances stream and published every event it had to (0 while not leading or before the first)."},
		func() float64 {
			if st := cur.Load(); st != nil {
				if t := st.Publisher.LastSuccess(); !t.IsZero() {
					return float64(t.UnixNano()) / 1e9
				}
			}
			return 0
		}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "discovery", Name: "instances",
		Help: "MAT instances the leader's source currently reports (0 while not leading or before its source synced)."},
		func() float64 {
			if st := cur.Load(); st != nil {
				if insts, ok := st.Source.Instances(); ok {
					return float64(len(insts))
				}
			}
			return 0
		}))
	return reg
}

// DiscoveryReadiness: connected to NATS; the Kubernetes API answers (when
// discovery uses it: probe is nil for a static source without election);
// the source's informer lists and watches (watch, nil for a static
// source: on every replica, since each serves the sources API from it);
// and, while leading, the source has synced and a sync tick succeeded
// within staleAfter (counted from taking the lead). A follower that can
// reach NATS and the API is ready: it is what takes over.
func DiscoveryReadiness(nc *nats.Conn, probe *APIProbe, watch *kubewatch.Tracker, cur *atomic.Pointer[Lead], staleAfter time.Duration) Readiness {
	r := Readiness{NATS(nc)}
	if probe != nil {
		r = append(r, probe.Check())
	}
	if watch != nil {
		r = append(r, Informer(watch))
	}
	r = append(r, Check{Name: "discovery", Check: func() error {
		if st := cur.Load(); st != nil {
			if _, ok := st.Source.Instances(); !ok {
				return fmt.Errorf("source %s has not synced (informer not synced)", st.Source.Scope())
			}
		}
		return nil
	}}, Freshness("sync tick", staleAfter,
		func() time.Time {
			if st := cur.Load(); st != nil {
				return st.Publisher.LastSuccess()
			}
			return time.Time{}
		},
		func() time.Time {
			if st := cur.Load(); st != nil {
				return st.Since
			}
			return time.Time{}
		}))
	return r
}

// WorkerReadiness: connected to NATS, the Kubernetes API answers, the
// Service informer lists and watches (and the clean-up's lists succeed),
// and the worker runs (its Service informer has synced, its consumers
// run and it takes jobs: it does not stand by for a worker of another
// configuration).
func WorkerReadiness(nc *nats.Conn, probe *APIProbe, w *worker.Worker) Readiness {
	return Readiness{NATS(nc), probe.Check(), Informer(w.WatchHealth()), Check{Name: "worker", Check: func() error {
		if !w.Ready() {
			return errors.New("the Service informer has not synced, or the job consumers are not running")
		}
		return w.TakesJobs()
	}}}
}

// ConsumerCollector exports, on each scrape, the state of this
// namespace's durable job consumers, read from JetStream (each read
// bounded by 2 s; a consumer that cannot be read is left out):
//
//	matbus_consumer_pending_messages{consumer}       jobs stored and not yet delivered
//	matbus_consumer_ack_pending_messages{consumer}   jobs delivered and not yet acknowledged
//	matbus_consumer_redelivered_messages{consumer}   jobs delivered more than once and not yet acknowledged
type ConsumerCollector struct {
	bus                          *events.Bus
	pending, ackPending, redeliv *prometheus.Desc
}

// NewConsumerCollector returns the collector of bus's namespace.
func NewConsumerCollector(bus *events.Bus) *ConsumerCollector {
	l := []string{"consumer"}
	return &ConsumerCollector{bus: bus,
		pending:    prometheus.NewDesc("matbus_consumer_pending_messages", "Jobs stored for the durable consumer and not yet delivered.", l, nil),
		ackPending: prometheus.NewDesc("matbus_consumer_ack_pending_messages", "Jobs delivered by the durable consumer and not yet acknowledged.", l, nil),
		redeliv:    prometheus.NewDesc("matbus_consumer_redelivered_messages", "Jobs delivered more than once and not yet acknowledged.", l, nil)}
}

// Describe sends the three descriptions.
func (c *ConsumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redeliv
}

// Collect reads both consumers from JetStream.
func (c *ConsumerCollector) Collect(ch chan<- prometheus.Metric) {
	ns := c.bus.Config().Namespace
	for _, role := range []string{events.SyncConsumer, events.DeleteConsumer} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		name := events.ConsumerName(role, ns)
		info, err := c.bus.ConsumerInfo(ctx, role)
		cancel()
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(info.NumPending), name)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(info.NumAckPending), name)
		ch <- prometheus.MustNewConstMetric(c.redeliv, prometheus.GaugeValue, float64(info.NumRedelivered), name)
	}
}
