package worker_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// TestForeignClusterIPRecreated: in external-ip mode, a Service of instance
// A whose allocated cluster IP is the BMC IP that instance B publishes is
// recreated with a fresh cluster IP (its foreign metadata kept), and the
// conflict is published as a plan error event naming B's Service; B's
// Service is not touched.
func TestForeignClusterIPRecreated(t *testing.T) {
	e := newEnv(t)
	simA := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.120.0/24", 11)})
	simB := e.startSim(matsim.Options{Fleet: generatedFleet(t, "10.96.121.0/24", 12)})
	e.startDiscovery(e.entry("mat-a", simA.URL()), e.entry("mat-b", simB.URL()))
	external := func(c *worker.Config) { c.Plan.IPMode = plan.IPModeExternalIP }
	w := e.startWorker(workerOpts{Name: "first", Tweak: external})
	want := append(wantServiceNames(generatedFleet(t, "10.96.120.0/24", 11)), wantServiceNames(generatedFleet(t, "10.96.121.0/24", 12))...)
	all := e.waitServices(want...)
	w.Stop()

	var a, b *corev1.Service
	for _, s := range all {
		switch inst := s.Labels[plan.LabelInstance]; {
		case a == nil && inst == plan.LabelValue(e.key("mat-a")) && s.Labels[plan.LabelDeviceKind] == "host":
			a = s
		case b == nil && inst == plan.LabelValue(e.key("mat-b")) && s.Labels[plan.LabelDeviceKind] == "host":
			b = s
		}
	}
	if a == nil || b == nil {
		t.Fatal("no host Service of each instance")
	}
	taken := plan.ServiceIP(b)
	// A's Service as if the API server had allocated it B's BMC IP.
	svcs := e.kube.CoreV1().Services(e.ns)
	if err := svcs.Delete(e.ctx, a.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a.Name+" deleted", func() (bool, string) { return e.service(a.Name) == nil, "still there" })
	c := a.DeepCopy()
	c.ResourceVersion, c.UID = "", ""
	c.Spec.ClusterIP, c.Spec.ClusterIPs = taken, []string{taken}
	c.Spec.IPFamilies, c.Spec.IPFamilyPolicy = nil, nil
	c.Labels["team.example.com/owner"] = "infra"
	c, err := svcs.Create(e.ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	e.startWorker(workerOpts{Name: "second", Tweak: external})
	waitFor(t, a.Name+" recreated with a fresh cluster IP", func() (bool, string) {
		s := e.service(a.Name)
		if s == nil {
			return false, "gone"
		}
		return s.UID != c.UID && s.Spec.ClusterIP != taken && s.Spec.ClusterIP != "" && s.Labels["team.example.com/owner"] == "infra",
			fmt.Sprintf("uid %s clusterIP %s labels %v", s.UID, s.Spec.ClusterIP, s.Labels)
	})
	waitFor(t, "a plan error event naming B's Service", func() (bool, string) {
		for _, ev := range e.errs.Of(events.ErrorPlan) {
			if ev.Service == e.ns+"/"+a.Name && strings.Contains(ev.Message, taken) && strings.Contains(ev.Message, b.Name) {
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	if s := e.service(b.Name); s == nil || s.UID != b.UID {
		t.Errorf("B's Service %s was recreated or deleted", b.Name)
	}
}
