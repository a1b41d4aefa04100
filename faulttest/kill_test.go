package faulttest

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// TestKillWorkerMidFanOut (issue point 2): three worker processes; per
// trial an instance with 150 Services goes away while another one (and
// every instance of earlier trials) stays, and one worker is killed with
// SIGKILL part-way: at the moment it starts fanning out the delete jobs
// (it holds the clean-up job and has published only part of them), or
// once 10 %, 50 % or 90 % of the Services are deleted (it may hold delete
// jobs in flight). Every unacknowledged job must come back to the other
// workers: the gone instance ends with 0 Services, the staying ones keep
// every Service with its UID, the job streams drain and no error event is
// published. The killed worker is replaced before the next trial.
//
// Trials: 5, or -trials / $FAULT_TRIALS (`make faulttest-long` runs 20).
func TestKillWorkerMidFanOut(t *testing.T) {
	w := newWorld(t)
	n := trials()
	workers := []*proc{w.startWorker("w1"), w.startWorker("w2"), w.startWorker("w3")}
	var disc *staticDiscovery
	stay := map[string]string{} // Service name → UID of everything that must stay
	var stays []*instance
	var recovery []time.Duration

	for trial := range n {
		gone := w.newInstance(fmt.Sprintf("gone-%d", trial), fleetSpec{hosts: 60, switches: 15, shelves: 15}, 0)
		keep := w.newInstance(fmt.Sprintf("stay-%d", trial), fleetSpec{hosts: 10, switches: 5, shelves: 5}, 0)
		if disc == nil {
			disc = w.startStaticDiscovery(gone, keep)
		} else {
			disc.Add(gone, keep)
		}
		total := len(gone.waitConverged(time.Minute))
		maps.Copy(stay, uidsOf(keep.waitConverged(time.Minute)))
		stays = append(stays, keep)

		variant := trial % 4
		var victim *proc
		var point string
		if variant == 0 {
			// Kill whichever worker takes the clean-up job, as soon as it
			// logs the start of its fan-out.
			point = "start of the fan-out (clean-up job in flight, delete jobs partly published)"
			lines, stopWatch := firstToLog(workers, "instance gone: deleting its Services", "instance="+gone.key())
			disc.Remove(gone)
			select {
			case victim = <-lines:
				victim.Kill()
				stopWatch()
			case <-time.After(time.Minute):
				stopWatch()
				t.Fatalf("trial %d: no worker started the fan-out for %s", trial, gone.name)
			}
		} else {
			frac := map[int]float64{1: 0.1, 2: 0.5, 3: 0.9}[variant]
			point = fmt.Sprintf("%.0f %% of the Services deleted (delete jobs in flight)", frac*100)
			victim = workers[trial%len(workers)]
			disc.Remove(gone)
			w.waitFor(point, time.Minute, func() (bool, string) {
				left := len(gone.services())
				return float64(total-left) >= frac*float64(total), fmt.Sprintf("%d of %d left", left, total)
			})
			victim.Kill()
		}
		killed := time.Now()
		left := len(gone.services())
		gone.waitGone(time.Minute)
		took := time.Since(killed)
		recovery = append(recovery, took)
		t.Logf("trial %d: killed %s at %s with %d of %d Services left; all gone %v later",
			trial, victim.name, point, left, total, took.Round(time.Millisecond))

		// Nothing that should stay was touched.
		for _, in := range stays {
			got := in.services()
			if len(got) != len(in.want()) {
				t.Errorf("trial %d: %s has %d Services, want %d", trial, in.name, len(got), len(in.want()))
			}
			for name, s := range got {
				if stay[name] != string(s.UID) {
					t.Errorf("trial %d: %s/%s was deleted and re-created (uid %s, was %s)", trial, in.name, name, s.UID, stay[name])
				}
			}
		}
		// Every job was acknowledged in the end: nothing stored, nothing pending.
		w.waitFor("job queues drained", time.Minute, func() (bool, string) {
			d, err := w.streamMsgs("DELETE")
			if err != nil {
				return false, err.Error()
			}
			ci, err := w.consumerInfo("DELETE", events.DeleteConsumer)
			if err != nil {
				return false, err.Error()
			}
			return d == 0 && ci.NumAckPending == 0, fmt.Sprintf("delete jobs stored %d, ack pending %d", d, ci.NumAckPending)
		})

		// Replace the victim.
		for i, p := range workers {
			if p == victim {
				workers[i] = w.startWorker(fmt.Sprintf("w%d-r%d", i+1, trial))
			}
		}
	}
	var sum time.Duration
	worst := time.Duration(0)
	for _, d := range recovery {
		sum += d
		worst = max(worst, d)
	}
	t.Logf("measured: %d kill -9 trials, time from kill to all Services gone: mean %v, max %v (AckWait %v)",
		n, (sum / time.Duration(n)).Round(time.Millisecond), worst.Round(time.Millisecond), ackWait)
	if n := w.errs.Len(); n != 0 {
		t.Errorf("%d error events, want none:\n%s", n, w.errs)
	}
}
