package worker_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/worker"
)

// slowDeletes returns the admin's API configuration with every DELETE of a
// Service held for d before it is sent: a fan-out then lasts several polls.
func slowDeletes(d time.Duration) *rest.Config {
	rc := rest.CopyConfig(cluster.RESTConfig())
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodDelete && strings.Contains(r.URL.Path, "/services/") {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			}
			return rt.RoundTrip(r)
		})
	})
	return rc
}

// TestFanOutPlansOnce: while the delete jobs of a fan-out delete an
// instance's Services one by one, the polls of that instance do not plan
// again for each delete: the deletes are what the plan asked for. One
// worker plans the new status once; with two workers, each plans it once,
// and the one that found the other's delete jobs queued plans once more
// when the queue is empty (and publishes nothing: every Service is gone).
// Polls keep coming during the fan-out, so a re-plan per delete would show.
func TestFanOutPlansOnce(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			e := newEnv(t)
			fl, err := matsim.Generate(matsim.FleetSpec{Hosts: 8, DPUsPerHost: 2, BMCSubnet: "10.101.0.0/24", Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			want := wantServiceNames(fl)
			sim := e.startSim(matsim.Options{Fleet: fl})
			e.startPolling(e.entry("mat-a", sim.URL()))
			var ws []*testWorker
			for i := range workers {
				ws = append(ws, e.startWorker(workerOpts{Name: fmt.Sprintf("fan-%d", i), Rest: slowDeletes(250 * time.Millisecond),
					Tweak: func(c *worker.Config) { c.DeleteJobs = 1 }}))
			}
			e.waitServices(want...)
			e.steady(ws[0], sim)
			planned := func() (n int64, syncs int64) {
				for _, w := range ws {
					st := w.Stats()
					n += st.Syncs - st.Unchanged
					syncs += st.Syncs
				}
				return n, syncs
			}
			plans0, syncs0 := planned()

			if err := sim.SetFleet(&matsim.Fleet{InventoryID: fl.InventoryID}); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			waitFor(t, "every Service deleted", func() (bool, string) {
				n := len(e.services())
				return n == 0, fmt.Sprintf("%d left", n)
			})
			took := time.Since(t0)
			// Polls of the emptied instance after the last delete.
			_, syncs := planned()
			waitFor(t, "3 more sync jobs", func() (bool, string) {
				_, n := planned()
				return n >= syncs+3, fmt.Sprintf("%d sync jobs", n)
			})
			plans, syncs := planned()
			var deleted, jobs int64
			for _, w := range ws {
				deleted += w.Stats().Deleted
				jobs += w.Stats().DeleteJobs
			}
			t.Logf("fan-out of %d Services in %v: %d sync jobs, %d planned, %d delete jobs published", len(want), took.Round(time.Millisecond), syncs-syncs0, plans-plans0, jobs)
			if polls := syncs - syncs0; polls < 4 {
				t.Fatalf("only %d sync jobs during and after a %v fan-out: the test shows nothing", polls, took)
			}
			if deleted != int64(len(want)) {
				t.Errorf("%d Services deleted, want %d", deleted, len(want))
			}
			if got, max := plans-plans0, int64(2*workers-1); got > max {
				t.Errorf("%d plans during the fan-out, want at most %d (one per worker, and one after the queue emptied for each other worker)", got, max)
			}
		})
	}
}

// TestDeviceGoneDuringFanOut: a device that goes while the delete jobs of
// an earlier removal are still queued is not published at once (the
// instance's delete queue is not empty); its Services are deleted once the
// queue is empty, without waiting for a full resync, and no Service that
// stays is touched.
func TestDeviceGoneDuringFanOut(t *testing.T) {
	e := newEnv(t)
	fl, err := matsim.Generate(matsim.FleetSpec{Hosts: 8, DPUsPerHost: 2, BMCSubnet: "10.101.0.0/24", Seed: 6})
	if err != nil {
		t.Fatal(err)
	}
	keep := func(from int) *matsim.Fleet {
		f := fl.Clone()
		f.Machines = f.Machines[from:]
		return f
	}
	sim := e.startSim(matsim.Options{Fleet: fl})
	e.startPolling(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{Rest: slowDeletes(250 * time.Millisecond), Tweak: func(c *worker.Config) { c.DeleteJobs = 1 }})
	before := e.waitServices(wantServiceNames(fl)...)

	if err := sim.SetFleet(keep(4)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fan-out under way", func() (bool, string) {
		n := w.Stats().Deleted
		return n >= 2, fmt.Sprintf("%d deleted", n)
	})
	if err := sim.SetFleet(keep(5)); err != nil {
		t.Fatal(err)
	}
	want := wantServiceNames(keep(5))
	waitFor(t, "only the remaining devices' Services", func() (bool, string) {
		got := e.services()
		return len(got) == len(want), fmt.Sprintf("%d Services, want %d", len(got), len(want))
	})
	after := e.waitServices(want...)
	for _, n := range want {
		if after[n].UID != before[n].UID || after[n].ResourceVersion != before[n].ResourceVersion {
			t.Errorf("%s was touched", n)
		}
	}
	if d := w.Stats().Deleted; d != int64(len(before)-len(want)) {
		t.Errorf("%d Services deleted, want %d", d, len(before)-len(want))
	}
}
