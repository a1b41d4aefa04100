package worker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/operator"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// fixedStatus is a status client that answers one status.
type fixedStatus struct{ st *matclient.Status }

func (f fixedStatus) Status(context.Context) (*matclient.Status, error) { return f.st, nil }
func (f fixedStatus) Close() error                                      { return nil }

// planLines is a plan as sorted lines "<action> <name>[: reason]".
func planLines(p plan.Plan) []string {
	var out []string
	for _, s := range p.Create {
		out = append(out, "create "+s.Name)
	}
	for _, u := range p.Update {
		out = append(out, "update "+u.Old.Name)
	}
	for _, u := range p.Recreate {
		out = append(out, fmt.Sprintf("recreate %s: %s (foreign %v)", u.Old.Name, u.Reason, u.Foreign))
	}
	for _, s := range p.Delete {
		out = append(out, "delete "+s.Name)
	}
	for _, s := range p.Skipped {
		out = append(out, "skip "+s.Name+": "+s.Reason)
	}
	slices.Sort(out)
	return out
}

// TestDryRunPlansAsTheWorker feeds the same Services of a real API server
// to a running worker's informer path and to `matbus plan`'s (operator.Plan
// over one LIST) and gets the same plan for each instance, in both IP
// modes. The mix: instance A's Services up to date, drifted, the old
// controller's (adopted), one stale (deleted), one missing (created), a
// desired name held by instance B (skipped), an old controller's Service
// no device wants (left alone), a Service of another manager holding a
// BMC IP, and in external-ip mode one of A's whose cluster IP B publishes
// (recreated, naming B's Service).
func TestDryRunPlansAsTheWorker(t *testing.T) {
	for _, mode := range []plan.IPMode{plan.IPModeClusterIP, plan.IPModeExternalIP} {
		t.Run(string(mode), func(t *testing.T) { testDryRunPlansAsTheWorker(t, mode) })
	}
}

func testDryRunPlansAsTheWorker(t *testing.T, mode plan.IPMode) {
	e := newEnv(t)
	opts := plan.Options{Namespace: e.ns, IPMode: mode}
	w := e.startWorker(workerOpts{Tweak: func(c *worker.Config) { c.Plan = opts }})
	ctx := e.ctx
	status := func(subnet string, seed int64) *matclient.Status {
		sim := e.startSim(matsim.Options{Fleet: generatedFleet(t, subnet, seed)})
		c, err := matclient.New(sim.URL(), matclient.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	stA, stB := status("10.96.140.0/24", 31), status("10.96.141.0/24", 32)
	instA := events.Instance{Key: e.key("mat-a-bmc-mock"), URL: "http://a.invalid", PodName: "mat-a", Owner: "mat-a"}
	instB := events.Instance{Key: e.key("mat-b-bmc-mock"), URL: "http://b.invalid", PodName: "mat-b"}
	labels := map[string]string{"app": "mat-a"}
	dep, err := e.kube.AppsV1().Deployments(e.ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "mat-a"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "mat", Image: "mat:test"}}}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID}
	dA := plan.Build(plan.Instance{Key: instA.Key, PodName: instA.PodName, Owner: ref}, stA, opts)
	dB := plan.Build(plan.Instance{Key: instB.Key, PodName: instB.PodName}, stB, opts)
	if len(dA.Services) < 7 || len(dB.Services) < 2 {
		t.Fatalf("%d and %d desired Services, want at least 7 and 2", len(dA.Services), len(dB.Services))
	}
	create := func(s *corev1.Service, clusterIP string) *corev1.Service {
		t.Helper()
		c := s.DeepCopy()
		c.Spec.ClusterIP, c.Spec.ClusterIPs = clusterIP, nil
		got, err := e.kube.CoreV1().Services(e.ns).Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", c.Name, err)
		}
		return got
	}
	ip := func(s *corev1.Service) string { // the cluster IP it is created with
		if mode == plan.IPModeClusterIP {
			return s.Spec.ClusterIP
		}
		return ""
	}
	a := dA.Services
	b0 := create(dB.Services[0], ip(dB.Services[0]))
	create(dB.Services[1], ip(dB.Services[1]))
	if mode == plan.IPModeExternalIP { // A's cluster IP is B's BMC IP
		create(a[0], plan.ServiceIP(b0))
	} else {
		create(a[0], ip(a[0]))
	}
	drifted := a[1].DeepCopy()
	drifted.Annotations[plan.AnnotationRedfishPort] = "1"
	create(drifted, ip(a[1]))
	old := a[2].DeepCopy()
	delete(old.Labels, plan.LabelInstance)
	delete(old.Labels, plan.LabelPodName)
	create(old, ip(a[2]))
	taken := a[3].DeepCopy()
	taken.Labels[plan.LabelInstance] = plan.LabelValue(instB.Key)
	create(taken, "")
	stale := a[4].DeepCopy()
	stale.Name = "mat-bmc-host-stale"
	stale.Labels[plan.LabelMatID], stale.Annotations[plan.AnnotationMatID] = "stale", "stale"
	delete(stale.Annotations, plan.AnnotationBMCIP)
	create(stale, "")
	oldGone := old.DeepCopy()
	oldGone.Name = "mat-bmc-host-oldgone"
	delete(oldGone.Annotations, plan.AnnotationBMCIP)
	create(oldGone, "")
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Labels: map[string]string{"app": "x"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	create(other, plan.ServiceIP(a[5])) // holds a BMC IP (a[5] is planned as a create)
	// a[5] and a[6] and the rest do not exist yet.

	sts := map[string]*matclient.Status{instA.URL: stA, instB.URL: stB}
	cfg := operator.PlanConfig{Kube: e.kube, Options: opts,
		NewClient: func(url string) (operator.StatusClient, error) { return fixedStatus{sts[url]}, nil }}
	insts := []events.Instance{instA, instB}
	waitFor(t, "the worker and the dry run plan alike", func() (bool, string) {
		r, err := operator.Plan(ctx, cfg, insts)
		if err != nil {
			return false, err.Error()
		}
		var diffs []string
		for i, in := range insts {
			ip := r.Instances[i]
			if ip.Error != "" || ip.Plan == nil || len(ip.HeldDeletes) > 0 {
				return false, fmt.Sprintf("%s: error %q, held %v", in.Key, ip.Error, ip.HeldDeletes)
			}
			st := sts[in.URL]
			wp, err := w.PlanOf(ctx, in, st)
			if err != nil {
				return false, err.Error()
			}
			got, want := planLines(*ip.Plan), planLines(wp)
			if !slices.Equal(got, want) {
				diffs = append(diffs, fmt.Sprintf("%s:\n  dry run: %s\n  worker:  %s", in.Key, strings.Join(got, "\n           "), strings.Join(want, "\n           ")))
			}
		}
		return len(diffs) == 0, strings.Join(diffs, "\n")
	})
	// The mix is what it claims to be.
	wp, err := w.PlanOf(ctx, instA, stA)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(planLines(wp), "\n")
	for _, want := range []string{"update " + a[1].Name, "update " + a[2].Name, "skip " + a[3].Name, "delete " + stale.Name, "create " + a[5].Name} {
		if !strings.Contains(lines, want) {
			t.Errorf("worker's plan of A lacks %q:\n%s", want, lines)
		}
	}
	if strings.Contains(lines, oldGone.Name) || strings.Contains(lines, other.Name) {
		t.Errorf("worker's plan of A touches the old controller's unwanted or a foreign Service:\n%s", lines)
	}
	if foreign := "recreate " + a[0].Name; (mode == plan.IPModeExternalIP) != strings.Contains(lines, foreign) ||
		mode == plan.IPModeExternalIP && !strings.Contains(lines, b0.Name) {
		t.Errorf("%s: recreate of %s naming %s: got\n%s", mode, a[0].Name, b0.Name, lines)
	}
}
