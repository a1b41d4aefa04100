package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// rulesTest is the promtool unit test file of the chart's alerts.
const rulesTest = "deploy/prometheus/rules_test.yaml"

// TestAlertsAndDashboardSelectExportedSeries runs the chart's discovery and
// worker containers (as processes, as TestChartRBACConverges does) through
// what makes every series of the alerts and the dashboard appear: a MAT that
// converges, a MAT that never answers (fetch errors, out of rotation, missed
// intervals) and a MAT restart (held deletes). It scrapes both processes'
// /metrics and checks every selector of the rendered PrometheusRule, of the
// rendered dashboard and of the promtool test's input series against them:
//
//   - the metric is exported, with the type its use needs: a counter under
//     rate(), irate(), increase() or resets(), a histogram's _bucket under
//     histogram_quantile(), a gauge anywhere else;
//   - every label a selector matches on, an aggregation groups by or a
//     vector match joins on is on the series as Prometheus stores them:
//     matbus's own labels plus the target labels of the chart's
//     ServiceMonitor; an equality matcher's value occurs;
//   - no matbus label is a target label (Prometheus would rename it to
//     exported_<name>, and a query for it would read the target's);
//   - the promtool test's series carry exactly matbus's labels of that metric
//     (plus target labels), so the alerts are tested on the series matbus
//     really exports.
func TestAlertsAndDashboardSelectExportedSeries(t *testing.T) {
	c := requireCluster(t)
	admin := kubernetes.NewForConfigOrDie(adminConfig(c))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(t, admin, "alerts")

	nats, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nats.Shutdown()
	objs := render(t, ns,
		"--set", "nats.url="+nats.ClientURL(),
		"--set", "worker.serviceCIDR[0]="+c.ServiceCIDR,
		"--set", "worker.insecureSkipVerify=true", // matsim's self-signed certificate
		"--set", "discovery.syncInterval=1s",
		"--set", "discovery.probeMaxInterval=2s",
		"--set", "discovery.sourceList.addr=", // no fixed port
		"--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.prometheusRule.enabled=true",
		"--set", "metrics.grafanaDashboard.enabled=true")
	scrape := chartScrape(t, objs)
	p := parser.NewParser(parser.Options{})
	var uses []selectorUse
	for _, r := range renderedRules(t, p, objs) {
		uses = append(uses, selectorUses(t, p, "alert "+r.Alert, r.Expr)...)
	}
	uses = append(uses, dashboardUses(t, p, objs)...)

	// mat-a answers (a TLS simulator behind a MAT Service, owned by a
	// Deployment as in a cluster); mat-b's URL has nothing listening.
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 1, PowerShelves: 1, IPMI: true,
		BMCSubnet: "10.97.2.0/24", Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := matsim.New(matsim.Options{Fleet: fleet, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	simURL, err := sim.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, matDeployment(ns, "mat-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, u := range map[string]string{"mat-a": simURL, "mat-b": closedHTTPS(t)} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name + discovery.OwnerSuffix, Namespace: ns,
				Labels:      map[string]string{"nvidia-infra-controller/mat-service": "true"},
				Annotations: map[string]string{discovery.URLAnnotation: u}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "bmc-mock", Port: 1266}}},
		}
		if _, err := admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// One pod of each Deployment, with the admin's credentials (the Role is
	// TestChartRBACConverges's concern).
	secret := find(t, objs, "Secret", "-nats")
	var procs []*proc
	defer func() {
		for _, pr := range procs {
			pr.stop()
		}
		if t.Failed() {
			for _, pr := range procs {
				t.Logf("--- %s (last lines)\n%s", pr.name, lastLines(pr.out.Bytes(), 30))
			}
		}
	}()
	for _, comp := range []string{"discovery", "worker"} {
		d := find(t, objs, "Deployment", "-"+comp)
		procs = append(procs, startPod(t, d, secret, d.GetName()+"-0", c.Kubeconfig))
	}
	for _, pr := range procs {
		pr.waitReady(t, ctx)
	}
	managed := func() int {
		l, err := admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: plan.LabelManagedBy + "=" + plan.DefaultManagedBy})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	waitFor(t, ctx, "mat-a's Services", func() bool { return managed() == sim.BMCs()+sim.Fleet().NVOSIPs() })

	// A MAT restart: an empty inventory under a new epoch holds the deletes.
	if err := sim.Restart("", &matsim.Fleet{InventoryID: fleet.InventoryID}); err != nil {
		t.Fatal(err)
	}

	// Every selector's metric is exported once its event happened: scrape
	// until none is missing (a minute at most), then check everything on
	// the last scrape.
	var fams map[string]*scrapedFamily
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		fams = scrapeProcs(t, procs, scrape.path)
		missing := map[string]bool{}
		for _, u := range uses {
			if _, _, ok := familyOf(fams, u.name); !ok {
				missing[u.name] = true
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}

	var errs []string
	for name, f := range fams {
		for l := range f.labels {
			if scrape.target[l] && !scrape.honorLabels {
				errs = append(errs, fmt.Sprintf("%s has label %q, which the scrape sets on the target: Prometheus stores matbus's as exported_%s", name, l, l))
			}
		}
	}
	for _, u := range uses {
		errs = append(errs, u.check(fams, scrape)...)
	}
	errs = append(errs, checkTestSeries(t, p, fams, scrape)...)
	sort.Strings(errs)
	if errs = slices.Compact(errs); len(errs) > 0 {
		t.Errorf("%d problems:\n  %s", len(errs), strings.Join(errs, "\n  "))
	}
	names := map[string]bool{}
	for _, u := range uses {
		names[u.name] = true
	}
	t.Logf("%d selectors of %d metrics checked against %d families scraped from %d processes", len(uses), len(names), len(fams), len(procs))
}

// closedHTTPS returns an https URL on which nothing listens.
func closedHTTPS(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "https://" + l.Addr().String()
	_ = l.Close()
	return u
}

// scrapeConfig is what a Prometheus that scrapes the chart's pods through
// its ServiceMonitor stores besides matbus's own labels.
type scrapeConfig struct {
	path string
	// target: the labels prometheus-operator gives every target of a
	// ServiceMonitor (a PodMonitor's get the same but service), and the pod
	// labels its podTargetLabels copy, with Prometheus's label-name
	// sanitizing (app.kubernetes.io/component: app_kubernetes_io_component).
	target map[string]bool
	// honorLabels: on a clash, the scraped label wins (else it is renamed
	// exported_<name> and the target's stays).
	honorLabels bool
}

func chartScrape(t *testing.T, objs []*unstructured.Unstructured) scrapeConfig {
	t.Helper()
	sm := find(t, objs, "ServiceMonitor", "matbus")
	sc := scrapeConfig{target: map[string]bool{}}
	for _, l := range []string{"job", "instance", "namespace", "service", "pod", "container", "endpoint"} {
		sc.target[l] = true
	}
	ptl, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "podTargetLabels")
	for _, l := range ptl {
		sc.target[invalidLabelChars.ReplaceAllString(l, "_")] = true
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints: %v", eps)
	}
	ep := eps[0].(map[string]any)
	sc.path, _ = ep["path"].(string)
	sc.honorLabels, _ = ep["honorLabels"].(bool)
	return sc
}

var invalidLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// renderedRules parses the rendered PrometheusRule's spec with Prometheus's
// rule parser (YAML, PromQL, annotation templates).
func renderedRules(t *testing.T, p parser.Parser, objs []*unstructured.Unstructured) []rulefmt.Rule {
	t.Helper()
	spec, _, _ := unstructured.NestedMap(find(t, objs, "PrometheusRule", "matbus").Object, "spec")
	b, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("PrometheusRule: %v", err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatal("PrometheusRule: no rule groups")
	}
	var out []rulefmt.Rule
	for _, g := range groups.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// dashboardUses returns the selectors of every query and variable of the
// rendered dashboard ConfigMap.
func dashboardUses(t *testing.T, p parser.Parser, objs []*unstructured.Unstructured) []selectorUse {
	t.Helper()
	data, _, _ := unstructured.NestedStringMap(find(t, objs, "ConfigMap", "-dashboard").Object, "data")
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name       string
				Definition string
			}
		}
	}
	if err := json.Unmarshal([]byte(data["matbus.json"]), &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	// Grafana's variables, as Grafana substitutes them before querying.
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m")
	var out []selectorUse
	queries := 0
	for _, panel := range dash.Panels {
		for _, tg := range panel.Targets {
			queries++
			out = append(out, selectorUses(t, p, "panel "+panel.Title, vars.Replace(tg.Expr))...)
		}
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries", queries)
	}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
	for _, v := range dash.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: unexpected query %q", v.Name, v.Definition)
			continue
		}
		out = append(out, selectorUse{where: "variable " + v.Name, name: m[1], labels: []string{m[2]}, want: "gauge"})
	}
	return out
}

// selectorUse is one metric selector of a query and what the query needs
// of its series.
type selectorUse struct {
	where    string
	name     string
	matchers []*labels.Matcher // without the name's
	labels   []string          // grouped by or joined on
	want     string            // "counter", "gauge" or "histogram" (a _bucket series)
	fn       string            // the function that wants that type, for messages
}

// Functions of a range vector whose input must be a counter.
var counterFuncs = map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}

// selectorUses returns every metric selector of expr with what its place
// in expr needs; it fails t when expr does not parse.
func selectorUses(t *testing.T, p parser.Parser, where, expr string) []selectorUse {
	t.Helper()
	e, err := p.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n  %s", where, err, expr)
		return nil
	}
	var out []selectorUse
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		u := selectorUse{where: where, name: vs.Name, want: "gauge", fn: "an instant selector"}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				u.name = m.Value
			} else {
				u.matchers = append(u.matchers, m)
			}
		}
		if len(path) >= 2 {
			if _, ok := path[len(path)-1].(*parser.MatrixSelector); ok {
				if call, ok := path[len(path)-2].(*parser.Call); ok {
					u.fn = call.Func.Name + "()"
					if counterFuncs[call.Func.Name] {
						u.want = "counter"
					}
				}
			}
		}
		for _, a := range path {
			switch a := a.(type) {
			case *parser.AggregateExpr:
				if !a.Without {
					u.labels = append(u.labels, a.Grouping...)
				}
			case *parser.BinaryExpr:
				if a.VectorMatching != nil && a.VectorMatching.On {
					u.labels = append(u.labels, a.VectorMatching.MatchingLabels...)
					u.labels = append(u.labels, a.VectorMatching.Include...)
				}
			case *parser.Call:
				if a.Func.Name == "histogram_quantile" {
					u.want, u.fn = "histogram", "histogram_quantile()"
				}
			}
		}
		out = append(out, u)
		return nil
	})
	return out
}

// check returns what is wrong with u on the scraped families.
func (u selectorUse) check(fams map[string]*scrapedFamily, sc scrapeConfig) []string {
	f, suffix, ok := familyOf(fams, u.name)
	if !ok {
		return []string{fmt.Sprintf("%s: %s is not exported", u.where, u.name)}
	}
	var errs []string
	typ := strings.ToLower(f.typ.String())
	switch {
	case u.want == "histogram" && (f.typ != dto.MetricType_HISTOGRAM || suffix != "_bucket"):
		errs = append(errs, fmt.Sprintf("%s: %s wants a histogram's _bucket series; %s is a %s", u.where, u.fn, u.name, typ))
	case u.want == "counter" && f.typ != dto.MetricType_COUNTER && suffix == "": // a histogram's series are counters
		errs = append(errs, fmt.Sprintf("%s: %s wants a counter; %s is a %s", u.where, u.fn, u.name, typ))
	case u.want == "gauge" && f.typ != dto.MetricType_GAUGE:
		errs = append(errs, fmt.Sprintf("%s: %s wants a gauge; %s is a %s", u.where, u.fn, u.name, typ))
	}
	has := func(l string) bool { return sc.target[l] || f.labels[l] != nil || l == "le" && suffix == "_bucket" }
	for _, l := range u.labels {
		if !has(l) {
			errs = append(errs, fmt.Sprintf("%s: %s has no label %q (it has %s)", u.where, u.name, l, f.labelList(sc)))
		}
	}
	for _, m := range u.matchers {
		switch {
		case !has(m.Name):
			errs = append(errs, fmt.Sprintf("%s: %s has no label %q (it has %s)", u.where, u.name, m.Name, f.labelList(sc)))
		case m.Type == labels.MatchEqual && f.labels[m.Name] != nil && !f.labels[m.Name][m.Value]:
			errs = append(errs, fmt.Sprintf("%s: no %s series has %s=%q (seen: %v)", u.where, u.name, m.Name, m.Value, sortedKeys(f.labels[m.Name])))
		}
	}
	return errs
}

// scrapedFamily is one metric family as the processes export it.
type scrapedFamily struct {
	typ    dto.MetricType
	labels map[string]map[string]bool // matbus's labels and the values seen
}

func (f *scrapedFamily) labelList(sc scrapeConfig) string {
	return fmt.Sprintf("%v and the target's %v", sortedKeys(f.labels), sortedKeys(sc.target))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// familyOf returns the family that exports the series name: itself, or
// the histogram or summary that name's _bucket, _sum or _count belongs to.
func familyOf(fams map[string]*scrapedFamily, name string) (*scrapedFamily, string, bool) {
	if f, ok := fams[name]; ok {
		return f, "", true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if f, ok := fams[base]; ok && (f.typ == dto.MetricType_HISTOGRAM || f.typ == dto.MetricType_SUMMARY && suf != "_bucket") {
				return f, suf, true
			}
		}
	}
	return nil, "", false
}

// scrapeProcs reads every process's metrics and merges them by family; a
// family whose type differs between processes fails t.
func scrapeProcs(t *testing.T, procs []*proc, path string) map[string]*scrapedFamily {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	fams := map[string]*scrapedFamily{}
	for _, pr := range procs {
		u, err := url.Parse(pr.readyURL)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = path
		resp, err := hc.Get(u.String())
		if err != nil {
			t.Fatalf("%s: %v", pr.name, err)
		}
		tp := expfmt.NewTextParser(model.UTF8Validation)
		parsed, err := tp.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: %v", pr.name, path, err)
		}
		for name, mf := range parsed {
			f := fams[name]
			if f == nil {
				f = &scrapedFamily{typ: mf.GetType(), labels: map[string]map[string]bool{}}
				fams[name] = f
			} else if f.typ != mf.GetType() {
				t.Fatalf("%s is a %v on %s and a %v elsewhere", name, mf.GetType(), pr.name, f.typ)
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if f.labels[lp.GetName()] == nil {
						f.labels[lp.GetName()] = map[string]bool{}
					}
					f.labels[lp.GetName()][lp.GetValue()] = true
				}
			}
		}
	}
	return fams
}

// promtoolTests is the part of a promtool rules test file this package reads.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name        string `json:"name"`
		InputSeries []struct {
			Series string `json:"series"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func readRulesTest(t *testing.T) promtoolTests {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rulesTest))
	if err != nil {
		t.Fatal(err)
	}
	var pt promtoolTests
	if err := yaml.Unmarshal(b, &pt); err != nil {
		t.Fatalf("%s: %v", rulesTest, err)
	}
	return pt
}

// checkTestSeries returns the promtool test's input series whose metric
// matbus does not export, or whose labels are not the ones it exports.
func checkTestSeries(t *testing.T, p parser.Parser, fams map[string]*scrapedFamily, sc scrapeConfig) []string {
	t.Helper()
	var errs []string
	for _, tg := range readRulesTest(t).Tests {
		for _, in := range tg.InputSeries {
			ls, err := p.ParseMetric(in.Series)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: series %s: %v", rulesTest, in.Series, err))
				continue
			}
			name := ls.Get(model.MetricNameLabel)
			f, suffix, ok := familyOf(fams, name)
			if !ok {
				errs = append(errs, fmt.Sprintf("%s: test %s: %s is not exported", rulesTest, tg.Name, name))
				continue
			}
			got := map[string]bool{}
			ls.Range(func(l labels.Label) {
				if l.Name != model.MetricNameLabel && !sc.target[l.Name] {
					got[l.Name] = true
				}
			})
			want := map[string]bool{}
			for l := range f.labels {
				want[l] = true
			}
			if suffix == "_bucket" {
				want["le"] = true
			}
			if !equalKeys(got, want) {
				errs = append(errs, fmt.Sprintf("%s: test %s: %s has labels %v besides the target's; matbus exports %v", rulesTest, tg.Name, name, sortedKeys(got), sortedKeys(want)))
			}
		}
	}
	return errs
}

func equalKeys(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// TestAlertsEachTested: the promtool test covers every alert of the
// chart's rules, each with a case where it fires and one where it must not,
// and reads the rule file the chart carries.
func TestAlertsEachTested(t *testing.T) {
	pt := readRulesTest(t)
	want := filepath.Join(root, chartDir, "files", "prometheus-rules.yaml")
	if len(pt.RuleFiles) != 1 || filepath.Join(root, filepath.Dir(rulesTest), pt.RuleFiles[0]) != want {
		t.Errorf("%s: rule_files %v, want the chart's %s", rulesTest, pt.RuleFiles, want)
	}
	b, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("prometheus-rules.yaml: %v", errs)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tg := range pt.Tests {
		for _, c := range tg.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname]++
			} else {
				quiet[c.Alertname]++
			}
		}
	}
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if fires[r.Alert] == 0 || quiet[r.Alert] == 0 {
				t.Errorf("alert %s: %d cases where it fires, %d where it must not, in %s; want at least one of each", r.Alert, fires[r.Alert], quiet[r.Alert], rulesTest)
			}
			delete(fires, r.Alert)
			delete(quiet, r.Alert)
		}
	}
	for a := range fires {
		t.Errorf("%s tests %s, which is no alert of the chart", rulesTest, a)
	}
	for a := range quiet {
		t.Errorf("%s tests %s, which is no alert of the chart", rulesTest, a)
	}
	if alerts < 10 {
		t.Errorf("%d alerts in prometheus-rules.yaml", alerts)
	}
}

// TestPromtoolIsGoModsPrometheus: promtool (tools/promtool) is built from
// the Prometheus version whose parsers the tests above use.
func TestPromtoolIsGoModsPrometheus(t *testing.T) {
	const mod = "github.com/prometheus/prometheus"
	if a, b := moduleVersion(t, "go.mod", mod), moduleVersion(t, "tools/promtool/go.mod", mod); a != b {
		t.Errorf("tools/promtool builds promtool from %s %s; go.mod requires %s", mod, b, a)
	}
}
