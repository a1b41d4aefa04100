package worker_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// serviceVerbs are the verbs on Services a worker is granted (the chart's
// Role).
var serviceVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// recoverTimeout bounds a wait for an informer to list or watch again
// after its verb is granted back: client-go's reflector retries a failed
// list or watch with a backoff of up to 30 s.
const recoverTimeout = 90 * time.Second

// allBut returns serviceVerbs less drop.
func allBut(drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(serviceVerbs), func(v string) bool { return slices.Contains(drop, v) })
}

// setVerbs replaces the verbs of the Role grant made for user.
func (e *env) setVerbs(user string, verbs ...string) {
	e.t.Helper()
	roles := e.kube.RbacV1().Roles(e.ns)
	r, err := roles.Get(e.ctx, user, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get Role: %v", err)
	}
	r.Rules[0].Verbs = verbs
	if _, err := roles.Update(e.ctx, r, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("update Role: %v", err)
	}
}

// as returns the admin's client configuration impersonating user.
func as(user string) *rest.Config {
	rc := cluster.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	return rc
}

// readiness is what the worker's /readyz adds to NATS and the API probe
// (cmd/matbus workerReadiness): the informer's list and watch work, and
// the worker runs.
func readiness(w *testWorker) error {
	if err := w.WatchHealth().Err(); err != nil {
		return fmt.Errorf("informer: %w", err)
	}
	if !w.Ready() {
		return fmt.Errorf("worker: not running")
	}
	return nil
}

// watchEvents returns the messages of the error events of kind watch.
func (e *env) watchEvents() []string {
	var out []string
	for _, ev := range e.errs.Of(events.ErrorWatch) {
		out = append(out, ev.Message)
	}
	return out
}

// expectWatchFailure waits until readiness names verb as failing with the
// API server's refusal, and checks that one start event and one log line
// said so.
func (e *env) expectWatchFailure(w *testWorker, user, verb string) {
	e.t.Helper()
	refusal := fmt.Sprintf(`cannot %s resource "services"`, verb)
	prefix := verb + " services: "
	waitFor(e.t, "readiness to name the refused "+verb, func() (bool, string) {
		err := readiness(w)
		return err != nil && strings.Contains(err.Error(), "informer: "+prefix) && strings.Contains(err.Error(), refusal) &&
			strings.Contains(err.Error(), user), fmt.Sprintf("readiness: %v", err)
	})
	waitFor(e.t, "the start event", func() (bool, string) {
		evs := e.watchEvents()
		return len(evs) == 1 && strings.HasPrefix(evs[0], prefix) && strings.Contains(evs[0], refusal), fmt.Sprintf("watch events %q", evs)
	})
	if n := strings.Count(e.logs.String(), "kind=watch"); n != 1 {
		e.t.Errorf("%d log lines of kind watch while %s fails, want one (the start)", n, verb)
	}
}

// expectWatchRecovery waits until readiness holds again, and checks that
// the failure ended with one more event and log line.
func (e *env) expectWatchRecovery(w *testWorker, verb string) {
	e.t.Helper()
	testenv.Wait(e.t, recoverTimeout, "readiness after "+verb+" is granted back", func() (bool, string) {
		err := readiness(w)
		return err == nil, fmt.Sprintf("readiness: %v", err)
	})
	waitFor(e.t, "the end event", func() (bool, string) {
		evs := e.watchEvents()
		return len(evs) == 2 && strings.HasPrefix(evs[1], "list and watch services work again after "), fmt.Sprintf("watch events %q", evs)
	})
	if n := strings.Count(e.logs.String(), "kind=watch"); n != 2 {
		e.t.Errorf("%d log lines of kind watch, want two (start and end)", n)
	}
	e.t.Logf("measured: %s (counting from the first refused call)", e.watchEvents()[1])
	if n := w.WatchHealth().Failures()[verb]; n < 1 {
		e.t.Errorf("failed %s calls counted: %d", verb, n)
	}
}

// expectPermanent waits for a permanent error event of kind that names the
// refused verb, and checks that readiness holds meanwhile: a refused write
// is the write's failure, not the informer's.
func (e *env) expectPermanent(w *testWorker, kind events.ErrorKind, verb string) {
	e.t.Helper()
	refusal := fmt.Sprintf(`cannot %s resource "services"`, verb)
	waitFor(e.t, "a permanent "+string(kind)+" event naming "+verb, func() (bool, string) {
		for _, ev := range e.errs.Of(kind) {
			if ev.Permanent && strings.Contains(ev.Message, refusal) {
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	if err := readiness(w); err != nil {
		e.t.Errorf("readiness while %s is refused: %v, want ready", verb, err)
	}
	if evs := e.watchEvents(); len(evs) != 0 {
		e.t.Errorf("watch events while only %s is refused: %q", verb, evs)
	}
}

// startAs grants user verbs on Services and starts a simulator of fleet
// (the v2-mixed fixture when nil), a static discovery of it as mat-a and a
// worker as user, configured by tweak (may be nil).
func (e *env) startAs(user string, verbs []string, fleet *matsim.Fleet, tweak func(*worker.Config)) (*matsim.Server, *testWorker) {
	e.t.Helper()
	e.grant(user, verbs...)
	if fleet == nil {
		fleet = fixtureFleet(e.t, fixtureV2Mixed)
	}
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	return sim, e.startWorker(workerOpts{Rest: as(user), Tweak: tweak})
}

// expectUnchanged checks that the Services are those of before (by UID):
// nothing was deleted or re-created while why.
func (e *env) expectUnchanged(before map[string]string, why string) {
	e.t.Helper()
	if after := uids(e.services()); !mapsEqual(after, before) {
		e.t.Errorf("Services changed while %s:\nbefore %v\nafter  %v", why, before, after)
	}
}

// TestMissingServiceVerbs runs a worker under an identity that lacks one
// verb on Services, against the real API server, then grants it back:
//
//   - watch (from the start): the informer syncs by listing, but readiness
//     names "watch services: … cannot watch …" with one watch event and one
//     log line, not one per retry; nothing is deleted; once granted,
//     readiness returns with one more event, and a hand-deleted Service
//     comes back;
//   - list (revoked while running, then an instance goes): its clean-up's
//     list is refused, readiness names "list services: …", the clean-up is
//     retried and deletes nothing; once granted, its Services are deleted
//     and readiness returns;
//   - create, update, delete: readiness holds, a permanent create, update
//     or delete event names the verb, nothing else changes; once granted,
//     the Services converge.
func TestMissingServiceVerbs(t *testing.T) {
	t.Run("watch", func(t *testing.T) {
		e := newEnv(t)
		const user = "matbus-no-watch"
		_, w := e.startAs(user, allBut("watch"), nil, nil)
		before := uids(e.waitServices(v2MixedNames()...))
		e.expectWatchFailure(w, user, "watch")
		waitSyncs(t, w, 3)
		e.expectUnchanged(before, "watch was refused")

		e.setVerbs(user, serviceVerbs...)
		e.expectWatchRecovery(w, "watch")
		const name = "mat-bmc-host-922f3d9b-20b-4da64654"
		if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the hand-deleted Service back", func() (bool, string) {
			s := e.service(name)
			return s != nil && string(s.UID) != before[name], "not re-created"
		})
	})

	t.Run("list", func(t *testing.T) {
		e := newEnv(t)
		const user = "matbus-no-list"
		e.grant(user, serviceVerbs...)
		simA := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
		simB := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.77.0/24", 3)})
		src := e.startDiscovery(e.entry("mat-a", simA.URL()), e.entry("mat-b", simB.URL()))
		w := e.startWorker(workerOpts{Rest: as(user)})
		waitFor(t, "both instances' Services", func() (bool, string) {
			n := map[string]int{}
			for _, s := range e.services() {
				n[s.Labels[plan.LabelInstance]]++
			}
			return n[plan.LabelValue(e.key("mat-a"))] == len(v2MixedNames()) && n[plan.LabelValue(e.key("mat-b"))] > 0, fmt.Sprintf("per instance %v", n)
		})
		before := uids(e.services())

		e.setVerbs(user, allBut("list")...)
		if err := src.Set([]discovery.StaticEntry{e.entry("mat-a", simA.URL())}); err != nil {
			t.Fatal(err)
		}
		e.expectWatchFailure(w, user, "list")
		waitFor(t, "the clean-up retried", func() (bool, string) {
			n := w.WatchHealth().Failures()["list"]
			return n >= 3, fmt.Sprintf("%d refused lists", n)
		})
		e.expectUnchanged(before, "the clean-up could not list")
		for _, ev := range e.errs.Of(events.ErrorDelete) {
			if ev.Permanent {
				t.Errorf("the clean-up gave up for good: %+v", ev)
			}
		}

		e.setVerbs(user, serviceVerbs...)
		testenv.Wait(t, recoverTimeout, "mat-b's Services deleted, mat-a's kept", func() (bool, string) {
			after := e.services()
			var left []string
			for n, s := range after {
				if s.Labels[plan.LabelInstance] != plan.LabelValue(e.key("mat-a")) {
					left = append(left, n)
				} else if string(s.UID) != before[n] {
					t.Fatalf("mat-a's Service %s was touched", n)
				}
			}
			return len(left) == 0 && len(after) == len(v2MixedNames()), fmt.Sprintf("left %v of %d", left, len(after))
		})
		e.expectWatchRecovery(w, "list")
	})

	t.Run("create", func(t *testing.T) {
		e := newEnv(t)
		const user = "matbus-no-create"
		_, w := e.startAs(user, allBut("create"), nil, nil)
		e.expectPermanent(w, events.ErrorCreate, "create")
		if got := e.services(); len(got) != 0 {
			t.Errorf("Services exist although create is refused: %v", uids(got))
		}
		e.setVerbs(user, serviceVerbs...)
		testenv.Wait(t, recoverTimeout, "the Services created once create is granted", func() (bool, string) {
			got := e.services()
			return len(got) == len(v2MixedNames()), fmt.Sprintf("%d Services", len(got))
		})
		if err := readiness(w); err != nil {
			t.Errorf("readiness: %v", err)
		}
	})

	t.Run("update", func(t *testing.T) {
		e := newEnv(t)
		const user = "matbus-no-update"
		fleet := fixtureFleet(t, fixtureV2Mixed)
		sim, w := e.startAs(user, serviceVerbs, fleet, func(c *worker.Config) { c.Plan.StateAnnotations = true })
		before := uids(e.waitServices(v2MixedNames()...))

		e.setVerbs(user, allBut("update", "patch")...)
		next := fleet.Clone()
		next.Machines[0].PowerState = "Off"
		if err := sim.SetFleet(next); err != nil {
			t.Fatal(err)
		}
		e.expectPermanent(w, events.ErrorUpdate, "update")
		e.expectUnchanged(before, "update was refused")

		e.setVerbs(user, serviceVerbs...)
		const name = "mat-bmc-host-922f3d9b-20b-4da64654"
		testenv.Wait(t, recoverTimeout, "the update once update is granted", func() (bool, string) {
			s := e.service(name)
			return s != nil && s.Annotations[plan.AnnotationPowerState] == "Off", fmt.Sprintf("annotations %v", s.Annotations)
		})
		e.expectUnchanged(before, "the update was made")
	})

	t.Run("delete", func(t *testing.T) {
		e := newEnv(t)
		const user = "matbus-no-delete-verb"
		sim, w := e.startAs(user, allBut("delete"), nil, nil)
		before := uids(e.waitServices(v2MixedNames()...))

		const gone = "mat-bmc-host-d5bb3746-fdf-4f4ad08b"
		if err := sim.RemoveDevice("d5bb3746-fdf8-424d-ba9d-3d7d407756a9"); err != nil {
			t.Fatal(err)
		}
		e.expectPermanent(w, events.ErrorDelete, "delete")
		e.expectUnchanged(before, "delete was refused")

		e.setVerbs(user, serviceVerbs...)
		// A later status plans the delete again under a new job id.
		later := sim.Fleet().Clone()
		later.Machines[0].APIState = "Assigned/Ready"
		if err := sim.SetFleet(later); err != nil {
			t.Fatal(err)
		}
		testenv.Wait(t, recoverTimeout, "the stale Service deleted once delete is granted", func() (bool, string) {
			return e.service(gone) == nil, "still there"
		})
		for n, uid := range before {
			if s := e.service(n); n != gone && (s == nil || string(s.UID) != uid) {
				t.Errorf("%s was deleted or re-created", n)
			}
		}
	})
}
