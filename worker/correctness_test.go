package worker_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// drainDeletes waits until the delete stream holds no job.
func (e *env) drainDeletes() {
	e.t.Helper()
	waitFor(e.t, "the delete queue drained", func() (bool, string) {
		str, err := e.js.Stream(e.ctx, e.bus.StreamName(events.StreamDelete))
		if err != nil {
			return false, err.Error()
		}
		info, err := str.Info(e.ctx)
		if err != nil {
			return false, err.Error()
		}
		return info.State.Msgs == 0, fmt.Sprintf("%d delete jobs left", info.State.Msgs)
	})
}

// A stale delete job that carries the Service's current UID while the
// newest status still wants the Service leaves it alone.
func TestStaleDeleteOfWantedServiceKept(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	before := e.waitServices(v2MixedNames()...)
	host := before["mat-bmc-host-922f3d9b-20b-4da64654"]
	job := events.DeleteJob{Key: e.key("mat-a"), Namespace: e.ns, Name: host.Name, UID: string(host.UID),
		MatID: host.Annotations[plan.AnnotationMatID], Reason: "stale", PlannedAt: time.Now().Add(-time.Minute)}
	if err := e.bus.Publish(e.ctx, e.bus.Subjects().Delete(job.Key), events.TypeDeleteJob, "test-stale-current-uid", job); err != nil {
		t.Fatal(err)
	}
	e.drainDeletes()
	if s := e.service(host.Name); s == nil || s.UID != host.UID {
		t.Fatalf("%s deleted or replaced by a stale job although the status wants it", host.Name)
	}
	if st := w.Stats(); st.DeletesKept != 1 || st.Deleted != 0 {
		t.Errorf("stats = %+v, want one delete kept and none done", st)
	}
}

// A delete job that waited (no worker ran) while its device came back
// leaves the Service alone once it runs.
func TestParkedDeleteAfterDeviceReturns(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{Name: "w1"})
	before := e.waitServices(v2MixedNames()...)
	w.Stop()

	const id = "1a530254-57f0-4a8d-adb9-7d5520153f50"
	svc := before["mat-bmc-host-1a530254-57f-964ececc"]
	full := sim.Fleet()
	if err := sim.RemoveDevice(id); err != nil {
		t.Fatal(err)
	}
	// The sync that found the device gone made this job; it waits.
	job := events.DeleteJob{Key: e.key("mat-a"), Namespace: e.ns, Name: svc.Name, UID: string(svc.UID),
		MatID: id, Reason: "stale", PlannedAt: time.Now()}
	if err := e.bus.Publish(e.ctx, e.bus.Subjects().Delete(job.Key), events.TypeDeleteJob, "test-parked", job); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := sim.SetFleet(full); err != nil { // the device is back
		t.Fatal(err)
	}
	w2 := e.startWorker(workerOpts{Name: "w2"})
	e.drainDeletes()
	waitSyncs(t, w2, 2)
	if s := e.service(svc.Name); s == nil || s.UID != svc.UID {
		t.Fatalf("%s deleted or replaced after its device came back", svc.Name)
	}
	if st := w2.Stats(); st.DeletesKept != 1 || st.Deleted != 0 {
		t.Errorf("stats = %+v, want the parked delete kept", st)
	}
}

// When one status frees a BMC IP (its device is removed) and gives it to
// another device, the first sync converges: the freeing delete runs before
// the create, and no error is reported.
func TestBMCIPMovesToAnotherDevice(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	e.waitServices(v2MixedNames()...)
	syncs := w.Stats().Syncs

	// The switch 1a53… goes away; the power shelf 6244… takes its IP, and a
	// new device takes the shelf's old IP (a chain of moves).
	f := sim.Fleet()
	var kept []matclient.Device
	for _, d := range f.Machines {
		switch d.MatID {
		case "1a530254-57f0-4a8d-adb9-7d5520153f50":
			continue
		case "624423f1-04b4-404c-8d55-d1cb82fa8ae4":
			d.BMC.IP = "10.96.64.30"
			nd := d
			nd.MatID, nd.BMC.IP, nd.MachineID = "new-shelf-1", "10.96.64.40", ""
			kept = append(kept, nd)
		}
		kept = append(kept, d)
	}
	f.Machines = kept
	if err := sim.SetFleet(f); err != nil {
		t.Fatal(err)
	}
	const shelf = "mat-bmc-host-624423f1-04b-216d49b5"
	waitFor(t, "moved IPs", func() (bool, string) {
		s, n := e.service(shelf), e.service("mat-bmc-host-new-shelf-1")
		gone := e.service("mat-bmc-host-1a530254-57f-964ececc") == nil
		ok := s != nil && s.Spec.ClusterIP == "10.96.64.30" && n != nil && n.Spec.ClusterIP == "10.96.64.40" && gone
		return ok, fmt.Sprintf("shelf %v, new %v, switch gone %v", s != nil, n != nil, gone)
	})
	// The stale delete the sync published can finish before the sync
	// itself has returned and been counted.
	waitFor(t, "the sync that moved the IPs to be counted", func() (bool, string) {
		st := w.Stats()
		return st.Syncs > syncs, fmt.Sprintf("%+v", st)
	})
	for _, k := range []string{"create", "update", "delete"} {
		if evs := e.errs.Of(errKind(k)); len(evs) != 0 {
			t.Errorf("%s error events while an IP moved: %+v", k, evs)
		}
	}
	if st := w.Stats(); st.Failed != 0 {
		t.Errorf("stats = %+v, want no failed job", st)
	}
}

// Two different mat_ids whose kept names collide (a 32-bit FNV collision of
// the old controller's rule), reported by two instances: one gets the
// Service, the other none and an error event naming both ids; services_created_total
// counts only Services that were created.
func TestNameCollisionAcrossInstances(t *testing.T) {
	e := newEnv(t)
	fa, fb := generatedFleet(t, "10.96.64.0/24", 1), generatedFleet(t, "10.96.65.0/24", 2)
	fa.Machines[0].MatID = "host-rack-01-f3zlaaa"
	fb.Machines[0].MatID = "host-rack-01-0papaaa"
	name := plan.ServiceName(plan.MachineTypeOf(fa.Machines[0].Kind), fa.Machines[0].MatID)
	if other := plan.ServiceName(plan.MachineTypeOf(fb.Machines[0].Kind), fb.Machines[0].MatID); other != name {
		t.Fatalf("test ids do not collide: %s vs %s", name, other)
	}
	sa, sb := e.startSim(matsim.Options{Fleet: fa}), e.startSim(matsim.Options{Fleet: fb})
	e.startDiscovery(e.entry("mat-a", sa.URL()), e.entry("mat-b", sb.URL()))
	w := e.startWorker(workerOpts{})
	want := append(wantServiceNames(fa), wantServiceNames(fb)...)
	var distinct []string
	seen := map[string]bool{}
	for _, n := range want {
		if !seen[n] {
			seen[n] = true
			distinct = append(distinct, n)
		}
	}
	e.waitServices(distinct...)
	waitFor(t, "a collision event naming both ids", func() (bool, string) {
		for _, ev := range e.errs.Of(events.ErrorPlan) {
			if strings.Contains(ev.Message, "host-rack-01-f3zlaaa") && strings.Contains(ev.Message, "host-rack-01-0papaaa") {
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	if s := e.service(name); s == nil || (s.Annotations[plan.AnnotationMatID] != "host-rack-01-f3zlaaa" && s.Annotations[plan.AnnotationMatID] != "host-rack-01-0papaaa") {
		t.Errorf("%s missing or not of either device", name)
	}
	// A create is counted after the API server has answered it, so the
	// count may trail the Services for a moment; it must never exceed them.
	waitFor(t, "services_created equal to the Services that exist", func() (bool, string) {
		got, n := w.Stats().Created, int64(len(e.services()))
		return got == n, fmt.Sprintf("services_created = %d, but %d Services exist", got, n)
	})
}

// A device that advertises SSH on its Redfish port still gets a Service
// (the duplicate port dropped) and one warning event, however many syncs.
func TestDuplicateEndpointMerged(t *testing.T) {
	e := newEnv(t)
	f := generatedFleet(t, "10.96.66.0/24", 3)
	d := &f.Machines[0]
	ssh := d.BMC.Redfish
	d.BMC.SSH = &ssh
	sim := e.startSim(matsim.Options{Fleet: f})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	svcs := e.waitServices(wantServiceNames(f)...)
	name := plan.ServiceName(plan.MachineTypeOf(d.Kind), d.MatID)
	ports := map[string]bool{}
	for _, p := range svcs[name].Spec.Ports {
		k := fmt.Sprintf("%s/%d", p.Protocol, p.Port)
		if ports[k] {
			t.Errorf("duplicate port %s", k)
		}
		ports[k] = true
	}
	waitSyncs(t, w, 4)
	var warnings int
	for _, ev := range e.errs.Of(events.ErrorPlan) {
		if ev.MatID == d.MatID {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d plan events for %s, want one warning: %s", warnings, d.MatID, e.errs.String())
	}
	if evs := e.errs.Of(errKind("create")); len(evs) != 0 {
		t.Errorf("create errors: %+v", evs)
	}
}

// bodyServer serves a MAT status body that the test swaps at will.
type bodyServer struct {
	body atomic.Value // []byte
	srv  *httptest.Server
}

func newBodyServer(t *testing.T, body []byte) *bodyServer {
	b := &bodyServer{}
	b.body.Store(body)
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b.body.Load().([]byte))
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func device(id, ip string) string {
	return fmt.Sprintf(`{"mat_id":%q,"device_kind":"machine","bmc":{"ip":%q,"redfish":{"reachable_port":443,"listen_port":1266}}}`, id, ip)
}

func statusBody(gen int, devs ...string) []byte {
	return []byte(fmt.Sprintf(`{"inventory_id":"inv","epoch_id":"e1","generation":%d,"machines":[%s]}`, gen, strings.Join(devs, ",")))
}

// A device with an invalid field is reported and skipped while the valid
// devices of the same status are applied; the instance's deletes are held
// until every device is valid again.
func TestInvalidDeviceHoldsDeletes(t *testing.T) {
	e := newEnv(t)
	srv := newBodyServer(t, statusBody(1, device("dev-a", "10.96.67.1"), device("dev-b", "10.96.67.2")))
	e.startDiscovery(e.entry("mat-a", srv.srv.URL))
	w := e.startWorker(workerOpts{})
	before := e.waitServices("mat-bmc-host-dev-a", "mat-bmc-host-dev-b")

	// dev-b is gone, dev-c is new, and one device has an empty mat_id.
	srv.body.Store(statusBody(2, device("dev-a", "10.96.67.1"), device("dev-c", "10.96.67.3"), device("", "10.96.67.4")))
	waitFor(t, "dev-c's Service", func() (bool, string) { return e.service("mat-bmc-host-dev-c") != nil, "missing" })
	waitFor(t, "the invalid device reported", func() (bool, string) {
		for _, ev := range e.errs.Of(events.ErrorPlan) {
			if strings.Contains(ev.Message, "machines[2]") {
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	waitSyncs(t, w, 3)
	e.drainDeletes()
	if s := e.service("mat-bmc-host-dev-b"); s == nil || s.UID != before["mat-bmc-host-dev-b"].UID {
		t.Fatal("dev-b's Service was deleted while the status had an invalid device")
	}
	// Valid again: now dev-b's Service goes.
	srv.body.Store(statusBody(3, device("dev-a", "10.96.67.1"), device("dev-c", "10.96.67.3")))
	waitFor(t, "dev-b's Service deleted", func() (bool, string) { return e.service("mat-bmc-host-dev-b") == nil, "still there" })
	if s := e.service("mat-bmc-host-dev-a"); s == nil || s.UID != before["mat-bmc-host-dev-a"].UID {
		t.Error("dev-a's Service was touched")
	}
}

// A BMC IP that moves from a device of one instance to a device of another
// converges, whichever instance syncs first, and a refusal while the old
// holder's Service still has it is never reported as permanent: the
// holder's status no longer wants it, so it resolves itself.
func TestBMCIPMovesBetweenInstances(t *testing.T) {
	e := newEnv(t)
	fa, fb := generatedFleet(t, "10.96.68.0/24", 11), generatedFleet(t, "10.96.69.0/24", 12)
	sa, sb := e.startSim(matsim.Options{Fleet: fa}), e.startSim(matsim.Options{Fleet: fb})
	e.startDiscovery(e.entry("mat-a", sa.URL()), e.entry("mat-b", sb.URL()))
	w := e.startWorker(workerOpts{})
	e.waitServices(append(wantServiceNames(fa), wantServiceNames(fb)...)...)

	// The last top-level device of A goes away; B's last one takes its IP.
	na, nb := sa.Fleet(), sb.Fleet()
	gone := na.Machines[len(na.Machines)-1]
	na.Machines = na.Machines[:len(na.Machines)-1]
	taker := &nb.Machines[len(nb.Machines)-1]
	taker.BMC.IP = gone.BMC.IP
	// A's status frees the IP, then B's takes it at once: B's recreate may
	// meet the IP still held by A's Service, whose delete is on its way.
	if err := sa.SetFleet(na); err != nil {
		t.Fatal(err)
	}
	if err := sb.SetFleet(nb); err != nil {
		t.Fatal(err)
	}
	name := plan.ServiceName(plan.MachineTypeOf(taker.Kind), taker.MatID)
	waitFor(t, name+" on the moved IP", func() (bool, string) {
		s := e.service(name)
		if s == nil {
			return false, "missing"
		}
		return s.Spec.ClusterIP == gone.BMC.IP, "clusterIP " + s.Spec.ClusterIP
	})
	for _, k := range []events.ErrorKind{events.ErrorCreate, events.ErrorUpdate} {
		for _, ev := range e.errs.Of(k) {
			if ev.Permanent {
				t.Errorf("a conflict that resolved itself was reported as permanent: %+v", ev)
			}
		}
	}
	if st := w.Stats(); st.Failed != 0 {
		t.Logf("stats %+v (a transient refusal may have failed one sync)", st)
	}
}
