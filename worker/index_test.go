package worker

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/plan"
)

func TestInstanceIndex(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byInstance: instanceIndex})
	svc := func(name string, lbl map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: lbl}}
	}
	for _, s := range []*corev1.Service{
		svc("a1", map[string]string{plan.LabelInstance: plan.LabelValue("ns/mat-a")}),
		svc("a2", map[string]string{plan.LabelInstance: plan.LabelValue("ns/mat-a")}),
		svc("b1", map[string]string{plan.LabelInstance: plan.LabelValue("ns/mat-b")}),
		svc("old", map[string]string{"app": "x"}),
		svc("empty", map[string]string{plan.LabelInstance: ""}),
	} {
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	w := &Worker{byInst: idx}
	names := func(value string) map[string]bool {
		got, err := w.indexed(value)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, s := range got {
			out[s.Name] = true
		}
		return out
	}
	if got := names(plan.LabelValue("ns/mat-a")); len(got) != 2 || !got["a1"] || !got["a2"] {
		t.Errorf("instance a: %v, want a1 a2", got)
	}
	if got := names(noInstanceLabel); len(got) != 1 || !got["old"] {
		t.Errorf("without the label: %v, want old (an empty label value is a label)", got)
	}
	if got := names(""); len(got) != 1 || !got["empty"] {
		t.Errorf("empty label value: %v, want empty", got)
	}
	if err := idx.Delete(svc("a1", map[string]string{plan.LabelInstance: plan.LabelValue("ns/mat-a")})); err != nil {
		t.Fatal(err)
	}
	if got := names(plan.LabelValue("ns/mat-a")); len(got) != 1 || !got["a2"] {
		t.Errorf("after a delete: %v, want a2", got)
	}
	if _, err := (&Worker{}).indexed("x"); err == nil {
		t.Error("indexed without an informer: no error")
	}
}
