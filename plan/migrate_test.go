package plan

import (
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestDiffExternalIPMigration: in external-ip mode a Service whose
// clusterIP is its own BMC or NVOS IP, or another device's, is recreated
// with the IP in externalIPs and the clusterIP left to the API server;
// foreign labels and annotations survive. An allocated clusterIP no device
// publishes is left alone.
func TestDiffExternalIPMigration(t *testing.T) {
	ext := testOptions(IPModeExternalIP)
	d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), ext)
	const (
		hostA = "mat-bmc-host-922f3d9b-20b-4da64654" // BMC IP 10.96.64.10
		hostB = "mat-bmc-host-7ec7b7c3-126-c030b365" // BMC IP 10.96.64.13
	)
	var existing []*corev1.Service
	for i, s := range d.Services {
		e := existingFrom(t, d, s.Name, "u"+s.Name)
		e.Spec.ClusterIP = "10.0.9." + string(rune('1'+i%8))
		e.Spec.ClusterIPs = []string{e.Spec.ClusterIP}
		switch s.Name {
		case hostA: // allocated by the API server, equal to hostB's BMC IP
			e.Spec.ClusterIP, e.Spec.ClusterIPs = "10.96.64.13", []string{"10.96.64.13"}
		case nvosName: // the old controller's: its own IP as clusterIP, not in externalIPs
			e.Spec.ClusterIP, e.Spec.ClusterIPs, e.Spec.ExternalIPs = "10.98.0.20", []string{"10.98.0.20"}, nil
		case hostB:
			e.Spec.ClusterIP, e.Spec.ClusterIPs = "10.0.8.1", []string{"10.0.8.1"} // unrelated
		}
		e.Labels["example.com/team"] = "a"
		e.Annotations["example.com/note"] = "keep"
		existing = append(existing, e)
	}
	p := Diff(d, existing, ext)
	if got := summarize(p); !reflect.DeepEqual(got, pn(nil, nil, []string{hostA, nvosName}, nil, nil)) {
		t.Fatalf("plan %+v", got)
	}
	for _, r := range p.Recreate {
		ip := ServiceIP(r.New)
		if r.New.Spec.ClusterIP != "" || r.New.Spec.ClusterIPs != nil || !slices.Equal(r.New.Spec.ExternalIPs, []string{ip}) {
			t.Errorf("%s: spec %+v", r.New.Name, r.New.Spec)
		}
		if r.New.Labels["example.com/team"] != "a" || r.New.Annotations["example.com/note"] != "keep" {
			t.Errorf("%s: foreign metadata lost: %v %v", r.New.Name, r.New.Labels, r.New.Annotations)
		}
	}
}

// TestDiffClusterIPMigration: in cluster-ip mode a Service made in
// external-ip mode (the BMC or NVOS IP in externalIPs, an allocated
// clusterIP, and the externalTrafficPolicy the API server gave it) is
// recreated with the IP as clusterIP, no externalIPs and no
// externalTrafficPolicy, which the API server refuses on the create of a
// ClusterIP Service without externalIPs; foreign metadata survives.
func TestDiffClusterIPMigration(t *testing.T) {
	ext := testOptions(IPModeExternalIP)
	cip := testOptions(IPModeClusterIP)
	inst := testInstance()
	st := loadStatus(t, "v2-mixed.json")
	d := Build(inst, st, cip)
	old := Build(inst, st, ext)
	var existing []*corev1.Service
	var want []string
	for i, s := range old.Services {
		e := existingFrom(t, old, s.Name, "u"+s.Name)
		e.Spec.ClusterIP = "10.0.9." + string(rune('1'+i%8))
		e.Spec.ClusterIPs = []string{e.Spec.ClusterIP}
		e.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		e.Labels["example.com/team"] = "a"
		existing = append(existing, e)
		want = append(want, s.Name)
	}
	p := Diff(d, existing, cip)
	slices.Sort(want)
	if got := summarize(p); !reflect.DeepEqual(got, pn(nil, nil, want, nil, nil)) {
		t.Fatalf("plan %+v", got)
	}
	for _, r := range p.Recreate {
		ip := ServiceIP(r.Old)
		if r.New.Spec.ClusterIP != ip || !slices.Equal(r.New.Spec.ClusterIPs, []string{ip}) || r.New.Spec.ExternalIPs != nil ||
			r.New.Spec.ExternalTrafficPolicy != "" || r.New.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("%s: spec %+v", r.New.Name, r.New.Spec)
		}
		if r.New.Labels["example.com/team"] != "a" {
			t.Errorf("%s: foreign labels lost: %v", r.New.Name, r.New.Labels)
		}
	}
}
