package plan

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestExisting: the rule by which a sync and `matbus plan` choose the
// Services Diff sees and the foreign IPs that block them, over a
// ListIndex, case by case.
func TestExisting(t *testing.T) {
	const key, other = "ns.mat-a", "ns.mat-b"
	a, b := LabelValue(key), LabelValue(other)
	svc := func(name, clusterIP string, labels, ann map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels, Annotations: ann},
			Spec: corev1.ServiceSpec{ClusterIP: clusterIP}}
	}
	ours := func(inst string) map[string]string {
		l := map[string]string{LabelManagedBy: DefaultManagedBy}
		if inst != NoInstance {
			l[LabelInstance] = inst
		}
		return l
	}
	foreign := map[string]string{LabelManagedBy: "someone-else", LabelInstance: a}
	bmc := func(ip string) map[string]string { return map[string]string{AnnotationBMCIP: ip} }
	desired := []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "want-1"}}, {ObjectMeta: metav1.ObjectMeta{Name: "want-2"}}}

	tests := []struct {
		name        string
		mode        IPMode
		svcs        []*corev1.Service
		wantNames   []string
		wantForeign map[string]string
	}{
		{name: "the instance's own, sorted", svcs: []*corev1.Service{
			svc("z-own", "", ours(a), nil), svc("a-own", "", ours(a), nil), svc("b-1", "", ours(b), nil)},
			wantNames: []string{"a-own", "z-own"}},
		{name: "the old controller's are adopted candidates, whatever their name", svcs: []*corev1.Service{
			svc("old-1", "", ours(NoInstance), nil), svc("old-2", "", ours(NoInstance), nil)},
			wantNames: []string{"old-1", "old-2"}},
		{name: "an empty instance label is a label: neither the old controller's nor mine", svcs: []*corev1.Service{
			svc("empty", "", ours(""), nil)}},
		{name: "another managed-by value is never mine, even with my instance label", svcs: []*corev1.Service{
			svc("foreign-own", "", foreign, nil),
			svc("foreign-old", "", map[string]string{LabelManagedBy: "someone-else"}, nil)}},
		{name: "a desired name held by another instance or a foreign Service is seen", svcs: []*corev1.Service{
			svc("want-1", "", ours(b), nil), svc("want-2", "", map[string]string{"app": "x"}, nil), svc("b-2", "", ours(b), nil)},
			wantNames: []string{"want-1", "want-2"}},
		{name: "a desired name of my own is listed once", svcs: []*corev1.Service{
			svc("want-1", "", ours(a), nil)},
			wantNames: []string{"want-1"}},
		{name: "cluster-ip mode looks at no IP", mode: IPModeClusterIP, svcs: []*corev1.Service{
			svc("a-own", "10.0.0.7", ours(a), bmc("10.1.0.1")), svc("b-1", "10.0.0.8", ours(b), bmc("10.0.0.7"))},
			wantNames: []string{"a-own"}},
		{name: "external-ip: my cluster IP published by another instance", mode: IPModeExternalIP, svcs: []*corev1.Service{
			svc("a-own", "10.0.0.7", ours(a), bmc("10.1.0.1")), svc("b-1", "10.0.0.8", ours(b), bmc("10.0.0.7"))},
			wantNames: []string{"a-own"}, wantForeign: map[string]string{"10.0.0.7": `Service b-1 of instance "` + b + `"`}},
		{name: "external-ip: duplicate publishers, the first by name is named", mode: IPModeExternalIP, svcs: []*corev1.Service{
			svc("a-own", "10.0.0.7", ours(a), bmc("10.1.0.1")),
			svc("b-9", "10.0.0.9", ours(b), bmc("10.0.0.7")), svc("b-3", "10.0.0.8", ours(b), bmc("10.0.0.7"))},
			wantNames: []string{"a-own"}, wantForeign: map[string]string{"10.0.0.7": `Service b-3 of instance "` + b + `"`}},
		{name: "external-ip: publishers of my instance, the old controller's and foreign ones do not block",
			mode: IPModeExternalIP, svcs: []*corev1.Service{
				svc("a-own", "10.0.0.7", ours(a), bmc("10.1.0.1")), svc("a-two", "10.0.0.8", ours(a), bmc("10.0.0.7")),
				svc("old", "10.0.0.9", ours(NoInstance), bmc("10.0.0.7")),
				svc("foreign", "10.0.0.10", map[string]string{LabelManagedBy: "someone-else", LabelInstance: b}, bmc("10.0.0.7"))},
			wantNames: []string{"a-own", "a-two", "old"}},
		{name: "external-ip: a cluster IP that is the Service's own IP is not foreign", mode: IPModeExternalIP, svcs: []*corev1.Service{
			svc("a-own", "10.0.0.7", ours(a), bmc("10.0.0.7")), svc("b-1", "10.0.0.8", ours(b), bmc("10.0.0.7"))},
			wantNames: []string{"a-own"}},
		{name: "external-ip: a desired name held by another instance counts among mine for its IP", mode: IPModeExternalIP,
			svcs: []*corev1.Service{
				svc("want-1", "10.0.0.7", ours(b), bmc("10.1.0.1")), svc("c-1", "10.0.0.8", ours("ns.mat-c"), bmc("10.0.0.7"))},
			wantNames: []string{"want-1"}, wantForeign: map[string]string{"10.0.0.7": `Service c-1 of instance "ns.mat-c"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{Namespace: "ns", IPMode: tc.mode}
			before := make([]*corev1.Service, len(tc.svcs))
			for i, s := range tc.svcs {
				before[i] = s.DeepCopy()
			}
			got, fips, err := Existing(NewListIndex(tc.svcs), key, desired, opts)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range got {
				names = append(names, s.Name)
			}
			if !slices.Equal(names, tc.wantNames) {
				t.Errorf("existing %v, want %v", names, tc.wantNames)
			}
			if !maps.Equal(fips, tc.wantForeign) {
				t.Errorf("foreign IPs %v, want %v", fips, tc.wantForeign)
			}
			for i, s := range tc.svcs {
				if s.String() != before[i].String() {
					t.Errorf("%s modified", s.Name)
				}
			}
		})
	}
}

// TestExistingManagedBy: Options.ManagedBy decides which Services are
// ours.
func TestExistingManagedBy(t *testing.T) {
	mine := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mine",
		Labels: map[string]string{LabelManagedBy: "matbus", LabelInstance: "ns.mat-a"}}}
	dflt := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "default",
		Labels: map[string]string{LabelManagedBy: DefaultManagedBy, LabelInstance: "ns.mat-a"}}}
	got, _, err := Existing(NewListIndex([]*corev1.Service{mine, dflt}), "ns.mat-a", nil, Options{ManagedBy: "matbus"})
	if err != nil || len(got) != 1 || got[0] != mine {
		t.Fatalf("existing %v, %v; want [mine]", got, err)
	}
}

// failingIndex is an Index that cannot be read.
type failingIndex struct{ *ListIndex }

func (failingIndex) ByInstance(string) ([]*corev1.Service, error) {
	return nil, errors.New("informer not running")
}

// TestExistingIndexError: an unreadable index is an error, not an empty
// list (which would plan creates of everything and deletes of nothing).
func TestExistingIndexError(t *testing.T) {
	got, fips, err := Existing(failingIndex{NewListIndex(nil)}, "ns.mat-a", nil, Options{IPMode: IPModeExternalIP})
	if err == nil || !strings.Contains(err.Error(), "informer not running") || got != nil || fips != nil {
		t.Fatalf("got %v %v %v, want the index's error", got, fips, err)
	}
}
