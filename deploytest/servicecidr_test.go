package deploytest

import (
	"context"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// bmcCIDRArgs turn the chart's ServiceCIDR objects on for two IPv4
// networks (BMC and NVOS) and one dual-stack pair.
var bmcCIDRArgs = []string{
	"--set", "worker.serviceCIDR={10.96.0.0/12}",
	"--set", "bmcServiceCIDR.create=true",
	"--set", "bmcServiceCIDR.cidrs[0]=10.100.0.0/16",
	"--set", "bmcServiceCIDR.cidrs[1]=10.102.0.0/16",
	"--set", `bmcServiceCIDR.cidrs[2]=10.104.0.0/16\,fd00:104::/108`,
}

// serviceCIDRs returns the rendered ServiceCIDR objects by name, each
// with its spec.cidrs.
func serviceCIDRs(t *testing.T, objs []*unstructured.Unstructured) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, o := range objs {
		if o.GetKind() != "ServiceCIDR" {
			continue
		}
		if o.GetAPIVersion() != "networking.k8s.io/v1" || o.GetNamespace() != "" {
			t.Errorf("ServiceCIDR %s: apiVersion %s, namespace %q; want networking.k8s.io/v1, cluster-scoped", o.GetName(), o.GetAPIVersion(), o.GetNamespace())
		}
		cidrs, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "cidrs")
		out[o.GetName()] = cidrs
	}
	return out
}

// workerServiceCIDRFlags returns the values of the worker's --service-cidr.
func workerServiceCIDRFlags(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, find(t, objs, "Deployment", "-worker")).args {
		if v, ok := strings.CutPrefix(a, "--service-cidr="); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestChartBMCServiceCIDROffByDefault: no value set (nor the ci ones)
// renders a ServiceCIDR, and the worker's --service-cidr is
// worker.serviceCIDR alone.
func TestChartBMCServiceCIDROffByDefault(t *testing.T) {
	for _, vs := range valueSets {
		if got := serviceCIDRs(t, render(t, "matbus", vs.args...)); len(got) != 0 {
			t.Errorf("%s: ServiceCIDRs rendered although bmcServiceCIDR.create is off: %v", vs.name, got)
		}
	}
	// cidrs alone, without create, make nothing either.
	objs := render(t, "matbus", "--set", "worker.serviceCIDR={10.96.0.0/12}", "--set", "bmcServiceCIDR.cidrs={10.100.0.0/16}")
	if got := serviceCIDRs(t, objs); len(got) != 0 {
		t.Errorf("ServiceCIDRs rendered with cidrs but create off: %v", got)
	}
	if got, want := workerServiceCIDRFlags(t, objs), []string{"10.96.0.0/12"}; !slices.Equal(got, want) {
		t.Errorf("worker --service-cidr %v, want %v", got, want)
	}
}

// TestChartBMCServiceCIDRObjects: one object per entry, named after the
// release, namespace and CIDRs, with the CIDRs as given; kept by helm
// uninstall unless keep is false; the worker's --service-cidr lists
// worker.serviceCIDR and then every CIDR of the objects, once; the worker
// accepts those arguments; the API server accepts the objects (dry run).
func TestChartBMCServiceCIDRObjects(t *testing.T) {
	objs := render(t, "lab", bmcCIDRArgs...)
	want := map[string][]string{
		"matbus-lab-10-100-0-0-16":                {"10.100.0.0/16"},
		"matbus-lab-10-102-0-0-16":                {"10.102.0.0/16"},
		"matbus-lab-10-104-0-0-16-fd00-104---108": {"10.104.0.0/16", "fd00:104::/108"},
	}
	got := serviceCIDRs(t, objs)
	if len(got) != len(want) {
		t.Errorf("ServiceCIDRs %v, want %v", got, want)
	}
	for name, cidrs := range want {
		if !slices.Equal(got[name], cidrs) {
			t.Errorf("ServiceCIDR %s: cidrs %v, want %v", name, got[name], cidrs)
		}
	}
	for _, o := range objs {
		if o.GetKind() != "ServiceCIDR" {
			continue
		}
		if o.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("ServiceCIDR %s: annotations %v lack helm.sh/resource-policy: keep (the default)", o.GetName(), o.GetAnnotations())
		}
		if o.GetLabels()["app.kubernetes.io/instance"] != "matbus" || o.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("ServiceCIDR %s: labels %v lack the release's", o.GetName(), o.GetLabels())
		}
	}

	flags := workerServiceCIDRFlags(t, objs)
	if want := []string{"10.96.0.0/12", "10.100.0.0/16", "10.102.0.0/16", "10.104.0.0/16", "fd00:104::/108"}; !slices.Equal(flags, want) {
		t.Errorf("worker --service-cidr %v, want %v", flags, want)
	}
	checkArgs(t, "bmcServiceCIDR worker", "worker", container(t, find(t, objs, "Deployment", "-worker")).args[1:])

	// A CIDR already in worker.serviceCIDR is not passed twice; a name
	// prefix of one's own; keep off.
	objs = render(t, "lab", "--set", "worker.serviceCIDR={10.96.0.0/12,10.100.0.0/16}", "--set", "bmcServiceCIDR.create=true",
		"--set", "bmcServiceCIDR.cidrs={10.100.0.0/16}", "--set", "bmcServiceCIDR.name=bmc-range", "--set", "bmcServiceCIDR.keep=false")
	if got, want := workerServiceCIDRFlags(t, objs), []string{"10.96.0.0/12", "10.100.0.0/16"}; !slices.Equal(got, want) {
		t.Errorf("worker --service-cidr %v, want %v", got, want)
	}
	o := find(t, objs, "ServiceCIDR", "bmc-range-10-100-0-0-16")
	if _, ok := o.GetAnnotations()["helm.sh/resource-policy"]; ok {
		t.Errorf("ServiceCIDR %s keeps the resource policy with keep=false: %v", o.GetName(), o.GetAnnotations())
	}

	// The API server's own validation (canonical CIDRs, one per family,
	// the name) accepts every object.
	c := requireCluster(t)
	dyn := dynamic.NewForConfigOrDie(adminConfig(c))
	res := schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "servicecidrs"}
	for _, o := range render(t, "lab", bmcCIDRArgs...) {
		if o.GetKind() != "ServiceCIDR" {
			continue
		}
		if _, err := dyn.Resource(res).Create(context.Background(), o,
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}); err != nil {
			t.Errorf("server dry run of ServiceCIDR %s: %v", o.GetName(), err)
		}
	}
	// The check can fail: two CIDRs of one family are refused.
	bad := find(t, render(t, "lab", bmcCIDRArgs...), "ServiceCIDR", "-10-100-0-0-16")
	_ = unstructured.SetNestedStringSlice(bad.Object, []string{"10.100.0.0/16", "10.102.0.0/16"}, "spec", "cidrs")
	if _, err := dyn.Resource(res).Create(context.Background(), bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
		t.Error("the API server accepted a ServiceCIDR with two IPv4 CIDRs (dry run)")
	}
}

// TestChartBMCServiceCIDRValueErrors: values that cannot make a working
// ServiceCIDR fail the render (or the schema) with a message naming the
// value and what to give instead.
func TestChartBMCServiceCIDRValueErrors(t *testing.T) {
	on := "bmcServiceCIDR.create=true,worker.serviceCIDR={10.96.0.0/12},"
	for _, tc := range []struct {
		set, want string
	}{
		{"bmcServiceCIDR.create=true,worker.serviceCIDR={10.96.0.0/12}", "bmcServiceCIDR.cidrs is empty"},
		{"bmcServiceCIDR.create=true,bmcServiceCIDR.cidrs={10.100.0.0/16}", "worker.serviceCIDR is empty: set it to the cluster's own service range"},
		{on + "bmcServiceCIDR.cidrs={10.100.0.1/16}", `"10.100.0.1/16" has bits set after the /16 prefix`},
		{on + "bmcServiceCIDR.cidrs={10.256.0.0/16}", `"10.256.0.0/16" is not an IPv4 CIDR (octet "256")`},
		{on + "bmcServiceCIDR.cidrs={10.010.0.0/16}", `is not an IPv4 CIDR (octet "010")`},
		{on + "bmcServiceCIDR.cidrs={10.100.0.0/33}", "is not an IPv4 CIDR (prefix length)"},
		{on + "bmcServiceCIDR.cidrs={fd00::/129}", "is not an IPv6 CIDR (prefix length)"},
		{on + `bmcServiceCIDR.cidrs={10.100.0.0/16\,10.102.0.0/16}`, "holds two IPv4 CIDRs: a ServiceCIDR holds at most one CIDR per IP family"},
		{on + `bmcServiceCIDR.cidrs={fd00:1::/108\,fd00:2::/108}`, "holds two IPv6 CIDRs"},
		{on + "bmcServiceCIDR.cidrs={10.100.0.0/16,10.100.0.0/16}", `"10.100.0.0/16" is listed twice`},
		// The schema: a name that is no network, a string for a bool, upper
		// case (the API server wants the canonical, lower-case form), a bad name.
		{"bmcServiceCIDR.cidrs={bmc-net}", "/bmcServiceCIDR/cidrs/0"},
		{"bmcServiceCIDR.create=yes", "/bmcServiceCIDR/create"},
		{"bmcServiceCIDR.cidrs={FD00::/108}", "/bmcServiceCIDR/cidrs/0"},
		{"bmcServiceCIDR.name=Bad_Name", "/bmcServiceCIDR/name"},
	} {
		out, err := helmErr(t, "template", "matbus", chartDir, "--set", tc.set)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: want a failure mentioning %q, got err=%v\n%s", tc.set, tc.want, err, out)
		}
	}
}

// TestChartBMCServiceCIDRNotes: the install notes name the objects and
// their CIDRs, and say nothing of them when there are none.
func TestChartBMCServiceCIDRNotes(t *testing.T) {
	kc := requireCluster(t).Kubeconfig
	install := func(args ...string) string {
		return string(helm(t, append([]string{"install", "matbus", chartDir, "--dry-run=client", "--namespace", "lab", "--kubeconfig", kc}, args...)...))
	}
	out := install(bmcCIDRArgs...)
	for _, want := range []string{"ServiceCIDRs, cluster-scoped, kept by helm uninstall", "matbus-lab-10-100-0-0-16 (10.100.0.0/16)",
		"matbus-lab-10-104-0-0-16-fd00-104---108 (10.104.0.0/16, fd00:104::/108)"} {
		if !strings.Contains(out, want) {
			t.Errorf("NOTES lack %q:\n%s", want, out)
		}
	}
	if out := install(); strings.Contains(out, "extra service ranges") {
		t.Errorf("NOTES speak of ServiceCIDRs although none is made:\n%s", out)
	}
}
