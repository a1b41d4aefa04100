package plan

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestForeignIPRecreate: in external-ip mode a Service whose allocated
// spec.clusterIP is an IP another instance publishes (Desired.ForeignIPs)
// is recreated, marked Foreign with a reason naming the publisher; without
// that IP among ForeignIPs nothing happens, and in cluster-ip mode
// ForeignIPs change nothing.
func TestForeignIPRecreate(t *testing.T) {
	const taken = "10.96.200.7" // another instance's BMC IP
	for _, tc := range []struct {
		name    string
		mode    IPMode
		foreign map[string]string
		want    bool
	}{
		{"external-ip, foreign IP", IPModeExternalIP, map[string]string{taken: `Service mat-bmc-host-other of instance "ns.mat-b"`}, true},
		{"external-ip, other foreign IPs", IPModeExternalIP, map[string]string{"10.96.200.8": "someone"}, false},
		{"external-ip, none", IPModeExternalIP, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(tc.mode)
			d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts)
			existing := make([]*corev1.Service, len(d.Services))
			for i, s := range d.Services {
				existing[i] = s.DeepCopy()
				existing[i].UID = "u"
				existing[i].Spec.ClusterIP = "10.96.250." + string(rune('1'+i))
			}
			existing[0].Spec.ClusterIP = taken
			d.ForeignIPs = tc.foreign
			p := Diff(d, existing, opts)
			if !tc.want {
				if !p.Empty() {
					t.Fatalf("plan %+v, want empty", p)
				}
				return
			}
			if len(p.Recreate) != 1 || len(p.Update)+len(p.Create)+len(p.Delete) != 0 {
				t.Fatalf("recreate %d update %d create %d delete %d, want 1 recreate", len(p.Recreate), len(p.Update), len(p.Create), len(p.Delete))
			}
			u := p.Recreate[0]
			if u.Old != existing[0] || !u.Foreign || !strings.Contains(u.Reason, taken) || !strings.Contains(u.Reason, "ns.mat-b") {
				t.Errorf("recreate %s foreign=%v reason %q", u.Old.Name, u.Foreign, u.Reason)
			}
			if u.New.Spec.ClusterIP != "" {
				t.Errorf("new clusterIP %q, want it left to the API server", u.New.Spec.ClusterIP)
			}
		})
	}
	t.Run("cluster-ip", func(t *testing.T) {
		opts := testOptions(IPModeClusterIP)
		d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts)
		existing := make([]*corev1.Service, len(d.Services))
		for i, s := range d.Services {
			existing[i] = s.DeepCopy()
		}
		d.ForeignIPs = map[string]string{d.Services[0].Spec.ClusterIP: "someone"}
		if p := Diff(d, existing, opts); !p.Empty() {
			t.Fatalf("plan %+v, want empty", p)
		}
	})
}
