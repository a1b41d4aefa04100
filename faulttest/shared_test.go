package faulttest

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// TestSharedJobsOverWorkerProcesses (issue point 1): three worker processes
// on one nats-server and one API server share the sync and delete jobs.
// A 1,000-device instance is created, then goes away: its clean-up job fans
// out 1,000 delete jobs, which the three workers share. Every Service ends
// deleted exactly once (the sum of the workers' delete counters is 1,000),
// no job is delivered twice, no error event is published, and the Services
// of the other instances are never re-created.
func TestSharedJobsOverWorkerProcesses(t *testing.T) {
	w := newWorld(t)
	big := w.newInstance("big", fleetSpec{hosts: 400, switches: 100, shelves: 100}, 0)
	if n := len(big.want()); n != 1000 {
		t.Fatalf("big fleet has %d BMCs, want 1000", n)
	}
	var small []*instance
	for i := range 4 {
		small = append(small, w.newInstance(fmt.Sprintf("small-%d", i), fleetSpec{hosts: 3, switches: 1, shelves: 1}, 0))
	}
	workers := []*proc{w.startWorker("w1"), w.startWorker("w2"), w.startWorker("w3")}
	disc := w.startStaticDiscovery(append([]*instance{big}, small...)...)

	start := time.Now()
	big.waitConverged(2 * time.Minute)
	t.Logf("measured: 1,000 Services created by 3 worker processes in %v", time.Since(start).Round(time.Millisecond))
	stay := map[string]string{}
	for _, in := range small {
		maps.Copy(stay, uidsOf(in.waitConverged(30*time.Second)))
	}

	syncs, each := sumMetric(t, "matbus_worker_syncs_total", workers...)
	t.Logf("sync jobs done per worker: %v (sum %v)", each, syncs)
	for i, n := range each {
		if n == 0 {
			t.Errorf("worker %s did no sync job: the jobs are not shared", workers[i].name)
		}
	}

	// The burst: one clean-up job fans out 1,000 delete jobs.
	start = time.Now()
	disc.Remove(big)
	big.waitGone(2 * time.Minute)
	t.Logf("measured: 1,000 delete jobs done by 3 worker processes in %v (from the gone event)", time.Since(start).Round(time.Millisecond))

	// Every delete job was acknowledged (after its worker counted it).
	w.waitFor("delete consumer drained", 10*time.Second, func() (bool, string) {
		ci, err := w.consumerInfo("DELETE", events.DeleteConsumer)
		if err != nil {
			return false, err.Error()
		}
		n, err := w.streamMsgs("DELETE")
		if err != nil {
			return false, err.Error()
		}
		return ci.NumAckPending == 0 && ci.NumPending == 0 && n == 0,
			fmt.Sprintf("ack pending %d, pending %d, stored %d", ci.NumAckPending, ci.NumPending, n)
	})
	deleted, each := sumMetric(t, "matbus_worker_services_deleted_total", workers...)
	published, _ := sumMetric(t, "matbus_worker_delete_jobs_published_total", workers...)
	t.Logf("Services deleted per worker: %v (sum %v); delete jobs published: %v", each, deleted, published)
	if deleted != 1000 {
		t.Errorf("workers deleted %v Services in all, want exactly 1000", deleted)
	}
	for i, n := range each {
		if n == 0 {
			t.Errorf("worker %s deleted nothing: the delete jobs are not shared", workers[i].name)
		}
	}
	if published != 1000 {
		t.Errorf("%v delete jobs published, want 1000 (one per Service)", published)
	}
	// Each delete job was delivered once: the consumer's delivery sequence
	// equals the stream's last sequence.
	ci, err := w.consumerInfo("DELETE", events.DeleteConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Delivered.Consumer != ci.Delivered.Stream || ci.Delivered.Stream != 1000 {
		t.Errorf("delete consumer: %d deliveries of %d jobs; want 1000 of 1000 (no redelivery)", ci.Delivered.Consumer, ci.Delivered.Stream)
	}

	// The other instances were left alone all along: same UIDs.
	for _, in := range small {
		for n, s := range in.services() {
			if stay[n] != string(s.UID) {
				t.Errorf("%s: Service %s was re-created (uid %s, was %s)", in.name, n, s.UID, stay[n])
			}
		}
		if got := len(in.services()); got != len(in.want()) {
			t.Errorf("%s: %d Services, want %d", in.name, got, len(in.want()))
		}
	}
	if n := w.errs.Len(); n != 0 {
		t.Errorf("%d error events, want none:\n%s", n, w.errs)
	}
}
