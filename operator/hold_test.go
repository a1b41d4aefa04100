package operator

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// fixedStatus is a StatusClient that answers st.
type fixedStatus struct{ st *matclient.Status }

func (f fixedStatus) Status(context.Context) (*matclient.Status, error) { return f.st, nil }
func (f fixedStatus) Close() error                                      { return nil }

// TestPlanHeldDeletes: `matbus plan` reports the deletes a worker would
// hold in their own section, not as changes: an empty inventory starts a
// hold of the rule's window, a hold in force shows its end, a released
// hold's deletes are changes again, and a single delete is never held.
func TestPlanHeldDeletes(t *testing.T) {
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 4, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	opts := plan.Options{Namespace: "ns", TargetSelector: map[string]string{"app": "mat"}}
	inst := events.Instance{Key: "ns.mat", URL: "http://mat:1266"}
	full := plan.Build(plan.Instance{Key: inst.Key}, fleet.Status("e1", 1), opts)
	var objs []*corev1.Service
	for i, s := range full.Services {
		s.UID = types.UID(fmt.Sprintf("uid-%d", i))
		objs = append(objs, s)
	}
	rule := plan.HoldRule{Share: 0.5, Window: 5 * time.Minute}
	now := time.Now()
	record := func(released bool) map[string]events.HoldRecord {
		r := events.HoldRecord{Key: inst.Key, Reason: "all", Detail: "empty", Since: now.Add(-time.Minute), Until: now.Add(4 * time.Minute), Held: 4}
		for _, s := range objs {
			r.Services = append(r.Services, events.HeldService{Name: s.Name, UID: string(s.UID)})
		}
		if released {
			r.Until, r.Released = now.Add(-time.Second), now
		}
		return map[string]events.HoldRecord{inst.Key: r}
	}
	oneGone := fleet.Clone()
	oneGone.Machines = oneGone.Machines[1:]
	for _, tc := range []struct {
		name     string
		st       *matclient.Status
		holds    map[string]events.HoldRecord
		held     int
		changes  int
		contains string
	}{
		{"empty inventory would start a hold", (&matsim.Fleet{}).Status("e2", 1), map[string]events.HoldRecord{}, 4, 0,
			"deletes a worker would hold for 5m0s (all: "},
		{"hold in force", (&matsim.Fleet{}).Status("e2", 1), record(false), 4, 0, "deletes held until "},
		{"hold unknown", (&matsim.Fleet{}).Status("e2", 1), nil, 4, 0, "(hold records not read: no NATS)"},
		{"released hold", (&matsim.Fleet{}).Status("e2", 1), record(true), 0, 4, "4 changes: 0 creates, 0 updates, 0 recreates, 4 deletes"},
		{"single delete", oneGone.Status("e1", 2), map[string]events.HoldRecord{}, 0, 1, "1 changes: 0 creates, 0 updates, 0 recreates, 1 deletes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewSimpleClientset()
			for _, s := range objs {
				if _, err := kube.CoreV1().Services("ns").Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			cfg := PlanConfig{Kube: kube, Options: opts, Hold: rule, Holds: tc.holds,
				NewClient: func(string) (StatusClient, error) { return fixedStatus{tc.st}, nil }}
			if tc.holds == nil {
				cfg.HoldsErr = fmt.Errorf("no NATS")
			}
			r, err := Plan(context.Background(), cfg, []events.Instance{inst})
			if err != nil {
				t.Fatal(err)
			}
			ip := r.Instances[0]
			if len(ip.HeldDeletes) != tc.held || r.Changes != tc.changes {
				t.Errorf("held %d, changes %d; want %d, %d", len(ip.HeldDeletes), r.Changes, tc.held, tc.changes)
			}
			var b bytes.Buffer
			if err := WriteText(&b, r); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), tc.contains) {
				t.Errorf("plan text lacks %q:\n%s", tc.contains, b.String())
			}
			if tc.held > 0 && (r.ExitCode() != 0 || !strings.Contains(b.String(), "hold      mat-bmc-")) {
				t.Errorf("exit %d, want 0 (held deletes are no change); text:\n%s", r.ExitCode(), b.String())
			}
		})
	}
}
