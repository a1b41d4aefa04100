package faulttest

import (
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// sample returns the value of the series of name whose labels include
// every k="v" of labels (pairs), and whether there is one.
func sample(m map[string]float64, name string, labels ...string) (float64, bool) {
	for key, v := range m {
		n, rest, _ := strings.Cut(key, "{")
		if n != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(rest, fmt.Sprintf("%s=%q", labels[i], labels[i+1])) {
				ok = false
			}
		}
		if ok {
			return v, true
		}
	}
	return 0, false
}

// metricsCheck collects mismatches of one scrape.
type metricsCheck struct {
	t    *testing.T
	p    *proc
	m    map[string]float64
	errs []string
}

func scrape(t *testing.T, p *proc) *metricsCheck {
	t.Helper()
	m, err := p.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return &metricsCheck{t: t, p: p, m: m}
}

func (c *metricsCheck) get(name string, labels ...string) float64 {
	v, ok := sample(c.m, name, labels...)
	if !ok {
		c.errs = append(c.errs, fmt.Sprintf("%s %v: not exported", name, labels))
	}
	return v
}

func (c *metricsCheck) eq(want float64, name string, labels ...string) {
	if v, ok := sample(c.m, name, labels...); ok && v != want {
		c.errs = append(c.errs, fmt.Sprintf("%s %v = %v, want %v", name, labels, v, want))
	} else if !ok {
		c.get(name, labels...)
	}
}

func (c *metricsCheck) atLeast(want float64, name string, labels ...string) {
	if v, ok := sample(c.m, name, labels...); ok && v < want {
		c.errs = append(c.errs, fmt.Sprintf("%s %v = %v, want at least %v", name, labels, v, want))
	} else if !ok {
		c.get(name, labels...)
	}
}

func (c *metricsCheck) absent(name string, labels ...string) {
	if _, ok := sample(c.m, name, labels...); ok {
		c.errs = append(c.errs, fmt.Sprintf("%s %v is exported, want none", name, labels))
	}
}

func (c *metricsCheck) done() {
	c.t.Helper()
	if len(c.errs) > 0 {
		sort.Strings(c.errs)
		c.t.Errorf("%s /metrics:\n  %s", c.p.name, strings.Join(c.errs, "\n  "))
	}
}

// closedURL is an HTTP URL on which nothing listens.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + l.Addr().String()
	_ = l.Close()
	return u
}

// TestMetricsAfterScriptedRun runs one discovery and one worker process
// through a scripted run — an instance that converges and is then removed
// (a delete fan-out), and an instance whose MAT never answers — and checks
// the values each /metrics reports, not only their names.
func TestMetricsAfterScriptedRun(t *testing.T) {
	w := newWorld(t)
	start := float64(time.Now().Unix())
	good := w.newInstance("mat-good", fleetSpec{hosts: 2, switches: 1, shelves: 1}, 0)
	bad := &instance{w: w, name: "mat-bad", url: closedURL(t)}
	w.discover(good)
	w.discover(bad)
	wk := w.startWorker("w1")
	disc := w.startDiscovery("disc", "--probe-max-interval", "2s")
	svcs := good.waitConverged(time.Minute)
	n := float64(len(svcs))
	w.waitFor("mat-bad out of rotation", 30*time.Second, func() (bool, string) {
		m, err := disc.Metrics()
		if err != nil {
			return false, err.Error()
		}
		v, _ := sample(m, "matbus_scheduler_instances_out_of_rotation")
		return v == 1, fmt.Sprint(v, " out of rotation")
	})

	// While both are present.
	c := scrape(t, wk)
	c.atLeast(start, "matbus_instance_last_sync_success_timestamp_seconds", "mat_instance", good.key())
	c.absent("matbus_instance_last_sync_success_timestamp_seconds", "mat_instance", w.key(bad.name))
	c.eq(n, "matbus_worker_services_created_total")
	c.atLeast(n, "matbus_kube_write_duration_seconds_count", "method", "POST")
	c.done()
	c = scrape(t, disc)
	c.eq(1, "matbus_discovery_leader")
	c.eq(2, "matbus_discovery_instances")
	c.eq(2, "matbus_scheduler_instances")
	c.atLeast(start, "matbus_discovery_last_success_timestamp_seconds")
	c.done()

	// Both go: the good one's Services are deleted by delete jobs.
	w.undiscover(good)
	w.undiscover(bad)
	good.waitGone(time.Minute)
	syncCons, delCons := events.ConsumerName(events.SyncConsumer, w.ns), events.ConsumerName(events.DeleteConsumer, w.ns)
	w.waitFor("idle consumers", 30*time.Second, func() (bool, string) {
		m, err := wk.Metrics()
		if err != nil {
			return false, err.Error()
		}
		var sum float64
		for _, name := range []string{"matbus_consumer_pending_messages", "matbus_consumer_ack_pending_messages"} {
			for _, cons := range []string{syncCons, delCons} {
				v, ok := sample(m, name, "consumer", cons)
				if !ok {
					return false, name + " of " + cons + " not exported"
				}
				sum += v
			}
		}
		return sum == 0, fmt.Sprint(sum, " jobs pending or unacknowledged")
	})
	time.Sleep(2 * time.Second) // results of the last jobs reach the scheduler

	c = scrape(t, wk)
	c.eq(1, "matbus_build_info")
	c.get("go_goroutines")
	c.get("process_start_time_seconds")
	c.eq(n, "matbus_worker_services_created_total")
	c.eq(n, "matbus_worker_delete_jobs_published_total")
	c.eq(n, "matbus_worker_services_deleted_total")
	c.eq(n, "matbus_events_published_total", "type", string(events.TypeDeleteJob))
	c.eq(n, "matbus_worker_jobs_total", "type", "delete", "outcome", "ok")
	c.eq(2, "matbus_worker_jobs_total", "type", "cleanup", "outcome", "ok")
	c.eq(n, "matbus_kube_write_duration_seconds_count", "method", "DELETE")
	c.absent("matbus_worker_jobs_total", "outcome", "failed")
	c.absent("matbus_worker_jobs_total", "outcome", "terminated")
	fetchFailed := c.get("matbus_worker_sync_results_total", "outcome", events.OutcomeFetchFailed)
	if fetchFailed < 3 {
		t.Errorf("%v failed fetches of mat-bad, want at least 3 (it was taken out of rotation)", fetchFailed)
	}
	c.eq(fetchFailed, "matbus_worker_mat_fetch_failures_total")
	c.atLeast(fetchFailed, "matbus_worker_jobs_failed_total")
	c.atLeast(fetchFailed+1, "matbus_worker_mat_fetch_duration_seconds_count")
	c.atLeast(1, "matbus_error_events_total", "kind", "fetch")
	c.atLeast(1, "matbus_worker_job_duration_seconds_count", "type", "sync")
	c.absent("matbus_instance_last_sync_success_timestamp_seconds", "mat_instance", good.key())
	c.absent("matbus_publish_failures_total") // none failed
	c.done()

	c = scrape(t, disc)
	c.eq(2, "matbus_events_published_total", "type", string(events.TypeInstanceAppeared))
	c.eq(2, "matbus_events_published_total", "type", string(events.TypeInstanceGone))
	c.eq(2, "matbus_events_published_total", "type", string(events.TypeCleanupJob))
	c.atLeast(fetchFailed, "matbus_events_published_total", "type", string(events.TypeSyncJob))
	c.eq(fetchFailed, "matbus_scheduler_results_total", "outcome", events.OutcomeFetchFailed)
	c.atLeast(1, "matbus_error_events_total", "kind", "fetch") // out of rotation
	c.eq(0, "matbus_discovery_instances")
	c.done()
}
