package kubee2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/plan"
)

const (
	fillers = 10_000
	// The chart's leader election (values.yaml discovery.leaderElection).
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	// takeoverBound: a new leader within a lease duration and a renew
	// deadline, plus a margin for a loaded 2-core node.
	takeoverBound = leaseDuration + renewDeadline + 10*time.Second
	// fanOutBound: every Service of a gone 2,000-Service instance deleted.
	fanOutBound = 5 * time.Minute
)

// TestKubeE2E runs the chart on a real cluster, step by step (each step's
// time and measurements are logged and summed up at the end):
//
//  1. 10,000 Services already fill the namespace;
//  2. NATS (JetStream) and two MAT instances (matsim, HTTPS with a
//     certificate of a test CA) run as pods, shaped as the MAT chart's;
//  3. helm install: every pod ready, every BMC its Service exactly as
//     matbus's own planner wants it, each Service's EndpointSlice lists
//     its MAT pod;
//     3b. a MAT instance added, then removed: the MAT protocol gateway
//     beside every discovery replica (a stand-in, gateway_test.go) exits 3
//     once per change and comes back; after every other step its restart
//     counts are unchanged (one more in step 4, whose instance goes);
//  4. a rollout restart of the workers during the 2,000-Service delete
//     fan-out of a gone instance: nothing lost, nothing wrongly deleted;
//  5. the discovery leader's pod deleted: another replica leads within
//     the lease bounds and publishes sync jobs of its term;
//  6. NATS scaled to 0 and back (its store lost): workers report not ready
//     naming NATS, recover, and the pipeline converges;
//  7. helm upgrade with changed values rolls the pods, helm test passes,
//     helm uninstall leaves no object of the release; BMC Services stay;
//  8. deleting the MAT Deployment garbage-collects its BMC Services
//     (the owner references the workers set).
func TestKubeE2E(t *testing.T) {
	if os.Getenv("MATBUS_KUBE_E2E") != "1" {
		t.Skip("needs a real cluster: run `make kube-e2e` (hack/kube-e2e.sh)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	e := newE2E(t, ctx)
	e.ca = testenv.NewCA(t, "matbus-kube-e2e MAT CA")
	// 2*hosts+3 Services each: 2,001 (the fan-out) and 301 (must survive it).
	big := &mat{name: "mat-big", hosts: 999, seed: 1}
	small := &mat{name: "mat-small", hosts: 149, seed: 2}
	e.mats = []*mat{big, small}

	e.freshNamespace()
	if !e.cfg.keep {
		t.Cleanup(func() { deleteNamespace(t, e.kube) })
	}
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, e.kube)
		}
	})
	defer e.summary()

	e.step("1. 10,000 Services before the install", func() string {
		start := time.Now()
		if err := e.createFillers(fillers, 50); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		l, err := e.kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{LabelSelector: labelFiller + "=true"})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != fillers {
			t.Fatalf("%d filler Services listed, want %d", len(l.Items), fillers)
		}
		return fmt.Sprintf("%d headless Services created in %.1fs (%.0f/s)", fillers, took.Seconds(), fillers/took.Seconds())
	})

	e.step("2. NATS and two MAT instances as pods", func() string {
		e.createNATS()
		for _, m := range e.mats {
			e.createMATService(m)
		}
		e.chooseSubnets()
		e.createMATCerts()
		e.createGatewayTLS()
		for _, m := range e.mats {
			e.createMATDeployment(m)
		}
		e.waitPodsReady("app.kubernetes.io/name=nats", 1, 3*time.Minute)
		for _, m := range e.mats {
			m.podIP = e.waitPodsReady(m.podSelector(), 1, 3*time.Minute)[0].Status.PodIP
			// The certificate must verify for the name the workers use.
			e.waitFor(time.Minute, 2*time.Second, "status of "+m.name+" over HTTPS, verified against the MAT CA", func() (bool, string) {
				if err := e.fetchStatus(m); err != nil {
					return false, err.Error()
				}
				return true, ""
			})
			m.plan()
			if len(m.want.Held) > 0 {
				t.Fatalf("%s: %d devices get no Service, e.g. %+v", m.name, len(m.want.Held), m.want.Held[0])
			}
		}
		if big.bmcs < 1900 || big.bmcs > 2100 || small.bmcs < 100 || small.bmcs > 500 {
			t.Fatalf("fleets sized wrong: %s %d BMCs (want about 2,000), %s %d (want a few hundred)", big.name, big.bmcs, small.name, small.bmcs)
		}
		var note []string
		for _, m := range e.mats {
			note = append(note, fmt.Sprintf("%s: %d BMC + %d NVOS Services on %s, pod %s", m.name, m.bmcs, len(m.want.Services)-m.bmcs, m.subnet, m.podIP))
		}
		return strings.Join(note, "; ")
	})

	e.step("3. helm install: pods ready, every BMC its Service and endpoints", func() string {
		e.rec = e.recordServices()
		start := time.Now()
		e.helm(7*time.Minute, append([]string{"install", release, chartDir, "--namespace", namespace, "--wait", "--timeout", "5m"}, e.chartArgs()...)...)
		installed := time.Since(start)
		e.checkReleasePods(2, 3)

		converged := e.waitFor(5*time.Minute, 3*time.Second, "every BMC's Service as plan.Build wants it", func() (bool, string) {
			for _, m := range e.mats {
				if ok, why := e.converged(m); !ok {
					return false, why
				}
			}
			return true, ""
		})
		total := 0
		for _, m := range e.mats {
			total += len(m.want.Services)
		}
		all, err := e.kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{LabelSelector: plan.LabelManagedBy + "=" + plan.DefaultManagedBy})
		if err != nil {
			t.Fatal(err)
		}
		if len(all.Items) != total {
			t.Fatalf("%d Services with managed-by %s in %s, want the %d of the two instances", len(all.Items), plan.DefaultManagedBy, namespace, total)
		}

		podIPs := map[string]bool{big.podIP: true, small.podIP: true}
		endpoints := e.waitFor(6*time.Minute, 3*time.Second, "every BMC Service's EndpointSlice lists its MAT pod", func() (bool, string) {
			eps, err := e.endpointSlices()
			if err != nil {
				return false, err.Error()
			}
			var why []string
			for _, m := range e.mats {
				other := maps.Clone(podIPs)
				delete(other, m.podIP)
				ok, wrong := e.endpointsRight(m, eps, other)
				if ok != len(m.want.Services) {
					why = append(why, fmt.Sprintf("%s: %d of %d right; %s", m.name, ok, len(m.want.Services), strings.Join(wrong, "; ")))
				}
			}
			return len(why) == 0, strings.Join(why, " | ")
		})
		e.staysReady(15 * time.Second)
		e.gw = e.checkGatewayRestarts("3. helm install", nil)
		return fmt.Sprintf("install --wait %.1fs; %d Services as planned %.1fs later; EndpointSlices right %.1fs after that; gateway restarts %s",
			installed.Seconds(), total, converged.Seconds(), endpoints.Seconds(), gatewayLine(e.gw))
	})

	e.step("3b. a MAT instance added, then removed: every gateway restarts once per change", func() string {
		return e.gatewayAddRemove()
	})

	e.step("4. rollout restart of the workers during a 2,000-Service delete fan-out", func() string {
		note := e.restartDuringFanOut(big, small)
		// The instance's Service is gone: one change of the gateway's sources.
		e.gw = e.waitGatewayRestart("4. rollout restart during the fan-out ("+big.service()+" deleted)", big.service(), false, e.bigGone, e.gw)
		return note + "; gateway restarts " + gatewayLine(e.gw)
	})

	e.step("5. the discovery leader's pod deleted", func() string {
		note := e.leaderFailover()
		e.gw = e.checkGatewayRestarts("5. the leader's pod deleted", e.gw)
		return note + "; gateway restarts " + gatewayLine(e.gw)
	})

	e.step("6. NATS scaled to 0 and back to 1", func() string {
		note := e.natsOutage(small)
		e.gw = e.checkGatewayRestarts("6. NATS scaled to 0 and back", e.gw)
		return note + "; gateway restarts " + gatewayLine(e.gw)
	})

	e.step("7. helm upgrade, helm test, helm uninstall", func() string {
		return e.upgradeTestUninstall(small)
	})

	e.step("8. the MAT Deployment deleted: its BMC Services are garbage-collected", func() string {
		start := time.Now()
		if err := e.kube.CoreV1().Services(namespace).Delete(ctx, small.service(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := e.kube.AppsV1().Deployments(namespace).Delete(ctx, small.name,
			metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
			t.Fatal(err)
		}
		took := e.waitFor(3*time.Minute, 2*time.Second, "the garbage collector to delete "+small.name+"'s BMC Services", func() (bool, string) {
			left, err := e.existing(small)
			if err != nil {
				return false, err.Error()
			}
			return len(left) == 0, fmt.Sprintf("%d of %d left", len(left), len(small.services))
		})
		return fmt.Sprintf("%d Services collected %.1fs after the Deployment's delete (%.1fs in all)", len(small.services), took.Seconds(), time.Since(start).Seconds())
	})
}

// chartArgs are the values of install and upgrade: testdata/values.yaml
// and what the environment decides.
func (e *e2e) chartArgs() []string {
	repo, tag, digest := splitImage(e.cfg.image)
	args := []string{"--values", filepath.Join("deploytest", "kubee2e", "testdata", "values.yaml"),
		"--set", "image.repository=" + repo,
		"--set", "gateway.image=" + e.cfg.gateway,
		"--set", "nats.url=nats://nats." + namespace + ".svc.cluster.local:4222",
		"--set", "worker.serviceCIDR={" + e.cfg.serviceCIDR.String() + "}"}
	if tag != "" {
		args = append(args, "--set", "image.tag="+tag)
	}
	if digest != "" {
		args = append(args, "--set", "image.digest="+digest)
	}
	return args
}

// checkReleasePods asserts the release's pods: all ready, the expected
// number of each, and no Service links in any of them (thousands of
// Services share the namespace).
func (e *e2e) checkReleasePods(discovery, workers int) {
	e.t.Helper()
	e.waitPodsReady(discoverySel, discovery, 2*time.Minute)
	e.waitPodsReady(workerSel, workers, 2*time.Minute)
	ps, err := e.pods(instanceSel)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range ps {
		if p.Spec.EnableServiceLinks == nil || *p.Spec.EnableServiceLinks {
			e.t.Errorf("pod %s has Service links (enableServiceLinks %v): with thousands of Services its environment does not fit", p.Name, p.Spec.EnableServiceLinks)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount > 0 {
				e.t.Logf("note: %s/%s restarted %d times: %s", p.Name, c.Name, c.RestartCount, podLine(&p))
			}
		}
	}
}

// restartDuringFanOut is step 4. The instance goes away as the design
// defines it: its discovered Service is deleted (the Deployment stays
// until the fan-out is done, or Kubernetes' garbage collector would
// delete the BMC Services through their owner references and race
// matbus). The restart is triggered first and the Service deleted once
// the rollout stops a first old worker, so that workers stop and start
// while the delete jobs are worked off.
func (e *e2e) restartDuringFanOut(big, small *mat) string {
	t, ctx := e.t, e.ctx
	nc := e.connectNATS()
	defer nc.Close()
	jobs := e.recordJobs(nc, events.Subjects{}.DeleteJobsIn(namespace))
	defer jobs.stop()

	bigUIDs := map[types.UID]string{}
	for n, u := range big.services {
		bigUIDs[u] = n
	}
	smallBefore := maps.Clone(small.services)
	workerName := fullname + "-worker"
	d, err := e.kube.AppsV1().Deployments(namespace).Get(ctx, workerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldRev := revision(d)
	oldPods, err := e.pods(workerSel)
	if err != nil {
		t.Fatal(err)
	}
	stopped := map[string]time.Time{} // old worker → when its deletion was first seen
	old := map[string]bool{}
	for _, p := range oldPods {
		old[p.Name] = true
	}
	seeStops := func() {
		ps, err := e.pods(workerSel)
		if err != nil {
			return
		}
		for _, p := range ps {
			if _, seen := stopped[p.Name]; old[p.Name] && !seen && p.DeletionTimestamp != nil {
				stopped[p.Name] = time.Now()
			}
		}
		for n := range old {
			if _, seen := stopped[n]; !seen && !slices.ContainsFunc(ps, func(p corev1.Pod) bool { return p.Name == n }) {
				stopped[n] = time.Now() // gone between two looks
			}
		}
	}

	// kubectl rollout restart: a new pod template annotation.
	restart := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, restart.Format(time.RFC3339))
	if _, err := e.kube.AppsV1().Deployments(namespace).Patch(ctx, workerName, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(3*time.Minute, 200*time.Millisecond, "the rollout to stop a first old worker", func() (bool, string) {
		seeStops()
		return len(stopped) > 0, "no old worker terminating"
	})
	matSvc, err := e.kube.CoreV1().Services(namespace).Get(ctx, big.service(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	e.bigGone = gone
	if err := e.kube.CoreV1().Services(namespace).Delete(ctx, big.service(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout restart at %s; first old worker stopping after %.1fs; MAT Service %s deleted: %d Services to go",
		restart.Format(time.TimeOnly), gone.Sub(restart).Seconds(), big.service(), len(bigUIDs))

	var firstDelete, lastDelete time.Time
	fanOut := e.waitFor(fanOutBound, time.Second, fmt.Sprintf("every one of the %d Services of the gone instance deleted", len(bigUIDs)), func() (bool, string) {
		seeStops()
		_, del := e.rec.since(gone)
		n := 0
		for _, ev := range del {
			if _, ok := bigUIDs[ev.uid]; ok {
				n++
				if firstDelete.IsZero() {
					firstDelete = ev.at
				}
				lastDelete = ev.at
			}
		}
		if n < len(bigUIDs) {
			return false, fmt.Sprintf("%d of %d deleted", n, len(bigUIDs))
		}
		left, err := e.existing(big)
		if err != nil {
			return false, err.Error()
		}
		return len(left) == 0, fmt.Sprintf("%d Services of the instance listed", len(left))
	})
	rollout := e.waitFor(5*time.Minute, time.Second, "the rollout of "+workerName, func() (bool, string) {
		seeStops()
		return e.rolledOut(workerName)
	})
	rolled := time.Now()
	if d, err = e.kube.AppsV1().Deployments(namespace).Get(ctx, workerName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if revision(d) != oldRev+1 {
		t.Errorf("%s at revision %d after one restart from %d", workerName, revision(d), oldRev)
	}
	if !rolled.After(firstDelete) {
		t.Errorf("the rollout was done (%s) before the fan-out deleted its first Service (%s): nothing ran during it",
			rolled.Format(time.StampMilli), firstDelete.Format(time.StampMilli))
	}
	during := 0
	for _, at := range stopped {
		if !at.Before(gone) && !at.After(lastDelete) {
			during++
		}
	}

	// Nothing lost, nothing wrongly deleted, nothing re-created.
	added, deleted := e.rec.since(gone)
	perUID := map[types.UID]int{}
	var wrong []svcEvent
	for _, ev := range deleted {
		perUID[ev.uid]++
		if _, ok := bigUIDs[ev.uid]; !ok && ev.uid != matSvc.UID {
			wrong = append(wrong, ev)
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d Services deleted that are not the gone instance's: %s", len(wrong), names(wrong, 10))
	}
	for uid, n := range perUID {
		if n > 1 {
			t.Errorf("Service %s (uid %s) deleted %d times", bigUIDs[uid], uid, n)
		}
	}
	var recreated []svcEvent
	for _, ev := range added {
		if ev.instance == plan.LabelValue(big.key()) {
			recreated = append(recreated, ev)
		}
	}
	if len(recreated) > 0 {
		t.Errorf("%d Services of the gone instance were created again during its clean-up: %s", len(recreated), names(recreated, 10))
	}
	if ok, why := e.converged(small); !ok {
		t.Errorf("the staying instance is not as planned any more: %s", why)
	}
	have, err := e.existing(small)
	if err != nil {
		t.Fatal(err)
	}
	now := map[string]types.UID{}
	for _, s := range have {
		now[s.Name] = s.UID
	}
	lost := 0
	for n, u := range smallBefore {
		if now[n] != u {
			lost++
			if lost <= 10 {
				t.Errorf("Service %s of the staying instance: uid %s before, %q after", n, u, now[n])
			}
		}
	}
	l, err := e.kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{LabelSelector: labelFiller + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != fillers {
		t.Errorf("%d filler Services left of %d", len(l.Items), fillers)
	}

	// The fan-out as messages: a delete job per Service, for the gone instance only.
	msgs, bad := jobs.messages()
	if len(bad) > 0 {
		t.Errorf("%d delete job messages do not decode, e.g. %s", len(bad), bad[0])
	}
	jobFor := map[types.UID]int{}
	var foreign []string
	for _, m := range msgs {
		j, err := events.Into[events.DeleteJob](m.env, events.TypeDeleteJob)
		if err != nil {
			t.Errorf("delete job %s: %v", m.env.ID, err)
			continue
		}
		if _, ok := bigUIDs[types.UID(j.UID)]; !ok || j.Key != big.key() {
			foreign = append(foreign, fmt.Sprintf("%s/%s (uid %s, instance %s)", j.Namespace, j.Name, j.UID, j.Key))
		}
		jobFor[types.UID(j.UID)]++
	}
	if len(foreign) > 0 {
		t.Errorf("%d delete jobs for Services that are not the gone instance's: %v", len(foreign), foreign[:min(len(foreign), 10)])
	}
	missing := 0
	for uid := range bigUIDs {
		if jobFor[uid] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of the %d deleted Services had no delete job on %s", missing, len(bigUIDs), events.Subjects{}.DeleteJobsIn(namespace))
	}

	// The MAT workload itself goes now (nothing of it is left to collect).
	if err := e.kube.AppsV1().Deployments(namespace).Delete(ctx, big.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d Services deleted %.1fs after the MAT Service (first %.1fs, last %.1fs); %d delete jobs seen; rollout done %.1fs after the restart, %.1fs after the fan-out (%d of %d old workers stopped during the fan-out); %d lost, %d wrong deletes",
		len(bigUIDs), fanOut.Seconds(), firstDelete.Sub(gone).Seconds(), lastDelete.Sub(gone).Seconds(), len(msgs),
		rolled.Sub(restart).Seconds(), rollout.Seconds(), during, len(old), lost, len(wrong))
}

// leaderFailover is step 5: the Lease holder's pod is deleted (as `kubectl
// delete pod`: graceful, so the leader releases the Lease on SIGTERM).
func (e *e2e) leaderFailover() string {
	t, ctx := e.t, e.ctx
	leases := e.kube.CoordinationV1().Leases(namespace)
	l, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's election Lease %s: %v", leaseName, err)
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	transitions := ptr.Deref(l.Spec.LeaseTransitions, 0)
	ds, err := e.pods(discoverySel)
	if err != nil {
		t.Fatal(err)
	}
	var standby string
	found := false
	for _, p := range ds {
		if p.Name == holder {
			found = true
		} else {
			standby = p.Name
		}
	}
	if !found || len(ds) != 2 {
		t.Fatalf("Lease %s held by %q, discovery pods %s: want the holder among two", leaseName, holder, podLines(ds))
	}

	nc := e.connectNATS()
	defer nc.Close()
	jobs := e.recordJobs(nc, events.Subjects{}.SyncJobsIn(namespace))
	defer jobs.stop()
	by := func(leader string, after time.Time) (jobMsg, bool) {
		msgs, _ := jobs.messages()
		for _, m := range msgs {
			if m.env.Type == events.TypeSyncJob && m.env.Epoch != nil && m.env.Epoch.Leader == leader && m.at.After(after) {
				return m, true
			}
		}
		return jobMsg{}, false
	}
	var before jobMsg
	testenv.Wait(t, time.Minute, "a sync job of the leader "+holder, func() (bool, string) {
		m, ok := by(holder, time.Time{})
		before = m
		msgs, bad := jobs.messages()
		return ok, fmt.Sprintf("%d sync jobs, %d undecodable %v", len(msgs), len(bad), bad)
	})

	deleted := time.Now()
	if err := e.kube.CoreV1().Pods(namespace).Delete(ctx, holder, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var now string
	var newTransitions int32
	testenv.Wait(t, 2*takeoverBound, "another discovery pod to hold Lease "+leaseName, func() (bool, string) {
		l, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		now, newTransitions = ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0)
		return now != "" && now != holder, fmt.Sprintf("holder %q", now)
	})
	takeover := time.Since(deleted)
	// The deleted leader releases the Lease on SIGTERM; the standby
	// retries every retry period (2 s), while the Deployment's replacement
	// pod campaigns as it starts: either may win, and both are correct.
	who := "the standby"
	if now != standby {
		who = "the replacement pod"
		now2, err := e.pods(discoverySel)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(now2, func(p corev1.Pod) bool { return p.Name == now && p.DeletionTimestamp == nil }) {
			t.Errorf("Lease taken by %q, which is neither the standby %s nor a live discovery pod: %s", now, standby, podLines(now2))
		}
	}
	t.Logf("Lease %s: %s %s holds it %.2fs after %s's pod was deleted", leaseName, who, now, takeover.Seconds(), holder)
	if takeover > takeoverBound {
		t.Errorf("a new leader %.1fs after the leader's pod was deleted, over the bound %v (lease %v + renew deadline %v + margin)",
			takeover.Seconds(), takeoverBound, leaseDuration, renewDeadline)
	}
	if newTransitions <= transitions {
		t.Errorf("Lease transitions %d after the change of holder, %d before", newTransitions, transitions)
	}
	var first jobMsg
	testenv.Wait(t, time.Minute, "a sync job of the new leader "+now, func() (bool, string) {
		m, ok := by(now, deleted)
		first = m
		return ok, "none yet"
	})
	firstJob := first.at.Sub(deleted)
	if !before.env.Epoch.Before(first.env.Epoch) {
		t.Errorf("the new leader's epoch %s is not after the old one's %s", first.env.Epoch, before.env.Epoch)
	}
	// Fencing: nothing of the old term published after the new term's first job
	// (envelope times: both publishers run on this node's clock).
	msgs, _ := jobs.messages()
	for _, m := range msgs {
		if m.env.Epoch != nil && m.env.Epoch.Leader == holder && m.env.Time.After(first.env.Time) {
			t.Errorf("the deposed leader %s published sync job %s (%s) after the new leader's first (%s)",
				holder, m.env.ID, m.env.Time.Format(time.StampMilli), first.env.Time.Format(time.StampMilli))
		}
	}
	e.waitPodsReady(discoverySel, 2, 3*time.Minute)
	return fmt.Sprintf("%s led %.2fs after the delete (bound %v), its first sync job (epoch %s, reason %s) came %.2fs after the delete",
		who, takeover.Seconds(), takeoverBound, first.env.Epoch, syncReason(first.env), firstJob.Seconds())
}

func syncReason(env events.Envelope) string {
	j, err := events.Into[events.SyncJob](env, events.TypeSyncJob)
	if err != nil {
		return "?"
	}
	return j.Reason
}

// scaleNATS sets the NATS Deployment's replicas.
func (e *e2e) scaleNATS(n int32) {
	e.t.Helper()
	s, err := e.kube.AppsV1().Deployments(namespace).GetScale(e.ctx, "nats", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	s.Spec.Replicas = n
	if _, err := e.kube.AppsV1().Deployments(namespace).UpdateScale(e.ctx, "nats", s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// natsOutage is step 6. NATS keeps its store on an emptyDir, so the new
// pod starts without streams, consumers or de-duplication state: matbus
// must create them again.
func (e *e2e) natsOutage(small *mat) string {
	t, ctx := e.t, e.ctx
	workers := e.waitPodsReady(workerSel, 3, 2*time.Minute)
	discs := e.waitPodsReady(discoverySel, 2, 2*time.Minute)
	before := maps.Clone(small.services)

	down := time.Now()
	e.scaleNATS(0)
	e.waitFor(2*time.Minute, time.Second, "the NATS pod gone", func() (bool, string) {
		ps, err := e.pods("app.kubernetes.io/name=nats")
		return err == nil && len(ps) == 0, podLines(ps)
	})
	bodies := map[string]string{}
	procs := append(slices.Clone(workers), discs...)
	testenv.Wait(t, time.Minute, "every worker's and discovery's /readyz 503 naming NATS", func() (bool, string) {
		var why []string
		for _, p := range procs {
			if _, ok := bodies[p.Name]; ok {
				continue
			}
			code, body, err := readyz(p.Status.PodIP)
			if err == nil && code == 503 && strings.Contains(body, "NATS") {
				bodies[p.Name] = body
				continue
			}
			why = append(why, fmt.Sprintf("%s: %d %q %v", p.Name, code, body, err))
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
	e.waitFor(2*time.Minute, time.Second, "every worker pod's Ready condition False", func() (bool, string) {
		ps, err := e.pods(workerSel)
		if err != nil {
			return false, err.Error()
		}
		for i := range ps {
			if podReady(&ps[i]) || ps[i].Status.Phase != corev1.PodRunning {
				return false, podLines(ps)
			}
		}
		return len(ps) == 3, podLines(ps)
	})
	unready := time.Since(down)
	t.Logf("/readyz while NATS is down: %s: %q", workers[0].Name, bodies[workers[0].Name])

	// A change while NATS is down: a BMC Service deleted by hand.
	victim := slices.Sorted(maps.Keys(before))[0]
	uid := before[victim]
	if err := e.kube.CoreV1().Services(namespace).Delete(ctx, victim, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil {
		t.Fatal(err)
	}

	e.scaleNATS(1)
	e.waitPodsReady("app.kubernetes.io/name=nats", 1, 3*time.Minute)
	up := time.Now()
	e.waitPodsReady(workerSel, 3, 3*time.Minute)
	e.waitPodsReady(discoverySel, 2, 3*time.Minute)
	ready := time.Since(up)
	for _, p := range procs {
		if code, body, err := readyz(p.Status.PodIP); err != nil || code != 200 {
			t.Errorf("%s /readyz after NATS is back: %d %q %v", p.Name, code, body, err)
		}
	}

	// The streams and job consumers exist again.
	nc := e.connectNATS()
	defer nc.Close()
	bus, err := events.New(nc, events.Config{Namespace: namespace}, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e.waitFor(2*time.Minute, time.Second, "matbus's streams and job consumers created again", func() (bool, string) {
		for _, sc := range bus.StreamConfigs() {
			if _, err := js.Stream(ctx, sc.Name); err != nil {
				return false, "stream " + sc.Name + ": " + err.Error()
			}
		}
		for stream, role := range map[string]string{bus.StreamName(events.StreamSync): events.SyncConsumer, bus.StreamName(events.StreamDelete): events.DeleteConsumer} {
			name := events.ConsumerName(role, namespace)
			if _, err := js.Consumer(ctx, stream, name); err != nil {
				return false, "consumer " + stream + "/" + name + ": " + err.Error()
			}
		}
		return true, ""
	})

	e.waitFor(3*time.Minute, time.Second, "Service "+victim+" created again and "+small.name+" converged", func() (bool, string) {
		s, err := e.kube.CoreV1().Services(namespace).Get(ctx, victim, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if s.UID == uid {
			return false, "still the old one"
		}
		return e.converged(small)
	})
	back := time.Since(up)
	_, deleted := e.rec.since(down)
	for _, ev := range deleted {
		if ev.uid != uid {
			t.Errorf("Service %s (uid %s, instance %q) deleted during the NATS outage", ev.name, ev.uid, ev.instance)
		}
	}
	for n, u := range small.services {
		if n != victim && before[n] != u {
			t.Errorf("Service %s changed UID during the NATS outage", n)
		}
	}
	return fmt.Sprintf("workers 503 naming NATS, not Ready %.1fs after NATS went; ready again %.1fs after NATS was; streams and consumers re-created; the hand-deleted Service back and the instance converged %.1fs after NATS was",
		unready.Seconds(), ready.Seconds(), back.Seconds())
}

// upgradeTestUninstall is step 7.
func (e *e2e) upgradeTestUninstall(small *mat) string {
	t, ctx := e.t, e.ctx
	deps := []string{fullname + "-discovery", fullname + "-worker"}
	oldRS := map[string]string{}
	oldRev := map[string]int{}
	for _, name := range deps {
		d, err := e.kube.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rs, err := e.newestReplicaSet(d)
		if err != nil {
			t.Fatal(err)
		}
		oldRS[name], oldRev[name] = rs.Name, revision(d)
	}
	stable := time.Now()
	start := time.Now()
	e.helm(7*time.Minute, append(append([]string{"upgrade", release, chartDir, "--namespace", namespace, "--wait", "--timeout", "5m"}, e.chartArgs()...),
		"--values", filepath.Join("deploytest", "kubee2e", "testdata", "upgrade-values.yaml"))...)
	upgraded := time.Since(start)
	for _, name := range deps {
		e.waitFor(3*time.Minute, time.Second, "the rollout of "+name, func() (bool, string) { return e.rolledOut(name) })
		d, err := e.kube.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rs, err := e.newestReplicaSet(d)
		if err != nil {
			t.Fatal(err)
		}
		if rs.Name == oldRS[name] || revision(d) <= oldRev[name] {
			t.Errorf("%s did not roll: ReplicaSet %s revision %d, before %s revision %d", name, rs.Name, revision(d), oldRS[name], oldRev[name])
		}
	}
	e.checkReleasePods(2, 3)
	t.Logf("upgrade --wait returned after %.1fs; both rollouts done %.1fs after the upgrade began", upgraded.Seconds(), time.Since(start).Seconds())
	e.staysReady(30 * time.Second)
	e.gw = e.checkGatewayRestarts("7. helm upgrade", e.gw)
	ps, err := e.pods(instanceSel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		c := p.Spec.Containers[0]
		var level string
		for _, v := range c.Env {
			if v.Name == "LOG_LEVEL" {
				level = v.Value
			}
		}
		if level != "debug" {
			t.Errorf("pod %s: LOG_LEVEL %q, want debug", p.Name, level)
		}
		if p.Labels["app.kubernetes.io/component"] == "worker" && !slices.Contains(c.Args, "--jobs=4") {
			t.Errorf("worker pod %s: args %v lack --jobs=4", p.Name, c.Args)
		}
	}
	// The processes log at debug level: a new worker logs each instance
	// it reads from the instances stream at debug level.
	debugAt := time.Now()
	e.waitFor(time.Minute, time.Second, "a worker logging at debug level", func() (bool, string) {
		ws, err := e.pods(workerSel)
		if err != nil {
			return false, err.Error()
		}
		for _, w := range ws {
			if strings.Contains(podLogs(ctx, e.kube, w.Name, "worker", false, 500), `"level":"DEBUG"`) {
				return true, ""
			}
		}
		return false, "no DEBUG line in the workers' last 500 lines"
	})
	t.Logf("a worker logs at debug level (found after %.1fs)", time.Since(debugAt).Seconds())

	tested := time.Now()
	out := e.helm(5*time.Minute, "test", release, "--namespace", namespace, "--timeout", "3m")
	if !strings.Contains(out, "Succeeded") {
		t.Errorf("helm test passed without a Succeeded phase:\n%s", out)
	}
	t.Logf("helm test passed in %.1fs", time.Since(tested).Seconds())

	start = time.Now()
	e.helm(5*time.Minute, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "3m")
	uninstalled := time.Since(start)
	var left, first []string
	cleared := e.waitFor(2*time.Minute, 2*time.Second, "no object of the release left but its Lease", func() (bool, string) {
		var err error
		left, err = e.releaseObjects()
		if err != nil {
			return false, err.Error()
		}
		if first == nil {
			first = append([]string{}, left...)
		}
		others := slices.DeleteFunc(slices.Clone(left), func(s string) bool { return strings.HasPrefix(s, "Lease/") })
		return len(others) == 0, strings.Join(others, ", ")
	})
	// The Lease is written by the code, not by helm: only an owner
	// reference to the discovery Deployment lets the garbage collector
	// remove it.
	leaseLeft := ""
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := e.kube.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			leaseLeft = fmt.Sprintf("Lease %s (holder %q, labels %v, ownerReferences %v)", l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), l.Labels, l.OwnerReferences)
			break
		}
		time.Sleep(2 * time.Second)
	}
	if leaseLeft != "" {
		t.Errorf("DEFECT: helm uninstall --wait leaves the election %s a minute later: the chart does not own it and it has no owner reference to the discovery Deployment for the garbage collector", leaseLeft)
	}
	t.Logf("uninstall --wait returned after %.1fs with %d objects of the release still there (%s); they were gone %.1fs later; Lease %s gone %.1fs after the uninstall began",
		uninstalled.Seconds(), len(first), strings.Join(first, ", "), cleared.Seconds(), leaseName, time.Since(start).Seconds())

	// The BMC Services stay: the MAT workload owns them, not the release.
	if ok, why := e.converged(small); !ok {
		t.Errorf("the BMC Services changed with the release's uninstall: %s", why)
	}
	_, deleted := e.rec.since(stable)
	// (the release's own metrics Service goes with it)
	deleted = slices.DeleteFunc(deleted, func(ev svcEvent) bool { return strings.HasPrefix(ev.name, fullname+"-") })
	if len(deleted) > 0 {
		t.Errorf("%d Services deleted during upgrade and uninstall: %s", len(deleted), names(deleted, 10))
	}
	have, err := e.existing(small)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range have {
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Deployment" || s.OwnerReferences[0].Name != small.name || s.OwnerReferences[0].UID != small.deploy {
			t.Errorf("Service %s: ownerReferences %+v, want the MAT Deployment %s (uid %s)", s.Name, s.OwnerReferences, small.name, small.deploy)
			break
		}
	}
	return fmt.Sprintf("upgrade --wait %.1fs, both Deployments rolled; uninstall --wait %.1fs; %d BMC Services stay, owned by Deployment %s%s",
		upgraded.Seconds(), uninstalled.Seconds(), len(have), small.name, map[bool]string{true: "; LEASE LEFT BEHIND", false: ""}[leaseLeft != ""])
}

// staysReady asserts that every pod of the release stays ready for d:
// /readyz answers 200 on each (sampled every 2 s) and the Ready condition
// holds. A 503 names its cause; the first ones, and the pod's last log
// lines, are reported.
func (e *e2e) staysReady(d time.Duration) {
	e.t.Helper()
	ps, err := e.pods(instanceSel)
	if err != nil {
		e.t.Fatal(err)
	}
	bad := map[string][]string{}
	end := time.Now().Add(d)
	for time.Now().Before(end) && e.ctx.Err() == nil {
		for _, p := range ps {
			code, body, err := readyz(p.Status.PodIP)
			if err != nil || code != 200 {
				bad[p.Name] = append(bad[p.Name], fmt.Sprintf("%s %d %q %v", time.Now().Format(time.TimeOnly), code, body, err))
			}
		}
		time.Sleep(2 * time.Second)
	}
	now, err := e.pods(instanceSel)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range now {
		if !podReady(&now[i]) {
			bad[now[i].Name] = append(bad[now[i].Name], "not Ready: "+podLine(&now[i]))
		}
	}
	for _, p := range ps {
		if b := bad[p.Name]; len(b) > 0 {
			e.t.Errorf("pod %s did not stay ready for %v after it was: %d failed samples, e.g. %s; its last log lines:\n%s",
				p.Name, d, len(b), strings.Join(b[:min(len(b), 3)], "; "), podLogs(e.ctx, e.kube, p.Name, p.Spec.Containers[0].Name, false, 30))
		}
	}
}

// releaseObjects lists what is left of the release in the namespace: any
// object with the release's instance label, or named after the release
// (its fullname, "<fullname>-…", Helm's release Secrets), or the Lease.
func (e *e2e) releaseObjects() ([]string, error) {
	ctx := e.ctx
	var out []string
	ours := func(kind string, om metav1.ObjectMeta) {
		n := om.Name
		if om.Labels["app.kubernetes.io/instance"] == release || n == fullname || strings.HasPrefix(n, fullname+"-") ||
			strings.HasPrefix(n, "sh.helm.release.v1."+release+".") || (kind == "Lease" && om.Labels["app.kubernetes.io/part-of"] == "matbus") {
			out = append(out, kind+"/"+n)
		}
	}
	core, apps := e.kube.CoreV1(), e.kube.AppsV1()
	lo := metav1.ListOptions{}
	if l, err := apps.Deployments(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("Deployment", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := apps.ReplicaSets(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("ReplicaSet", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := core.Pods(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("Pod", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := core.Services(namespace).List(ctx, metav1.ListOptions{LabelSelector: labelFiller + "!=true"}); err == nil {
		for _, x := range l.Items {
			ours("Service", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := core.Secrets(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("Secret", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := core.ConfigMaps(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("ConfigMap", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := core.ServiceAccounts(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("ServiceAccount", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := e.kube.RbacV1().Roles(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("Role", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := e.kube.RbacV1().RoleBindings(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("RoleBinding", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := e.kube.PolicyV1().PodDisruptionBudgets(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("PodDisruptionBudget", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	if l, err := e.kube.DiscoveryV1().EndpointSlices(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			if strings.HasPrefix(x.Labels["kubernetes.io/service-name"], fullname+"-") {
				out = append(out, "EndpointSlice/"+x.Name)
			}
		}
	} else {
		return nil, err
	}
	if l, err := e.kube.CoordinationV1().Leases(namespace).List(ctx, lo); err == nil {
		for _, x := range l.Items {
			ours("Lease", x.ObjectMeta)
		}
	} else {
		return nil, err
	}
	return out, nil
}
