package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

const chartFiles = "../../deploy/helm/matbus/files"

// exportedNames returns the name of every metric family the worker and
// discovery processes register, built as runWorker and runDiscovery build
// their registries (descriptors, so families without samples count too).
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	bus, err := events.New(&nats.Conn{}, events.Config{Namespace: "team-a"}, log) // no connection needed
	if err != nil {
		t.Fatal(err)
	}
	rep := events.NewReporter(bus, log, "t", 0)
	ready := func() error { return nil }

	wreg := health.NewRegistry(version, health.Revision(commit))
	health.CountKubeRequests(&rest.Config{}, wreg)
	m, err := worker.NewMetrics(wreg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Plan: plan.Options{Namespace: "team-a"}, Metrics: m}, bus, nil, nil, rep, log)
	if err != nil {
		t.Fatal(err)
	}
	health.WorkerMetrics(wreg, w)
	health.EventMetrics(wreg, bus, rep)
	wreg.MustRegister(health.NewConsumerCollector(bus))
	health.ReadyMetric(wreg, "worker", ready)

	var leading atomic.Bool
	var sched atomic.Pointer[discovery.Scheduler]
	var cur atomic.Pointer[health.Lead]
	dreg := health.DiscoveryRegistry(version, health.Revision(commit), bus, rep, &leading, &sched, &cur, nil)
	health.ReadyMetric(dreg, "discovery", ready)

	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for _, reg := range []*prometheus.Registry{wreg, dreg} {
		ch := make(chan *prometheus.Desc)
		go func() { reg.Describe(ch); close(ch) }()
		for d := range ch {
			if mm := fq.FindStringSubmatch(d.String()); mm != nil {
				names[mm[1]] = true
			}
		}
	}
	return names
}

// usedNames returns the metric names expr selects; it fails t when expr
// does not parse.
func usedNames(t *testing.T, p parser.Parser, where, expr string) []string {
	t.Helper()
	e, err := p.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n  %s", where, err, expr)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			out = append(out, name)
		}
		return nil
	})
	return out
}

// exported reports whether a selected name is a registered family, or a
// histogram's _bucket, _sum or _count series.
func exported(names map[string]bool, name string) bool {
	if names[name] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && names[base] {
			return true
		}
	}
	return false
}

// TestAlertsAndDashboardUseExportedMetrics: the chart's alerts parse with
// Prometheus's own rule parser (rulefmt: YAML, PromQL and annotation
// templates), the dashboard's queries parse as PromQL, and every metric
// either selects is one the code exports.
func TestAlertsAndDashboardUseExportedMetrics(t *testing.T) {
	names := exportedNames(t)
	for _, must := range []string{"go_goroutines", "process_cpu_seconds_total", "matbus_build_info", "matbus_worker_jobs_total",
		"matbus_instance_last_sync_success_timestamp_seconds", "matbus_consumer_pending_messages", "matbus_discovery_leader",
		"matbus_informer_healthy", "matbus_informer_failures_total", "matbus_worker_held_deletes",
		"matbus_worker_delete_hold_until_timestamp_seconds", "matbus_worker_delete_holds_total"} {
		if !names[must] {
			t.Errorf("%s is not registered", must)
		}
	}
	p := parser.NewParser(parser.Options{})
	used := map[string][]string{} // metric -> where

	b, err := os.ReadFile(filepath.Join(chartFiles, "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("prometheus-rules.yaml: %v", err)
	}
	if groups == nil {
		t.Fatal("no rule groups")
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, n := range usedNames(t, p, "alert "+r.Alert, r.Expr) {
				used[n] = append(used[n], "alert "+r.Alert)
			}
		}
	}
	sort.Strings(alerts)
	for _, want := range []string{"MatbusConsumerLagGrowing", "MatbusErrorEventsRising", "MatbusInstanceNotSynced",
		"MatbusNoDiscoveryLeader", "MatbusWorkersNotReady", "MatbusInformerFailing", "MatbusDeletesHeld", "MatbusDeleteHoldOverdue"} {
		if _, ok := setOf(alerts)[want]; !ok {
			t.Errorf("alert %s missing; have %v", want, alerts)
		}
	}

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
	b, err = os.ReadFile(filepath.Join(chartFiles, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	// Grafana's variables, as Grafana substitutes them before querying.
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m")
	queries := 0
	for _, panel := range dash.Panels {
		for _, tg := range panel.Targets {
			queries++
			for _, n := range usedNames(t, p, "panel "+panel.Title, vars.Replace(tg.Expr)) {
				used[n] = append(used[n], "panel "+panel.Title)
			}
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if v.Definition == "" {
			continue
		}
		mm := labelValues.FindStringSubmatch(v.Definition)
		if mm == nil {
			t.Errorf("variable %s: unexpected query %q", v.Name, v.Definition)
			continue
		}
		used[mm[1]] = append(used[mm[1]], "variable "+v.Name)
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries", queries)
	}
	for n, where := range used {
		if !exported(names, n) {
			t.Errorf("%s (used by %s) is not exported by matbus", n, strings.Join(where, ", "))
		}
	}
}

func setOf(s []string) map[string]struct{} {
	m := make(map[string]struct{}, len(s))
	for _, v := range s {
		m[v] = struct{}{}
	}
	return m
}
