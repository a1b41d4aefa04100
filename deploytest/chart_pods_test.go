package deploytest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/matbus/matbus/plan"
)

// podSpecs returns every PodSpec in obj, found by shape (a map with a
// "containers" list) at any depth, each with its field path: a Pod's spec,
// a Deployment's spec.template.spec, a CronJob's
// spec.jobTemplate.spec.template.spec, and any kind added later.
func podSpecs(obj map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch x := v.(type) {
		case map[string]any:
			if _, ok := x["containers"].([]any); ok {
				out[path] = x
			}
			for k, c := range x {
				walk(c, path+"."+k)
			}
		case []any:
			for i, c := range x {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(obj, "")
	return out
}

// workloadKinds are the kinds that make pods; each must hold a PodSpec.
var workloadKinds = []string{"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}

// TestChartPodsDisableServiceLinks: every PodSpec of every rendered object
// (the Deployments, the helm test Pod, any pod template added later) sets
// enableServiceLinks: false. With it on, the kubelet puts seven variables
// per Service of the namespace into every container, and with the 13,500 to
// 17,750 BMC Services of a large fleet container start fails with
// "argument list too long".
func TestChartPodsDisableServiceLinks(t *testing.T) {
	sets := append(slices.Clone(valueSets), struct {
		name string
		args []string
	}{"MAT CA from a ConfigMap", []string{"--set", "worker.insecureSkipVerify=false,worker.matCA.configMap=ca"}})
	for _, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			found := 0
			for _, o := range render(t, "matbus", vs.args...) {
				what := o.GetKind() + "/" + o.GetName()
				specs := podSpecs(o.Object)
				if slices.Contains(workloadKinds, o.GetKind()) && len(specs) == 0 {
					t.Errorf("%s: no PodSpec found", what)
				}
				for path, spec := range specs {
					found++
					if v, ok := spec["enableServiceLinks"]; !ok || v != false {
						t.Errorf("%s %s: enableServiceLinks is %v (set: %v), want false", what, path, v, ok)
					}
				}
			}
			// Both Deployments and the helm test Pod.
			if found < 3 {
				t.Errorf("found %d PodSpecs, want at least 3", found)
			}
		})
	}
}

// TestChartMatCA: worker.matCA mounts the PEM bundle from a Secret or a
// ConfigMap read-only into the worker pods only and passes its path as
// --mat-ca-file; without it there is neither flag nor volume.
func TestChartMatCA(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		source string // "secret", "configMap", or "" for none
		object string // name of the Secret or ConfigMap
		key    string
	}{
		{"default", nil, "", "", ""},
		{"secret", []string{"--set", "worker.insecureSkipVerify=false,worker.matCA.secret=mat-ca"}, "secret", "mat-ca", "ca.crt"},
		{"configMap with a key", []string{"--set", "worker.insecureSkipVerify=false,worker.matCA.configMap=bundle,worker.matCA.key=mat.pem"}, "configMap", "bundle", "mat.pem"},
		{"all-features", []string{"-f", chartDir + "/ci/all-features-values.yaml"}, "secret", "mat-ca", "ca.crt"},
		{"hpa", []string{"-f", chartDir + "/ci/hpa-values.yaml"}, "configMap", "mat-ca-bundle", "bundle.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "matbus", tc.args...)
			for _, comp := range []string{"-worker", "-discovery"} {
				d := find(t, objs, "Deployment", comp)
				file, hasFlag := flagValue(container(t, d).args, "mat-ca-file")
				vol := namedItem(t, d, "volumes", "mat-ca")
				mount := namedItem(t, d, "containers[0].volumeMounts", "mat-ca")
				if comp == "-discovery" || tc.source == "" {
					if hasFlag || vol != nil || mount != nil {
						t.Errorf("%s: --mat-ca-file %q, volume %v, mount %v; want none", comp, file, vol, mount)
					}
					continue
				}
				if vol == nil || mount == nil {
					t.Fatalf("%s: volume %v, mount %v; want both", comp, vol, mount)
				}
				if mount["readOnly"] != true {
					t.Errorf("mount %v is not read-only", mount)
				}
				nameField := map[string]string{"secret": "secretName", "configMap": "name"}[tc.source]
				src, _ := vol[tc.source].(map[string]any)
				items, _, _ := unstructured.NestedSlice(vol, tc.source, "items")
				if src == nil || src[nameField] != tc.object || len(items) != 1 {
					t.Fatalf("volume %v: want %s %q with one item", vol, tc.source, tc.object)
				}
				item := items[0].(map[string]any)
				if want := fmt.Sprint(mount["mountPath"]) + "/" + fmt.Sprint(item["path"]); item["key"] != tc.key || file != want {
					t.Errorf("--mat-ca-file %q (has %v), item %v: want key %q at %s", file, hasFlag, item, tc.key, want)
				}
			}
		})
	}
}

// namedItem returns the element named name of the list at path (dot
// separated, "containers[0]" for the first container) under the
// Deployment's pod spec, or nil.
func namedItem(t *testing.T, dep *unstructured.Unstructured, path, name string) map[string]any {
	t.Helper()
	var cur any = dep.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"]
	for _, p := range strings.Split(path, ".") {
		field, first := strings.CutSuffix(p, "[0]")
		m, _ := cur.(map[string]any)
		cur = m[field]
		if first {
			l, _ := cur.([]any)
			if len(l) == 0 {
				return nil
			}
			cur = l[0]
		}
	}
	l, _ := cur.([]any)
	for _, e := range l {
		if m, _ := e.(map[string]any); m["name"] == name {
			return m
		}
	}
	return nil
}

// TestChartOldControllerDefaults: the chart's worker defaults are the
// binary's, which are the old controller's: target selector and managed-by
// value, so a default install adopts the old controller's Services.
func TestChartOldControllerDefaults(t *testing.T) {
	args := container(t, find(t, render(t, "matbus"), "Deployment", "-worker")).args
	for flag, want := range map[string]string{
		"target-selector": plan.DefaultTargetSelector,
		"managed-by":      plan.DefaultManagedBy,
	} {
		if got, _ := flagValue(args, flag); got != want {
			t.Errorf("worker --%s=%q, want the old controller's %q", flag, got, want)
		}
	}
	if plan.DefaultTargetSelector != "app.kubernetes.io/name=nico-machine-a-tron" {
		t.Errorf("plan.DefaultTargetSelector %q is no longer the old controller's", plan.DefaultTargetSelector)
	}
}
