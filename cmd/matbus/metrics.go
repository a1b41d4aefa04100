package main

import (
	"context"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/kubewatch"
)

// revision is the VCS revision the binary was built from, with "-dirty"
// for a modified tree: the Go build info's, else main.commit, else "unknown".
func revision() string {
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

// consumerCollector exports, on each scrape, the state of this
// namespace's durable job consumers, read from JetStream (each read
// bounded by 2 s; a consumer that cannot be read is left out):
//
//	matbus_consumer_pending_messages{consumer}       jobs stored and not yet delivered
//	matbus_consumer_ack_pending_messages{consumer}   jobs delivered and not yet acknowledged
//	matbus_consumer_redelivered_messages{consumer}   jobs delivered more than once and not yet acknowledged
type consumerCollector struct {
	bus                          *events.Bus
	pending, ackPending, redeliv *prometheus.Desc
}

func newConsumerCollector(bus *events.Bus) *consumerCollector {
	l := []string{"consumer"}
	return &consumerCollector{bus: bus,
		pending:    prometheus.NewDesc("matbus_consumer_pending_messages", "Jobs stored for the durable consumer and not yet delivered.", l, nil),
		ackPending: prometheus.NewDesc("matbus_consumer_ack_pending_messages", "Jobs delivered by the durable consumer and not yet acknowledged.", l, nil),
		redeliv:    prometheus.NewDesc("matbus_consumer_redelivered_messages", "Jobs delivered more than once and not yet acknowledged.", l, nil)}
}

func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redeliv
}

func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
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

// discoveryRegistry returns the registry of a discovery process: newRegistry,
// eventMetrics, the scheduler's (schedulerMetrics), watch's
// (kubewatch.NewCollector; watch is nil for a static source) and
//
//	matbus_discovery_leader                           1 while this process holds the Lease
//	matbus_discovery_instances                        instances the leader's source reports
//	matbus_discovery_last_success_timestamp_seconds   the leader's last successful sync tick
//
// The pointers are what the process leads with (nil while following).
func discoveryRegistry(bus *events.Bus, rep *events.Reporter, leading *atomic.Bool, sched *atomic.Pointer[discovery.Scheduler],
	cur *atomic.Pointer[leadState], watch *kubewatch.Tracker) *prometheus.Registry {
	reg := health.NewRegistry(version, revision())
	health.EventMetrics(reg, bus, rep)
	reg.MustRegister(kubewatch.NewCollector(watch))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "discovery", Name: "leader",
		Help: "1 while this publisher holds the Lease."}, func() float64 {
		if leading.Load() {
			return 1
		}
		return 0
	}))
	health.SchedulerMetrics(reg, sched)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "discovery", Name: "last_success_timestamp_seconds",
		Help: "Unix time of the leader's last sync tick that read the instances stream and published every event it had to (0 while not leading or before the first)."},
		func() float64 {
			if st := cur.Load(); st != nil {
				if t := st.pub.LastSuccess(); !t.IsZero() {
					return float64(t.UnixNano()) / 1e9
				}
			}
			return 0
		}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "matbus", Subsystem: "discovery", Name: "instances",
		Help: "MAT instances the leader's source currently reports (0 while not leading or before its source synced)."},
		func() float64 {
			if st := cur.Load(); st != nil {
				if insts, ok := st.src.Instances(); ok {
					return float64(len(insts))
				}
			}
			return 0
		}))
	return reg
}
