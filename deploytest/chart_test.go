package deploytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/matbus/matbus/events"
)

// valueSets are the values the chart is checked with: the defaults, every
// optional feature on (with KEDA), and the HPA with an existing Secret.
var valueSets = []struct {
	name string
	args []string
}{
	{"default", nil},
	{"all-features", []string{"-f", chartDir + "/ci/all-features-values.yaml"}},
	{"hpa", []string{"-f", chartDir + "/ci/hpa-values.yaml"}},
}

func TestHelmLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			out := helm(t, append([]string{"lint", "--strict", chartDir}, vs.args...)...)
			if !strings.Contains(string(out), "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

// TestChartRendersExpectedObjects pins which objects each value set makes,
// so an optional feature that silently stops rendering is noticed.
func TestChartRendersExpectedObjects(t *testing.T) {
	want := map[string][]string{
		"default": {"Deployment/matbus-discovery", "Deployment/matbus-worker", "Pod/matbus-test-readiness",
			"PodDisruptionBudget/matbus-discovery", "Role/matbus", "RoleBinding/matbus",
			"Secret/matbus-nats", "Service/matbus-metrics", "ServiceAccount/matbus"},
		"all-features": {"Certificate/matbus-gateway", "ConfigMap/matbus-dashboard", "ConfigMap/matbus-gateway", "Deployment/matbus-discovery", "Deployment/matbus-worker", "NetworkPolicy/matbus",
			"Pod/matbus-test-readiness", "PodDisruptionBudget/matbus-discovery",
			"PodDisruptionBudget/matbus-worker", "PrometheusRule/matbus", "Role/matbus", "RoleBinding/matbus", "ScaledObject/matbus-worker",
			"Secret/matbus-nats", "Secret/matbus-nats-discovery", "Secret/matbus-nats-worker", "Service/matbus-gateway", "Service/matbus-metrics", "ServiceAccount/matbus", "ServiceMonitor/matbus"},
		"hpa": {"Deployment/matbus-discovery", "Deployment/matbus-worker", "HorizontalPodAutoscaler/matbus-worker",
			"Pod/matbus-test-readiness", "PodDisruptionBudget/matbus-discovery",
			"Role/matbus", "RoleBinding/matbus", "Service/matbus-metrics", "ServiceAccount/matbus"},
	}
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			var got []string
			for _, o := range render(t, "matbus", vs.args...) {
				got = append(got, o.GetKind()+"/"+o.GetName())
			}
			sort.Strings(got)
			if !slices.Equal(got, want[vs.name]) {
				t.Errorf("objects:\n got %v\nwant %v", got, want[vs.name])
			}
		})
	}
}

// TestChartValueErrors: value combinations that cannot work fail the render.
func TestChartValueErrors(t *testing.T) {
	for _, tc := range []struct {
		set, want string
	}{
		{"worker.autoscaling.enabled=true,worker.keda.enabled=true", "exclusive"},
		{"worker.bmcIPMode=node-ip", "cluster-ip"},
		{"serviceAccount.create=false", "serviceAccount.name is required"},
		{"metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true", "exclusive"},
		{"metrics.serviceMonitor.enabled=true,metrics.service.enabled=false", "needs metrics.service.enabled"},
		{"nats.tls.enabled=true", "nats.tls.secretName is required"},
		{"worker.matCA.secret=a,worker.matCA.configMap=b,worker.insecureSkipVerify=false", "worker.matCA.secret and worker.matCA.configMap are exclusive"},
		{"worker.matCA.secret=a,worker.insecureSkipVerify=true", "set worker.insecureSkipVerify=false"},
	} {
		cmd := []string{"template", "matbus", chartDir, "--set", tc.set}
		out, err := helmErr(t, cmd...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: want a failure mentioning %q, got err=%v\n%s", tc.set, tc.want, err, out)
		}
	}
}

// TestChartContainersUseRealFlags: every flag and environment variable of
// the rendered containers exists in `matbus <subcommand> --help`, and the
// arguments parse.
func TestChartContainersUseRealFlags(t *testing.T) {
	checkNonFlagEnv(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			for _, o := range render(t, "matbus", vs.args...) {
				if o.GetKind() != "Deployment" {
					continue
				}
				c := container(t, o)
				if len(c.args) == 0 {
					t.Fatalf("%s: container has no args", o.GetName())
				}
				sub := c.args[0]
				what := vs.name + " " + o.GetName()
				checkArgs(t, what, sub, c.args[1:])
				checkEnv(t, what, sub, c.envNames())
			}
		})
	}
}

// TestChartImage: the placeholder repository is the default and is easy to
// override with a tag or a digest; the NOTES warn about the placeholder.
func TestChartImage(t *testing.T) {
	img := func(args ...string) string {
		return container(t, find(t, render(t, "matbus", args...), "Deployment", "-worker")).image
	}
	if got := img(); !strings.HasPrefix(got, "registry.example.invalid/") || !strings.HasSuffix(got, ":0.1.0") {
		t.Errorf("default image %q: want the placeholder repository with the appVersion tag", got)
	}
	if got, want := img("--set", "image.repository=reg.example.com/x/matbus", "--set", "image.tag=1.2.3"), "reg.example.com/x/matbus:1.2.3"; got != want {
		t.Errorf("image %q, want %q", got, want)
	}
	if got := img("-f", chartDir+"/ci/hpa-values.yaml"); !strings.Contains(got, "@sha256:") {
		t.Errorf("image %q: want the digest", got)
	}
}

// TestChartNotes: the install notes warn while image.repository is the
// placeholder. helm template does not render NOTES.txt and an install dry
// run asks the API server for its version, hence the local cluster.
func TestChartNotes(t *testing.T) {
	kc := requireCluster(t).Kubeconfig
	install := func(args ...string) string {
		return string(helm(t, append([]string{"install", "matbus", chartDir, "--dry-run=client", "--namespace", "matbus", "--kubeconfig", kc}, args...)...))
	}
	if out := install(); !strings.Contains(out, "image.repository is still the chart's placeholder") {
		t.Errorf("NOTES do not warn about the placeholder repository:\n%s", out)
	}
	if out := install("--set", "image.repository=reg.example.com/matbus"); strings.Contains(out, "placeholder") {
		t.Errorf("NOTES warn about the placeholder although image.repository is set:\n%s", out)
	}
}

// TestChartKEDAScalesOnSyncConsumer: the ScaledObject watches the stream
// and durable consumer the workers really share, for any subject prefix.
func TestChartKEDAScalesOnSyncConsumer(t *testing.T) {
	for _, prefix := range []string{events.DefaultPrefix, "lab.mat-1"} {
		objs := render(t, "matbus", "-f", chartDir+"/ci/all-features-values.yaml", "--set", "nats.subjectPrefix="+prefix)
		so := find(t, objs, "ScaledObject", "-worker")
		triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
		if len(triggers) != 1 {
			t.Fatalf("want one trigger, got %v", triggers)
		}
		md, _, _ := unstructured.NestedStringMap(triggers[0].(map[string]any), "metadata")
		// StreamName needs no connection; an unconnected Conn satisfies New.
		bus, err := events.New(&nats.Conn{}, events.Config{Prefix: prefix}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// all-features-values.yaml puts the pipeline in namespace mat-lab.
		if want := events.ConsumerName(events.SyncConsumer, "mat-lab"); md["stream"] != bus.StreamName(events.StreamSync) || md["consumer"] != want {
			t.Errorf("prefix %q: trigger on %s/%s, want %s/%s", prefix, md["stream"], md["consumer"], bus.StreamName(events.StreamSync), want)
		}
		for _, k := range []string{"natsServerMonitoringEndpoint", "account", "lagThreshold"} {
			if md[k] == "" {
				t.Errorf("trigger metadata %s is empty", k)
			}
		}
		// By default the account of deploy/nats/, where the streams are.
		for _, u := range natsUsers(t, "nats-server.conf") {
			if md["account"] != u.Account.Name {
				t.Errorf("trigger account %q, want %q of deploy/nats/accounts.conf", md["account"], u.Account.Name)
			}
		}
		target, _, _ := unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "name")
		if dep := find(t, objs, "Deployment", "-worker"); target != dep.GetName() {
			t.Errorf("ScaledObject scales %q, want the worker Deployment %q", target, dep.GetName())
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(find(t, objs, "Deployment", "-worker").Object, "spec", "replicas"); found {
			t.Error("worker Deployment sets replicas although KEDA scales it")
		}
	}
}

// TestChartServerDryRun creates every rendered object with a server-side
// dry run and strict field validation on the real API server: RBAC,
// Deployments, HPA, PDB, Secret and ServiceAccount are validated by the
// API itself. The KEDA ScaledObject's CRD is not installed (KEDA's CRD is
// not vendored into this repository), so that one object is skipped with a
// logged reason; TestChartKEDAScalesOnSyncConsumer checks its content.
func TestChartServerDryRun(t *testing.T) {
	c := requireCluster(t)
	cfg := adminConfig(c)
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	dc := discovery.NewDiscoveryClientForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	ctx := context.Background()

	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			ns := newNamespace(t, kube, "dryrun")
			args := vs.args
			// all-features puts the Role into another namespace (value `namespace`).
			target := ns
			if vs.name == "all-features" {
				target = newNamespace(t, kube, "target")
				args = append(slices.Clone(args), "--set", "namespace="+target)
			}
			objs := render(t, ns, args...)
			applied := 0
			for _, o := range objs {
				gvk := o.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					var nm *meta.NoKindMatchError
					if gvk.Group == "keda.sh" && errors.As(err, &nm) {
						t.Logf("skipped %s %s: the KEDA CRD is not installed in the test API server (not vendored); its content is checked by TestChartKEDAScalesOnSyncConsumer", gvk.Kind, o.GetName())
						continue
					}
					if gvk.Group == "cert-manager.io" && errors.As(err, &nm) {
						t.Logf("skipped %s %s: the cert-manager CRDs are not installed in the test API server (not vendored); TestChartGateway checks its content", gvk.Kind, o.GetName())
						continue
					}
					if gvk.Group == "monitoring.coreos.com" && errors.As(err, &nm) {
						t.Logf("skipped %s %s: the prometheus-operator CRDs are not installed in the test API server (not vendored); TestChartMonitoring checks its content", gvk.Kind, o.GetName())
						continue
					}
					t.Fatalf("%s %s: %v", gvk.Kind, o.GetName(), err)
				}
				wantNS := ns
				if o.GetKind() == "Role" || o.GetKind() == "RoleBinding" {
					wantNS = target
				}
				if o.GetNamespace() != wantNS {
					t.Errorf("%s %s is in namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), wantNS)
				}
				_, err = dyn.Resource(m.Resource).Namespace(o.GetNamespace()).Create(ctx, o,
					metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
				if err != nil {
					t.Errorf("server dry run of %s %s: %v", gvk.Kind, o.GetName(), err)
					continue
				}
				applied++
			}
			// A dry run persists nothing.
			if _, err := kube.AppsV1().Deployments(ns).Get(ctx, "matbus-worker", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("after a dry run, Get worker Deployment: %v, want NotFound", err)
			}
			t.Logf("%d objects accepted by the API server (dry run)", applied)
		})
	}
	// The check itself can fail: an invalid object is refused.
	bad := render(t, "default", "--set", "worker.podDisruptionBudget.enabled=true")
	pdb := find(t, bad, "PodDisruptionBudget", "-worker")
	_ = unstructured.SetNestedField(pdb.Object, "not-a-number-or-percent", "spec", "maxUnavailable")
	m, err := mapper.RESTMapping(pdb.GroupVersionKind().GroupKind(), pdb.GroupVersionKind().Version)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dyn.Resource(m.Resource).Namespace("default").Create(ctx, pdb, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
	if !apierrors.IsInvalid(err) {
		t.Errorf("an invalid PDB was not refused by the dry run: %v", err)
	}
}

// TestValuesDocumented: every leaf value in values.yaml has a comment in
// the lines above it or above its parent.
func TestValuesDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	documented := func(i int) bool {
		for j := i - 1; j >= 0; j-- {
			s := strings.TrimSpace(lines[j])
			if strings.HasPrefix(s, "#") {
				return true
			}
			// Siblings under one comment ("Scheduling.") share it.
			if s == "" || indent(lines[j]) < indent(lines[i]) {
				return false
			}
		}
		return false
	}
	for i, l := range lines {
		s := strings.TrimSpace(l)
		if s == "" || strings.HasPrefix(s, "#") || strings.HasPrefix(s, "-") || !strings.Contains(s, ":") {
			continue
		}
		if !documented(i) && !parentDocumented(lines, i, documented) {
			t.Errorf("values.yaml line %d (%s) has no comment", i+1, s)
		}
	}
	if !strings.Contains(string(b), "--set image.repository=") || !strings.Contains(string(b), "PLACEHOLDER") {
		t.Error("values.yaml must say the default image repository is a placeholder and show a --set example")
	}
}

func indent(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

// parentDocumented: a key inside a block (resources.requests.cpu) is
// documented by its top-level block's comment only for plain Kubernetes
// structures, which this chart passes through.
func parentDocumented(lines []string, i int, documented func(int) bool) bool {
	for j := i - 1; j >= 0; j-- {
		if strings.TrimSpace(lines[j]) == "" || strings.HasPrefix(strings.TrimSpace(lines[j]), "#") {
			continue
		}
		if indent(lines[j]) < indent(lines[i]) {
			key := strings.TrimSuffix(strings.TrimSpace(lines[j]), ":")
			if slices.Contains([]string{"resources", "requests", "limits", "podSecurityContext", "securityContext",
				"seccompProfile", "capabilities"}, key) {
				return documented(j) || parentDocumented(lines, j, documented)
			}
			return false
		}
	}
	return false
}

// containerInfo is the part of a Deployment's only container the tests read.
type containerInfo struct {
	image string
	args  []string
	env   []map[string]any
}

func (c containerInfo) envNames() []string {
	var out []string
	for _, e := range c.env {
		out = append(out, fmt.Sprint(e["name"]))
	}
	return out
}

// container returns the matbus container of a Deployment: its first one
// (the discovery pods may have the gateway as a second one).
func container(t *testing.T, dep *unstructured.Unstructured) containerInfo {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s: no container", dep.GetName())
	}
	for _, c := range cs[1:] {
		if n := c.(map[string]any)["name"]; n != "gateway" || !strings.HasSuffix(dep.GetName(), "-discovery") {
			t.Fatalf("%s: container %v besides the matbus container", dep.GetName(), n)
		}
	}
	c := cs[0].(map[string]any)
	var info containerInfo
	info.image, _ = c["image"].(string)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	info.args = args
	env, _ := c["env"].([]any)
	for _, e := range env {
		info.env = append(info.env, e.(map[string]any))
	}
	return info
}

// TestChartSchemaRejectsBadValues: values.schema.json refuses wrong types
// and values in `helm lint` and `helm template`, naming the value.
func TestChartSchemaRejectsBadValues(t *testing.T) {
	for _, set := range []string{
		"discovery.replicas=abc", "worker.replicas=-1", "discovery.syncInterval=5", "discovery.syncInterval=soon",
		"discovery.leaderElection.leaseDuration=15", "worker.shutdownGrace=10", "namespace=Bad_NS",
		"common.logFormat=xml", "common.logLevel=loud", "common.healthPort=70000", "worker.jobs=0",
		"nats.url=http://nats:4222", "nats.subjectPrefix=a..b", "image.digest=latest", "discovery.podAntiAffinity=always",
		"metrics.serviceMonitor.interval=30", "networkPolicy.egress.natsPort=0",
		"nats.streamReplicas=0", "nats.streamReplicas=6", "nats.tls.enabled=yes",
		"worker.matCA.key=../ca.crt", "worker.matCA.secret=true",
		"worker.deleteHold.share=0", "worker.deleteHold.share=1.5", "worker.deleteHold.window=soon",
		"gateway.listenIpAddress=localhost", "gateway.port=0", "gateway.enabled=yes", "gateway.image=a b",
		"gateway.tls.certManager.duration=90d", "gateway.mountPath=etc/gw",
	} {
		key, _, _ := strings.Cut(set, "=")
		want := "/" + strings.ReplaceAll(key, ".", "/")
		for _, cmd := range [][]string{{"lint", "--strict", chartDir, "--set", set}, {"template", "matbus", chartDir, "--set", set}} {
			out, err := helmErr(t, cmd...)
			if err == nil || !strings.Contains(out, want) {
				t.Errorf("helm %s --set %s: want a schema failure naming %s, got err=%v\n%s", cmd[0], set, want, err, out)
			}
		}
	}
}

// TestChartDiscoveryAvailability: by default the publishers get a
// PodDisruptionBudget and a soft anti-affinity on the host; "hard" makes
// it required, "none" or an explicit affinity replaces it.
func TestChartDiscoveryAvailability(t *testing.T) {
	anti := func(args ...string) map[string]any {
		t.Helper()
		d := find(t, render(t, "matbus", args...), "Deployment", "-discovery")
		a, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec", "affinity")
		return a
	}
	objs := render(t, "matbus")
	pdb := find(t, objs, "PodDisruptionBudget", "-discovery")
	if v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(v) != "1" {
		t.Errorf("discovery PDB maxUnavailable %v, want 1", v)
	}
	soft, _, _ := unstructured.NestedSlice(anti(), "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
	if len(soft) != 1 || !strings.Contains(fmt.Sprint(soft), "kubernetes.io/hostname") || !strings.Contains(fmt.Sprint(soft), "component:discovery") {
		t.Errorf("default discovery affinity: %v", anti())
	}
	hard, _, _ := unstructured.NestedSlice(anti("--set", "discovery.podAntiAffinity=hard"), "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
	if len(hard) != 1 {
		t.Errorf("hard discovery affinity: %v", anti("--set", "discovery.podAntiAffinity=hard"))
	}
	if a := anti("--set", "discovery.podAntiAffinity=none"); a != nil {
		t.Errorf("podAntiAffinity=none renders affinity %v", a)
	}
	if a := anti("--set", "discovery.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=infra",
		"--set", "discovery.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists"); a["podAntiAffinity"] != nil {
		t.Errorf("an explicit affinity is merged with the default anti-affinity: %v", a)
	}
}

// TestChartHelmTestAndNetworkPolicy: the helm test Pod probes the metrics
// Service's /readyz with the release's image and is selected neither by
// that Service nor by the NetworkPolicy; the NetworkPolicy admits the
// health port and, with egress on, DNS, NATS and the API server.
func TestChartHelmTestAndNetworkPolicy(t *testing.T) {
	objs := render(t, "matbus", "-f", chartDir+"/ci/all-features-values.yaml")
	pod := find(t, objs, "Pod", "-test-readiness")
	if pod.GetAnnotations()["helm.sh/hook"] != "test" {
		t.Errorf("test Pod annotations %v", pod.GetAnnotations())
	}
	cs, _, _ := unstructured.NestedSlice(pod.Object, "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("test Pod containers: %v", cs)
	}
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	if !slices.Contains(args, "probe") || !slices.Contains(args, "--url=http://matbus-metrics.matbus.svc:8080/readyz") {
		t.Errorf("test Pod args %v", args)
	}
	if img, worker := cs[0].(map[string]any)["image"], container(t, find(t, objs, "Deployment", "-worker")); img != worker.image {
		t.Errorf("test Pod image %v, worker image %s", img, worker.image)
	}
	svcSel, _, _ := unstructured.NestedStringMap(find(t, objs, "Service", "-metrics").Object, "spec", "selector")
	np := find(t, objs, "NetworkPolicy", "matbus")
	npSel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	for what, sel := range map[string]map[string]string{"metrics Service": svcSel, "NetworkPolicy": npSel} {
		all := true
		for k, v := range sel {
			all = all && pod.GetLabels()[k] == v
		}
		if all {
			t.Errorf("the %s selects the test Pod", what)
		}
	}
	spec := fmt.Sprint(np.Object["spec"])
	for _, want := range []string{"port:http", "port:53", "port:4222", "port:6443", "port:8090", "Egress"} {
		if !strings.Contains(spec, want) {
			t.Errorf("NetworkPolicy lacks %s: %s", want, spec)
		}
	}
}

// TestChartMonitoring: the ServiceMonitor scrapes the metrics Service's
// port, which selects both Deployments' pods and targets their health port;
// the PrometheusRule carries files/prometheus-rules.yaml unchanged; the
// dashboard ConfigMap holds files/grafana-dashboard.json. (That the rules
// and the dashboard select series matbus exports is
// TestAlertsAndDashboardSelectExportedSeries; what the alerts do with them,
// `make alerts-test`.)
func TestChartMonitoring(t *testing.T) {
	objs := render(t, "matbus", "-f", chartDir+"/ci/all-features-values.yaml")
	svc := find(t, objs, "Service", "-metrics")
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	for _, dep := range []string{"-discovery", "-worker"} {
		d := find(t, objs, "Deployment", dep)
		podLabels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("metrics Service selector %s=%s does not select the %s pods", k, v, dep)
			}
		}
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 1 || ports[0].(map[string]any)["name"] != "http-metrics" || ports[0].(map[string]any)["targetPort"] != "http" {
		t.Errorf("metrics Service ports: %v", ports)
	}
	sm := find(t, objs, "ServiceMonitor", "matbus")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "http-metrics" || eps[0].(map[string]any)["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoints: %v", eps)
	}
	smSel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	for k, v := range smSel {
		if svc.GetLabels()[k] != v {
			t.Errorf("ServiceMonitor selector %s=%s does not select the metrics Service", k, v)
		}
	}

	rule := find(t, objs, "PrometheusRule", "matbus")
	b, err := os.ReadFile(filepath.Join(root, chartDir, "files", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if spec, _, _ := unstructured.NestedFieldNoCopy(rule.Object, "spec"); !reflect.DeepEqual(spec, file) {
		t.Errorf("PrometheusRule spec differs from files/prometheus-rules.yaml")
	}
	cm := find(t, objs, "ConfigMap", "-dashboard")
	dash, _, _ := unstructured.NestedString(cm.Object, "data", "matbus.json")
	want, err := os.ReadFile(filepath.Join(root, chartDir, "files", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(dash) != strings.TrimSpace(string(want)) {
		t.Errorf("dashboard ConfigMap differs from files/grafana-dashboard.json")
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack the sidecar's grafana_dashboard=1", cm.GetLabels())
	}
}

// TestChartNATSClusterAndTLS: nats.streamReplicas reaches both containers
// as MATBUS_STREAM_REPLICAS; with nats.tls the Secret's CA, certificate and
// key are mounted and named by MATBUS_NATS_TLS_*; without a caKey the CA
// is left to the system roots, without clientCert no certificate is sent.
func TestChartNATSClusterAndTLS(t *testing.T) {
	envOf := func(c containerInfo) map[string]string {
		out := map[string]string{}
		for _, e := range c.env {
			out[fmt.Sprint(e["name"])] = fmt.Sprint(e["value"])
		}
		return out
	}
	const dir = "/etc/matbus/nats-tls/"
	for _, tc := range []struct {
		name     string
		args     []string
		replicas string
		tls      map[string]string // env var → value; nil: no TLS at all
	}{
		{"default", nil, "1", nil},
		{"all-features", []string{"-f", chartDir + "/ci/all-features-values.yaml"}, "3",
			map[string]string{"MATBUS_NATS_TLS_CA": dir + "ca.crt", "MATBUS_NATS_TLS_CERT": dir + "tls.crt", "MATBUS_NATS_TLS_KEY": dir + "tls.key"}},
		{"system roots, no client certificate", []string{"--set", "nats.tls.enabled=true,nats.tls.secretName=s,nats.tls.caKey=,nats.tls.clientCert=false"}, "1",
			map[string]string{}},
	} {
		for _, dep := range []string{"-discovery", "-worker"} {
			d := find(t, render(t, "matbus", tc.args...), "Deployment", dep)
			env := envOf(container(t, d))
			if env["MATBUS_STREAM_REPLICAS"] != tc.replicas {
				t.Errorf("%s %s: MATBUS_STREAM_REPLICAS %q, want %q", tc.name, dep, env["MATBUS_STREAM_REPLICAS"], tc.replicas)
			}
			for _, k := range []string{"MATBUS_NATS_TLS_CA", "MATBUS_NATS_TLS_CERT", "MATBUS_NATS_TLS_KEY"} {
				if want, ok := tc.tls[k]; env[k] != want || (!ok && env[k] != "") {
					t.Errorf("%s %s: %s=%q, want %q", tc.name, dep, k, env[k], want)
				}
			}
			vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
			found := false
			for _, v := range vols {
				vm := v.(map[string]any)
				if vm["name"] != "nats-tls" {
					continue
				}
				found = true
				items, _, _ := unstructured.NestedSlice(vm, "secret", "items")
				if n, _, _ := unstructured.NestedString(vm, "secret", "secretName"); n == "" || len(items) != len(tc.tls) {
					t.Errorf("%s %s: nats-tls volume from Secret %q with %d items, want %d", tc.name, dep, n, len(items), len(tc.tls))
				}
			}
			if found != (tc.tls != nil) {
				t.Errorf("%s %s: nats-tls volume present=%v, want %v", tc.name, dep, found, tc.tls != nil)
			}
		}
	}
}

// TestChartNATSIdentityPerPart: nats.discovery and nats.worker give each
// Deployment its own NATS identity (the users of deploy/nats/): a URL or
// credentials in a Secret of the part's own, or an existing Secret; a part
// without them keeps the shared nats.url / nats.credentials.
func TestChartNATSIdentityPerPart(t *testing.T) {
	type ident struct {
		secret, url string // Secret of MATBUS_NATS_URL; its url value when rendered ("" when not)
		creds       string // Secret mounted for MATBUS_NATS_CREDS; "" for none
	}
	for _, tc := range []struct {
		name string
		args []string
		want map[string]ident // by part
	}{
		{"shared", nil, map[string]ident{
			"discovery": {"matbus-nats", "nats://nats:4222", ""}, "worker": {"matbus-nats", "nats://nats:4222", ""}}},
		{"a URL per part", []string{"--set", "nats.discovery.url=nats://discovery:pw-d@nats:4222,nats.worker.url=nats://worker:pw-w@nats:4222"},
			map[string]ident{"discovery": {"matbus-nats-discovery", "nats://discovery:pw-d@nats:4222", ""},
				"worker": {"matbus-nats-worker", "nats://worker:pw-w@nats:4222", ""}}},
		{"worker creds, discovery shared", []string{"--set", "nats.url=nats://n:4222,nats.worker.credentials=JWT"},
			map[string]ident{"discovery": {"matbus-nats", "nats://n:4222", ""}, "worker": {"matbus-nats-worker", "nats://n:4222", "matbus-nats-worker"}}},
		{"existing Secrets", []string{"--set", "nats.credentials=SHARED,nats.worker.existingSecret=w,nats.worker.existingSecretHasCredentials=true,nats.discovery.existingSecret=d"},
			map[string]ident{"discovery": {"d", "", ""}, "worker": {"w", "", "w"}}},
	} {
		objs := render(t, "matbus", tc.args...)
		for part, want := range tc.want {
			d := find(t, objs, "Deployment", "-"+part)
			c := container(t, d)
			var urlSecret string
			creds := false
			for _, e := range c.env {
				switch e["name"] {
				case "MATBUS_NATS_URL":
					urlSecret, _, _ = unstructured.NestedString(e, "valueFrom", "secretKeyRef", "name")
				case "MATBUS_NATS_CREDS":
					creds = true
				}
			}
			if urlSecret != want.secret {
				t.Errorf("%s: %s takes MATBUS_NATS_URL from Secret %q, want %q", tc.name, part, urlSecret, want.secret)
			}
			vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
			mounted := ""
			for _, v := range vols {
				if vm := v.(map[string]any); vm["name"] == "nats-credentials" {
					mounted, _, _ = unstructured.NestedString(vm, "secret", "secretName")
				}
			}
			if mounted != want.creds || creds != (want.creds != "") {
				t.Errorf("%s: %s mounts credentials from %q (MATBUS_NATS_CREDS %v), want %q", tc.name, part, mounted, creds, want.creds)
			}
			var rendered *unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "Secret" && o.GetName() == want.secret {
					rendered = o
				}
			}
			if (rendered != nil) != (want.url != "") {
				t.Errorf("%s: Secret %s rendered %v, want %v", tc.name, want.secret, rendered != nil, want.url != "")
				continue
			}
			if rendered != nil {
				if u, _, _ := unstructured.NestedString(rendered.Object, "stringData", "url"); u != want.url {
					t.Errorf("%s: Secret %s url %q, want %q", tc.name, want.secret, u, want.url)
				}
			}
		}
	}
}
