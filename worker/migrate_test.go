package worker_test

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// TestMigrationToExternalIP: Services of the ClusterIP model — made by
// matbus in cluster-ip mode (BMC and NVOS), one without the instance label
// as the old controller left them, and one whose API-allocated clusterIP is
// another device's BMC IP — are each recreated once by a worker in
// external-ip mode: the IP in spec.externalIPs, a clusterIP that is no
// device's IP, foreign labels and annotations kept. Then nothing changes.
func TestMigrationToExternalIP(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{FixturePath: fixtureV2Mixed})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	old := e.startWorker(workerOpts{Name: "cluster-ip"})
	before := e.waitServices(v2MixedNames()...)
	old.Stop()

	const (
		hostX = "mat-bmc-host-922f3d9b-20b-4da64654" // BMC 10.96.64.10; will hold 10.96.64.13 as clusterIP
		hostY = "mat-bmc-host-7ec7b7c3-126-c030b365" // BMC 10.96.64.13
		dpu   = "mat-bmc-dpu-a15919aa-572-726d4120"  // loses its instance label (the old controller's)
	)
	svcs := e.kube.CoreV1().Services(e.ns)
	deviceIPs := map[string]bool{}
	for _, s := range before {
		deviceIPs[plan.ServiceIP(s)] = true
	}
	// Foreign metadata on every Service.
	for name := range before {
		s := e.service(name)
		s.Labels["team.example.com/owner"] = "infra"
		s.Annotations["example.com/note"] = "keep " + name
		if name == dpu {
			delete(s.Labels, plan.LabelInstance)
		}
		if _, err := svcs.Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// hostX as if made in external-ip mode, with the clusterIP the API
	// server "allocated": hostY's BMC IP (hostY's Service gone for now).
	x := e.service(hostX)
	for _, n := range []string{hostX, hostY} {
		if err := svcs.Delete(e.ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "hostX and hostY deleted", func() (bool, string) { return e.service(hostX) == nil && e.service(hostY) == nil, "still there" })
	x.ResourceVersion, x.UID = "", ""
	x.Spec.ClusterIP, x.Spec.ClusterIPs = "10.96.64.13", []string{"10.96.64.13"}
	x.Spec.ExternalIPs = []string{"10.96.64.10"}
	x, err := svcs.Create(e.ctx, x, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mid := e.services()
	mid[hostX] = x

	w := e.startWorker(workerOpts{Name: "external-ip", Tweak: func(c *worker.Config) { c.Plan.IPMode = plan.IPModeExternalIP }})
	migrated := func(s *corev1.Service) string {
		ip := plan.ServiceIP(s)
		switch {
		case !slices.Equal(s.Spec.ExternalIPs, []string{ip}):
			return fmt.Sprintf("externalIPs %v, want [%s]", s.Spec.ExternalIPs, ip)
		case deviceIPs[s.Spec.ClusterIP] || s.Spec.ClusterIP == "":
			return "clusterIP " + s.Spec.ClusterIP + " is a device's IP"
		case s.Labels[plan.LabelInstance] != e.key("mat-a"):
			return "no instance label"
		}
		return ""
	}
	var after map[string]*corev1.Service
	waitFor(t, "every Service migrated", func() (bool, string) {
		after = e.services()
		if len(after) != len(v2MixedServices) {
			return false, fmt.Sprintf("%d Services", len(after))
		}
		for n, s := range after {
			if why := migrated(s); why != "" {
				return false, n + ": " + why
			}
		}
		return true, ""
	})
	for n, s := range after {
		if n == hostY {
			continue // created afresh
		}
		if s.UID == mid[n].UID {
			t.Errorf("%s: not recreated (UID %s)", n, s.UID)
		}
		if s.Labels["team.example.com/owner"] != "infra" || s.Annotations["example.com/note"] != "keep "+n {
			t.Errorf("%s: foreign metadata lost: %v %v", n, s.Labels, s.Annotations)
		}
	}
	waitSyncs(t, w, 3)
	for n, s := range e.services() {
		if s.ResourceVersion != after[n].ResourceVersion {
			t.Errorf("%s still changing after migration", n)
		}
	}
	if st := w.Stats(); st.Recreated != int64(len(v2MixedServices)-1) || st.Created != 1 || st.DeleteJobs != 0 {
		t.Errorf("stats = %+v, want %d recreates and one create", st, len(v2MixedServices)-1)
	}
	for _, kind := range []string{"create", "update", "delete", "plan"} {
		if evs := e.errs.Of(errKind(kind)); len(evs) != 0 {
			t.Errorf("unexpected %s error events: %+v", kind, evs)
		}
	}
}
