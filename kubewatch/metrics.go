package kubewatch

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the state of Trackers at scrape time:
//
//	matbus_informer_healthy{informer}              gauge: 1 while no list or watch call of the resource fails, 0 while one does (/readyz is then 503)
//	matbus_informer_failures_total{informer,verb}  counter: failed list and watch calls, verb list|watch
//	matbus_informer_calls_total{informer,verb}     counter: list and watch calls, failed or not (relists and re-opened watches)
//	matbus_informer_events_total{informer,type}    counter: objects delivered to the informer's handlers, type listed (first list) | added | updated | deleted
//
// informer is the Tracker's resource (e.g. "services").
type Collector struct {
	trackers []*Tracker
	healthy  *prometheus.Desc
	failures *prometheus.Desc
	calls    *prometheus.Desc
	events   *prometheus.Desc
}

// NewCollector returns the Collector of trackers (nil ones are skipped;
// none at all still describes both metrics).
func NewCollector(trackers ...*Tracker) *Collector {
	c := &Collector{
		healthy: prometheus.NewDesc("matbus_informer_healthy",
			"1 while the informer's list and watch calls succeed, 0 while one fails (the process is not ready).", []string{"informer"}, nil),
		failures: prometheus.NewDesc("matbus_informer_failures_total",
			"Failed list and watch calls of the informer, by verb.", []string{"informer", "verb"}, nil),
		calls: prometheus.NewDesc("matbus_informer_calls_total",
			"List and watch calls of the informer, failed or not, by verb.", []string{"informer", "verb"}, nil),
		events: prometheus.NewDesc("matbus_informer_events_total",
			"Objects the informer delivered to its handlers: listed (its first list), added, updated, deleted.", []string{"informer", "type"}, nil),
	}
	for _, t := range trackers {
		if t != nil {
			c.trackers = append(c.trackers, t)
		}
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.failures
	ch <- c.calls
	ch <- c.events
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.trackers {
		v := 1.0
		if len(t.Failing()) > 0 {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, v, t.resource)
		failures, calls := t.Failures(), t.Calls()
		for _, verb := range verbs {
			ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(failures[verb]), t.resource, verb)
			ch <- prometheus.MustNewConstMetric(c.calls, prometheus.CounterValue, float64(calls[verb]), t.resource, verb)
		}
		for kind, n := range t.EventCounts() {
			ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(n), t.resource, kind)
		}
	}
}
