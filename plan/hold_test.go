package plan

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestHoldRuleValidate(t *testing.T) {
	for _, tc := range []struct {
		share  float64
		window time.Duration
		ok     bool
	}{
		{0.5, time.Minute, true},
		{1, 0, true},
		{0.01, 0, true},
		{0, time.Minute, false},
		{-0.1, time.Minute, false},
		{1.01, time.Minute, false},
		{math.NaN(), time.Minute, false},
		{math.Inf(1), time.Minute, false},
		{0.5, -time.Second, false},
	} {
		err := HoldRule{Share: tc.share, Window: tc.window}.Validate()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrInvalidHoldRule) {
			t.Errorf("share %v window %v: err %v, want ok=%v", tc.share, tc.window, err, tc.ok)
		}
	}
}

func TestHoldRuleMass(t *testing.T) {
	on := HoldRule{Share: 0.5, Window: time.Minute}
	for _, tc := range []struct {
		name string
		rule HoldRule
		d    Disappearance
		want MassReason
	}{
		{"window 0 is off", HoldRule{Share: 0.5}, Disappearance{Existing: 400, Deletes: 400}, MassNone},
		{"no deletes", on, Disappearance{Existing: 400}, MassNone},
		{"no Services", on, Disappearance{Deletes: 3}, MassNone},
		{"empty inventory", on, Disappearance{Existing: 400, Deletes: 400, Epoch: "b", PrevEpoch: "a"}, MassAll},
		{"one device of 400", on, Disappearance{Existing: 400, Deletes: 1}, MassNone},
		{"two devices of 400", on, Disappearance{Existing: 400, Deletes: 2}, MassNone},
		{"half of 400", on, Disappearance{Existing: 400, Deletes: 200}, MassShare},
		{"just below half", on, Disappearance{Existing: 400, Deletes: 199}, MassNone},
		{"share exactly at threshold, odd", HoldRule{Share: 0.25, Window: time.Second}, Disappearance{Existing: 8, Deletes: 2}, MassShare},
		{"share 1 is all only", HoldRule{Share: 1, Window: time.Second}, Disappearance{Existing: 10, Deletes: 9}, MassNone},
		{"tiny: the only Service", on, Disappearance{Existing: 1, Deletes: 1}, MassAll},
		{"tiny: one of two", on, Disappearance{Existing: 2, Deletes: 1}, MassNone},
		{"tiny: both of two", on, Disappearance{Existing: 2, Deletes: 2}, MassAll},
		{"tiny: two of three", on, Disappearance{Existing: 3, Deletes: 2}, MassShare},
		{"more deletes than counted", on, Disappearance{Existing: 3, Deletes: 5}, MassAll},
		{"new epoch, two fewer", on, Disappearance{Existing: 400, Deletes: 2, Epoch: "b", PrevEpoch: "a"}, MassEpoch},
		{"new epoch, one fewer", on, Disappearance{Existing: 400, Deletes: 1, Epoch: "b", PrevEpoch: "a"}, MassNone},
		{"unknown previous epoch", on, Disappearance{Existing: 400, Deletes: 2, Epoch: "b"}, MassNone},
		{"same epoch", on, Disappearance{Existing: 400, Deletes: 2, Epoch: "a", PrevEpoch: "a"}, MassNone},
		{"legacy status lost its epoch", on, Disappearance{Existing: 400, Deletes: 2, PrevEpoch: "a"}, MassEpoch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, detail := tc.rule.Mass(tc.d)
			if got != tc.want {
				t.Fatalf("Mass(%+v) = %q (%s), want %q", tc.d, got, detail, tc.want)
			}
			if (got == MassNone) != (detail == "") {
				t.Errorf("reason %q with detail %q", got, detail)
			}
		})
	}
}

func TestDeletable(t *testing.T) {
	opts := testOptions(IPModeClusterIP)
	d := Desired{Instance: LabelValue("ns.mat")}
	mine := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bmc",
			Labels: map[string]string{LabelManagedBy: DefaultManagedBy, LabelInstance: d.Instance}}}
	}
	other := mine("other")
	other.Labels[LabelInstance] = "ns.mat-b"
	old := mine("old")
	delete(old.Labels, LabelInstance)
	foreign := mine("foreign")
	foreign.Labels[LabelManagedBy] = "someone"
	gone := mine("going")
	gone.DeletionTimestamp = &metav1.Time{}
	elsewhere := mine("elsewhere")
	elsewhere.Namespace = "default"
	if n := Deletable(d, []*corev1.Service{mine("a"), mine("b"), other, old, foreign, gone, elsewhere, nil}, opts); n != 2 {
		t.Errorf("Deletable = %d, want 2 (a and b)", n)
	}
}

// svcs makes n Services named <prefix>-<i> with UIDs u-<prefix>-<i> and
// cluster IPs 10.0.<p>.<i>.
func holdSvcs(prefix string, p, n int) []*corev1.Service {
	out := make([]*corev1.Service, n)
	for i := range n {
		out[i] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%03d", prefix, i), UID: types.UID(fmt.Sprintf("u-%s-%d", prefix, i))},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.0.%d.%d", p, i)}}
	}
	return out
}

func uidSet(svcs []*corev1.Service) map[types.UID]bool {
	m := map[types.UID]bool{}
	for _, s := range svcs {
		m[s.UID] = true
	}
	return m
}

func svcNames(svcs []*corev1.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Name)
	}
	return out
}

func TestDecideHold(t *testing.T) {
	rule := HoldRule{Share: 0.5, Window: 3 * time.Second}
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	all := holdSvcs("s", 1, 10) // the instance's 10 Services
	held := func(svcs []*corev1.Service, released bool) *HoldState {
		return &HoldState{Since: t0, Until: t0.Add(3 * time.Second), Released: released, UIDs: uidSet(svcs)}
	}
	dis := func(deletes int) Disappearance { return Disappearance{Existing: 10, Deletes: deletes} }
	newDev := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "new"}, Spec: corev1.ServiceSpec{ClusterIP: all[0].Spec.ClusterIP}}
	for _, tc := range []struct {
		name       string
		rule       HoldRule
		h          *HoldState
		p          Plan
		dis        Disappearance
		at         time.Time
		mode       IPMode
		action     HoldAction
		held, goes []string
	}{
		{name: "single delete goes", rule: rule, p: Plan{Delete: all[:1]}, dis: dis(1), at: t0,
			action: HoldKeep, goes: svcNames(all[:1])},
		{name: "empty inventory starts a hold", rule: rule, p: Plan{Delete: all}, dis: dis(10), at: t0,
			action: HoldStart, held: svcNames(all)},
		{name: "off: everything goes", rule: HoldRule{Share: 0.5}, p: Plan{Delete: all}, dis: dis(10), at: t0,
			action: HoldKeep, goes: svcNames(all)},
		{name: "off ends a record", rule: HoldRule{Share: 0.5}, h: held(all, false), p: Plan{Delete: all}, dis: dis(10), at: t0,
			action: HoldEnd, goes: svcNames(all)},
		{name: "IP a new device needs goes at once", rule: rule, p: Plan{Delete: all, Create: []*corev1.Service{newDev}}, dis: dis(10), at: t0,
			action: HoldStart, held: svcNames(all[1:]), goes: svcNames(all[:1])},
		{name: "external-ip mode needs no IP freed", rule: rule, p: Plan{Delete: all, Create: []*corev1.Service{newDev}}, dis: dis(10), at: t0, mode: IPModeExternalIP,
			action: HoldStart, held: svcNames(all)},
		{name: "only IP-freeing deletes: no hold", rule: rule, p: Plan{Delete: all[:3], Create: []*corev1.Service{newDev}, Recreate: []Update{{New: &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: all[1].Spec.ClusterIP}}}, {New: &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: all[2].Spec.ClusterIP}}}}},
			dis: dis(3), at: t0, action: HoldKeep, goes: svcNames(all[:3])},
		{name: "in force: same set kept", rule: rule, h: held(all, false), p: Plan{Delete: all}, dis: dis(10), at: t0.Add(time.Second),
			action: HoldKeep, held: svcNames(all)},
		{name: "in force: some came back", rule: rule, h: held(all, false), p: Plan{Delete: all[5:]}, dis: dis(5), at: t0.Add(time.Second),
			action: HoldUpdate, held: svcNames(all[5:])},
		{name: "in force: even one left is held", rule: rule, h: held(all, false), p: Plan{Delete: all[9:]}, dis: dis(1), at: t0.Add(time.Second),
			action: HoldUpdate, held: svcNames(all[9:])},
		{name: "in force: all came back", rule: rule, h: held(all, false), p: Plan{}, dis: dis(0), at: t0.Add(time.Second),
			action: HoldEnd},
		{name: "in force: one second before the end", rule: rule, h: held(all, false), p: Plan{Delete: all}, dis: dis(10), at: t0.Add(2999 * time.Millisecond),
			action: HoldKeep, held: svcNames(all)},
		{name: "window over: released", rule: rule, h: held(all, false), p: Plan{Delete: all}, dis: dis(10), at: t0.Add(3 * time.Second),
			action: HoldRelease, goes: svcNames(all)},
		{name: "window over, half came back: the rest goes", rule: rule, h: held(all, false), p: Plan{Delete: all[5:]}, dis: dis(5), at: t0.Add(time.Minute),
			action: HoldRelease, goes: svcNames(all[5:])},
		{name: "window over, all came back", rule: rule, h: held(all, false), p: Plan{}, dis: dis(0), at: t0.Add(time.Minute),
			action: HoldEnd},
		{name: "released: deletes go without a new hold", rule: rule, h: held(all, true), p: Plan{Delete: all[3:]}, dis: dis(7), at: t0.Add(time.Minute),
			action: HoldKeep, goes: svcNames(all[3:])},
		{name: "released: done", rule: rule, h: held(all, true), p: Plan{}, dis: dis(0), at: t0.Add(time.Minute),
			action: HoldEnd},
		{name: "released: one other delete goes", rule: rule, h: held(all[:5], true), p: Plan{Delete: all[4:6]}, dis: dis(2), at: t0.Add(time.Minute),
			action: HoldKeep, goes: svcNames(all[4:6])},
		{name: "released: the others vanish too", rule: rule, h: held(all[:5], true), p: Plan{Delete: all}, dis: dis(10), at: t0.Add(time.Minute),
			action: HoldStart, held: svcNames(all[5:]), goes: svcNames(all[:5])},
		{name: "in force, holding all", rule: rule, h: &HoldState{Since: t0, Until: t0.Add(time.Second), All: true}, p: Plan{Delete: all[:4]}, dis: dis(4), at: t0,
			action: HoldKeep, held: svcNames(all[:4])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideHold(tc.rule, tc.h, tc.p, tc.dis, tc.at, tc.mode)
			if got.Action != tc.action {
				t.Errorf("action %v, want %v", got.Action, tc.action)
			}
			if g := svcNames(got.Held); !slices.Equal(g, tc.held) {
				t.Errorf("held %v, want %v", g, tc.held)
			}
			if g := svcNames(got.Go); !slices.Equal(g, tc.goes) {
				t.Errorf("go %v, want %v", g, tc.goes)
			}
			if len(got.Held)+len(got.Go) != len(tc.p.Delete) {
				t.Errorf("held %d + go %d != %d deletes", len(got.Held), len(got.Go), len(tc.p.Delete))
			}
			if (got.Action == HoldStart) != (got.Reason != MassNone) {
				t.Errorf("action %v with reason %q", got.Action, got.Reason)
			}
		})
	}
}

func TestHoldStateHolds(t *testing.T) {
	var none *HoldState
	if none.Holds("a") {
		t.Error("nil record holds")
	}
	h := &HoldState{UIDs: map[types.UID]bool{"a": true}}
	if !h.Holds("a") || h.Holds("b") {
		t.Error("in force: holds exactly its UIDs")
	}
	h.All = true
	if !h.Holds("b") {
		t.Error("a record holding all holds every UID")
	}
	h.Released = true
	if h.Holds("a") {
		t.Error("a released record holds nothing")
	}
}
