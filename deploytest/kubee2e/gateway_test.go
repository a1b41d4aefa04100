package kubee2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The MAT protocol gateway runs beside every discovery replica (the chart's
// gateway.*, testdata/values.yaml) as the stand-in of
// deploytest/gatewaystandin: it polls the sources API on loopback and exits
// 3 when the set of MAT instances changes. The scenario counts each
// discovery pod's gateway restarts after every step: none but one per real
// change of the set.
const (
	gatewayContainer = "gateway"
	gatewayTLSSecret = "gateway-tls" // not <fullname>-…: the release does not own it
	// gatewayChangeBound: a change of the set is served after the
	// sources API's debounce (5 s) and a pass; the gateway polls every 2 s
	// and the kubelet restarts it after its crash-loop back-off (10 s, 20 s,
	// 40 s, … for the first, second, third restart in 10 minutes).
	gatewayChangeBound = 3 * time.Minute
)

// gatewayPod is what one discovery pod's gateway container shows.
type gatewayPod struct {
	restarts int32
	running  bool
	lastExit int32 // exit code of the last terminated run; -1 if none
}

// createGatewayTLS makes the gateway's serving certificate (as the
// chart's cert-manager Certificate would) in gatewayTLSSecret.
func (e *e2e) createGatewayTLS() {
	e.t.Helper()
	svc := fullname + "-gateway"
	crt, key := e.ca.KeyPairPEM(e.ca.Issue(svc, svc+"."+namespace, svc+"."+namespace+".svc", svc+"."+namespace+".svc.cluster.local"))
	if _, err := e.kube.CoreV1().Secrets(namespace).Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: gatewayTLSSecret},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": e.ca.PEM}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// gateways returns the gateway container of every discovery pod that is
// not being deleted, by pod name.
func (e *e2e) gateways() (map[string]gatewayPod, error) {
	ps, err := e.pods(discoverySel)
	if err != nil {
		return nil, err
	}
	out := map[string]gatewayPod{}
	for _, p := range ps {
		if p.DeletionTimestamp != nil {
			continue
		}
		if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == gatewayContainer }) {
			return nil, fmt.Errorf("discovery pod %s has no %s container: %s", p.Name, gatewayContainer, podLine(&p))
		}
		g := gatewayPod{lastExit: -1} // not running while it has no status yet
		for _, c := range p.Status.ContainerStatuses {
			if c.Name != gatewayContainer {
				continue
			}
			g.restarts, g.running = c.RestartCount, c.State.Running != nil && ptr.Deref(c.Started, false)
			if t := c.LastTerminationState.Terminated; t != nil {
				g.lastExit = t.ExitCode
			}
		}
		out[p.Name] = g
	}
	return out, nil
}

func gatewayLine(gs map[string]gatewayPod) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(gs)) {
		g := gs[n]
		s := fmt.Sprintf("%s=%d", n, g.restarts)
		if g.lastExit >= 0 {
			s += fmt.Sprintf(" (last exit %d)", g.lastExit)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// checkGatewayRestarts asserts after a step in which the set of MAT
// instances did not change: every discovery pod's gateway restarted as
// often as before the step (a pod the step created: never), and runs. It
// logs the counts and returns them for the next step.
func (e *e2e) checkGatewayRestarts(after string, before map[string]gatewayPod) map[string]gatewayPod {
	e.t.Helper()
	var now map[string]gatewayPod
	e.waitFor(time.Minute, time.Second, "every discovery pod's gateway running", func() (bool, string) {
		var err error
		if now, err = e.gateways(); err != nil {
			return false, err.Error()
		}
		for _, g := range now {
			if !g.running {
				return false, gatewayLine(now)
			}
		}
		return len(now) == 2, gatewayLine(now)
	})
	for n, g := range now {
		want := before[n].restarts // 0 for a new pod
		if g.restarts != want {
			e.t.Errorf("after %s: gateway of %s restarted %d times, want %d (no change of the sources): %s; its last log lines:\n%s",
				after, n, g.restarts, want, gatewayLine(now), podLogs(e.ctx, e.kube, n, gatewayContainer, true, 20))
		}
	}
	e.t.Logf("gateway restarts: after %s: %s", after, gatewayLine(now))
	return now
}

// waitGatewayRestart waits, after one change of the set of MAT instances
// (a MAT Service added or deleted at `at`), until every discovery pod's
// gateway has exited 3 once and runs again with a set in which the MAT
// Service `name` is present (or absent), then checks that it stays at one
// restart for a while. It logs the counts and returns them.
func (e *e2e) waitGatewayRestart(what, name string, present bool, at time.Time, before map[string]gatewayPod) map[string]gatewayPod {
	e.t.Helper()
	var now map[string]gatewayPod
	e.waitFor(gatewayChangeBound, time.Second, "every gateway restarted once after "+what, func() (bool, string) {
		var err error
		if now, err = e.gateways(); err != nil {
			return false, err.Error()
		}
		if len(now) != len(before) {
			return false, "discovery pods changed: " + gatewayLine(now)
		}
		for n, g := range now {
			if g.restarts < before[n].restarts+1 || !g.running {
				return false, gatewayLine(now)
			}
			// The new run took the new set (the stand-in logs it).
			logs := podLogs(e.ctx, e.kube, n, gatewayContainer, false, 20)
			if !strings.Contains(logs, "sources taken") || strings.Contains(logs, name) != present {
				return false, n + ": the new run has not taken the new set yet: " + gatewayLine(now)
			}
		}
		return true, ""
	})
	// Exactly one exit per change: no second one once the set holds still
	// (the sources API serves a change 5-6 s after it happened).
	time.Sleep(15 * time.Second)
	now2, err := e.gateways()
	if err != nil {
		e.t.Fatal(err)
	}
	for n, g := range now2 {
		if want := before[n].restarts + 1; g.restarts != want || g.lastExit != 3 {
			e.t.Errorf("after %s: gateway of %s restarted %d times (last exit %d), want %d with exit 3: %s; its previous run's last log lines:\n%s",
				what, n, g.restarts, g.lastExit, want, gatewayLine(now2), podLogs(e.ctx, e.kube, n, gatewayContainer, true, 20))
		}
	}
	e.t.Logf("gateway restarts: after %s: %s (every gateway back %.1fs after the change)", what, gatewayLine(now2), time.Since(at).Seconds())
	return now2
}

// gatewayAddRemove is step 3b: a MAT instance (matsim without devices, so
// no BMC Service changes) is added, then removed; each is one change of
// the set of sources, and every gateway restarts once for each.
func (e *e2e) gatewayAddRemove() string {
	t, ctx := e.t, e.ctx
	extra := &mat{name: "mat-extra", empty: true}
	e.createMATCert(extra)
	start := e.gw
	added := time.Now()
	e.createMATService(extra)
	e.createMATDeployment(extra)
	e.waitPodsReady(extra.podSelector(), 1, 3*time.Minute)
	e.gw = e.waitGatewayRestart("3b. a MAT instance added ("+extra.service()+")", extra.service(), true, added, e.gw)
	afterAdd := gatewayLine(e.gw)

	removed := time.Now()
	if err := e.kube.CoreV1().Services(namespace).Delete(ctx, extra.service(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.kube.AppsV1().Deployments(namespace).Delete(ctx, extra.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.gw = e.waitGatewayRestart("3b. a MAT instance removed ("+extra.service()+")", extra.service(), false, removed, e.gw)
	return fmt.Sprintf("gateway restarts before %s; after the add %s; after the removal %s", gatewayLine(start), afterAdd, gatewayLine(e.gw))
}
