package plan

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	host922f = "mat-bmc-host-922f3d9b-20b-4da64654"
	host7ec7 = "mat-bmc-host-7ec7b7c3-126-c030b365"
	dpuA159  = "mat-bmc-dpu-a15919aa-572-726d4120"
	hostD171 = "mat-bmc-host-d171a368-ea6-3f95c484" // no BMC IP in v2-mixed
)

// planNames is a Plan reduced to names, for table comparisons.
type planNames struct {
	Create, Update, Recreate, Delete, Skipped []string
}

func summarize(p Plan) planNames {
	var s planNames
	s.Create = names(p.Create)
	s.Update = updateNames(p.Update)
	s.Recreate = updateNames(p.Recreate)
	s.Delete = names(p.Delete)
	s.Skipped = []string{}
	for _, k := range p.Skipped {
		s.Skipped = append(s.Skipped, k.Name)
	}
	return s
}

func pn(create, update, recreate, del, skipped []string) planNames {
	nz := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return planNames{nz(create), nz(update), nz(recreate), nz(del), nz(skipped)}
}

// deployed returns the API state after applying Build(fixture) to an empty
// namespace.
func deployed(t *testing.T, fixture string, inst Instance, opts Options) *fakeAPI {
	t.Helper()
	api := newFakeAPI(t)
	api.apply(Diff(Build(inst, loadStatus(t, fixture), opts), nil, opts))
	if len(api.svcs) == 0 && fixture != "v2-empty.json" {
		t.Fatalf("nothing deployed from %s", fixture)
	}
	return api
}

// TestDiffGenerationBump: v2-mixed → v2-generation-bumped.
func TestDiffGenerationBump(t *testing.T) {
	tests := []struct {
		mode IPMode
		want planNames
	}{
		{IPModeClusterIP, pn(nil, []string{host922f}, []string{host7ec7}, []string{dpuA159}, nil)},
		{IPModeExternalIP, pn(nil, []string{host7ec7, host922f}, nil, []string{dpuA159}, nil)},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			opts := testOptions(tc.mode)
			api := deployed(t, "v2-mixed.json", testInstance(), opts)
			before := api.list()
			p := Diff(Build(testInstance(), loadStatus(t, "v2-generation-bumped.json"), opts), before, opts)
			if got := summarize(p); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("plan %+v\nwant %+v", got, tc.want)
			}

			for _, u := range p.Update {
				if u.New.UID != u.Old.UID || u.New.ResourceVersion != u.Old.ResourceVersion || u.New == u.Old {
					t.Errorf("%s: New must be a copy keeping UID and ResourceVersion", u.Old.Name)
				}
			}
			u922 := p.Update[slices.IndexFunc(p.Update, func(u Update) bool { return u.Old.Name == host922f })]
			if u922.New.Annotations[AnnotationIPMIPort] != "16030" ||
				!slices.ContainsFunc(u922.New.Spec.Ports, func(p corev1.ServicePort) bool {
					return p.Name == PortIPMI && p.Protocol == corev1.ProtocolUDP && p.Port == 16030 && p.TargetPort.IntVal == 16030
				}) {
				t.Errorf("922f: IPMI not added: %v %v", u922.New.Annotations, u922.New.Spec.Ports)
			}

			switch tc.mode {
			case IPModeClusterIP:
				r := p.Recreate[0]
				if r.Old.Spec.ClusterIP != "10.96.64.13" || r.New.Spec.ClusterIP != "10.96.64.50" ||
					!slices.Equal(r.New.Spec.ClusterIPs, []string{"10.96.64.50"}) || r.New.UID != "" || r.New.ResourceVersion != "" ||
					r.New.Annotations[AnnotationBMCIP] != "10.96.64.50" {
					t.Errorf("recreate %+v -> %+v", r.Old.Spec, r.New)
				}
			case IPModeExternalIP:
				u := p.Update[slices.IndexFunc(p.Update, func(u Update) bool { return u.Old.Name == host7ec7 })]
				if !slices.Equal(u.New.Spec.ExternalIPs, []string{"10.96.64.50"}) || u.New.Spec.ClusterIP != u.Old.Spec.ClusterIP ||
					u.New.Annotations[AnnotationBMCIP] != "10.96.64.50" {
					t.Errorf("7ec7: %+v", u.New.Spec)
				}
			}

			api.apply(p)
			if p2 := Diff(Build(testInstance(), loadStatus(t, "v2-generation-bumped.json"), opts), api.list(), opts); !p2.Empty() {
				t.Errorf("not converged: %+v", summarize(p2))
			}
		})
	}
}

// TestDiffIdempotent: after applying a plan, the same Build diffs to
// nothing — across fixtures, modes and pod names, including transitions.
func TestDiffIdempotent(t *testing.T) {
	steps := [][]string{
		{"v2-mixed.json"},
		{"v2-mixed.json", "v2-generation-bumped.json", "v2-mixed.json"},
		{"long-ids.json"},
		{"legacy-small.json", "v2-empty.json", "legacy-small.json"},
		{"malformed/duplicate-bmc-ip.json"},
		{"v2-mixed.json", "long-ids.json"},
	}
	for _, mode := range []IPMode{IPModeClusterIP, IPModeExternalIP} {
		for _, pod := range []string{"", "mat-0"} {
			for _, seq := range steps {
				t.Run(string(mode)+"/"+pod+"/"+seq[len(seq)-1], func(t *testing.T) {
					inst := testInstance()
					inst.PodName = pod
					opts := testOptions(mode)
					api := newFakeAPI(t)
					for _, f := range seq {
						d := Build(inst, loadStatus(t, f), opts)
						api.apply(Diff(d, api.list(), opts))
						if p := Diff(d, api.list(), opts); !p.Empty() || len(p.Skipped) > 0 {
							t.Fatalf("after %s: %+v", f, summarize(p))
						}
						if got, want := slices.Sorted(maps.Keys(api.svcs)), names(d.Services); !slices.Equal(got, want) {
							t.Fatalf("after %s: have %v, want %v", f, got, want)
						}
					}
				})
			}
		}
	}
}

// existingFrom returns the desired Service called name as an existing
// object: a copy with UID, resourceVersion and (external-ip) a clusterIP.
func existingFrom(t *testing.T, d Desired, name string, uid string) *corev1.Service {
	t.Helper()
	i := slices.IndexFunc(d.Services, func(s *corev1.Service) bool { return s.Name == name })
	if i < 0 {
		t.Fatalf("no desired %s", name)
	}
	s := d.Services[i].DeepCopy()
	s.UID = types.UID(uid)
	s.ResourceVersion = "7"
	if s.Spec.ClusterIP == "" {
		s.Spec.ClusterIP = "10.0.0.99"
	}
	return s
}

// TestDiffOwnership: what Diff may touch.
func TestDiffOwnership(t *testing.T) {
	opts := testOptions(IPModeClusterIP)
	mixed := func(t *testing.T) Desired { return Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts) }
	withLabels := func(s *corev1.Service, kv ...string) *corev1.Service {
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "-" {
				delete(s.Labels, kv[i])
			} else {
				s.Labels[kv[i]] = kv[i+1]
			}
		}
		return s
	}
	// everythingBut: every desired Service exists, except the given ones.
	everythingBut := func(t *testing.T, d Desired, except ...string) []*corev1.Service {
		var out []*corev1.Service
		for _, s := range d.Services {
			if !slices.Contains(except, s.Name) {
				out = append(out, existingFrom(t, d, s.Name, "uid-"+s.Name))
			}
		}
		return out
	}
	stale := func(name, matID string, kv ...string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "bmc", UID: types.UID("uid-" + name),
			Labels:      map[string]string{LabelManagedBy: DefaultManagedBy, LabelInstance: "mat-ns.mat-bmc-mock", LabelMatID: LabelValue(matID)},
			Annotations: map[string]string{AnnotationMatID: matID},
		}}
		return withLabels(s, kv...)
	}

	tests := []struct {
		name     string
		desired  func(t *testing.T) Desired
		existing func(t *testing.T, d Desired) []*corev1.Service
		want     func(t *testing.T, d Desired) planNames
		check    func(t *testing.T, p Plan)
	}{
		{
			name:    "another managed-by with a desired name: skipped, not created, not updated",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				s := withLabels(existingFrom(t, d, host922f, "u1"), LabelManagedBy, "someone-else", LabelMatID, "x")
				return append(everythingBut(t, d, host922f), s)
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, []string{host922f}) },
			check: func(t *testing.T, p Plan) {
				if p.Skipped[0].Reason != `existing Service is managed by "someone-else"` {
					t.Errorf("reason %q", p.Skipped[0].Reason)
				}
			},
		},
		{
			name:    "another managed-by, not desired: never deleted",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d), stale("mat-bmc-host-gone", "gone", LabelManagedBy, "helm"))
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, nil) },
		},
		{
			name:    "no managed-by label: never touched",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d, host7ec7),
					withLabels(existingFrom(t, d, host7ec7, "u1"), LabelManagedBy, "-", LabelMatID, "x"),
					stale("mat-bmc-host-gone", "gone", LabelManagedBy, "-"))
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, []string{host7ec7}) },
		},
		{
			name:    "old controller's Service (no instance label) with a desired name: adopted",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				old := existingFrom(t, d, host922f, "u-old")
				old.Labels = map[string]string{LabelManagedBy: DefaultManagedBy, "mat-id": "922f3d9b-20be-461f-9b69-90928701ce93", "machine-type": "host"}
				old.Annotations = map[string]string{"bmc-ip": "10.96.64.10"}
				old.OwnerReferences = nil
				return append(everythingBut(t, d, host922f), old)
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, []string{host922f}, nil, nil, nil) },
			check: func(t *testing.T, p Plan) {
				n := p.Update[0].New
				if n.Labels[LabelInstance] != "mat-ns.mat-bmc-mock" || n.Labels["mat-id"] == "" || n.Labels["machine-type"] != "host" ||
					n.Annotations["bmc-ip"] != "10.96.64.10" || n.Annotations[AnnotationMatID] == "" || n.UID != "u-old" ||
					!reflect.DeepEqual(n.OwnerReferences, []metav1.OwnerReference{testOwner}) {
					t.Errorf("adopted: %+v", n.ObjectMeta)
				}
			},
		},
		{
			name:    "old controller's Service not desired: left alone",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d), stale("mat-bmc-host-old", "old", LabelInstance, "-"))
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, nil) },
		},
		{
			name:    "another instance's Service: not deleted; with a desired name skipped",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d, dpuA159),
					withLabels(existingFrom(t, d, dpuA159, "u1"), LabelInstance, "other-ns.mat"),
					stale("mat-bmc-host-theirs", "theirs", LabelInstance, "other-ns.mat"))
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, []string{dpuA159}) },
		},
		{
			name:    "another pod of this instance: not deleted; with a desired name skipped",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d, dpuA159),
					withLabels(existingFrom(t, d, dpuA159, "u1"), LabelPodName, "mat-1"),
					stale("mat-bmc-host-pod1", "pod1", LabelPodName, "mat-1"))
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, []string{dpuA159}) },
		},
		{
			name: "this pod deletes its own, not the single-pod ones",
			desired: func(t *testing.T) Desired {
				inst := testInstance()
				inst.PodName = "mat-0"
				return Build(inst, loadStatus(t, "v2-empty.json"), opts)
			},
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return []*corev1.Service{stale("mat-bmc-host-p0", "p0", LabelPodName, "mat-0"), stale("mat-bmc-host-single", "single")}
			},
			want: func(t *testing.T, d Desired) planNames {
				return pn(nil, nil, nil, []string{"mat-bmc-host-p0"}, nil)
			},
		},
		{
			name:    "removed device of this instance: deleted",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d), stale("mat-bmc-host-gone", "gone"), stale("mat-bmc-host-gone2", "gone2"))
			},
			want: func(t *testing.T, d Desired) planNames {
				return pn(nil, nil, nil, []string{"mat-bmc-host-gone", "mat-bmc-host-gone2"}, nil)
			},
			check: func(t *testing.T, p Plan) {
				if p.Delete[0].UID != "uid-mat-bmc-host-gone" {
					t.Errorf("delete must carry the UID: %q", p.Delete[0].UID)
				}
			},
		},
		{
			name:    "held device (no BMC IP yet) keeps its Service",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return append(everythingBut(t, d), stale(hostD171, "d171a368-ea6a-45f5-9b66-6767052fe916"))
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, nil) },
		},
		{
			name:    "held device found by its mat-id label when the annotation is missing",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				s := stale(hostD171, "d171a368-ea6a-45f5-9b66-6767052fe916")
				s.Annotations = nil
				return append(everythingBut(t, d), s)
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, nil) },
		},
		{
			name: "duplicate BMC IP: the loser's existing Service is kept, the winner created",
			desired: func(t *testing.T) Desired {
				return Build(testInstance(), loadStatus(t, "malformed/duplicate-bmc-ip.json"), opts)
			},
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return []*corev1.Service{stale(d.Held[0].Name, d.Held[0].MatID)}
			},
			want: func(t *testing.T, d Desired) planNames { return pn(names(d.Services), nil, nil, nil, nil) },
		},
		{
			name: "no status: nothing deleted, nothing created",
			desired: func(t *testing.T) Desired {
				return Build(testInstance(), nil, opts)
			},
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return []*corev1.Service{stale("mat-bmc-host-a", "a"), stale("mat-bmc-host-b", "b")}
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, nil) },
		},
		{
			name:    "empty status: everything of this instance deleted",
			desired: func(t *testing.T) Desired { return Build(testInstance(), loadStatus(t, "v2-empty.json"), opts) },
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return []*corev1.Service{stale("mat-bmc-host-b", "b"), stale("mat-bmc-host-a", "a")}
			},
			want: func(t *testing.T, d Desired) planNames {
				return pn(nil, nil, nil, []string{"mat-bmc-host-a", "mat-bmc-host-b"}, nil)
			},
		},
		{
			name:    "another namespace: ignored",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				s := existingFrom(t, d, host922f, "u1")
				s.Namespace = "elsewhere"
				g := stale("mat-bmc-host-gone", "gone")
				g.Namespace = "elsewhere"
				return append(everythingBut(t, d, host922f), s, g)
			},
			want: func(t *testing.T, d Desired) planNames { return pn([]string{host922f}, nil, nil, nil, nil) },
		},
		{
			name:    "being deleted: neither updated nor deleted again",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				now := metav1.Unix(1, 0)
				s := withLabels(existingFrom(t, d, host922f, "u1"), LabelMachineType, "dpu")
				s.DeletionTimestamp = &now
				g := stale("mat-bmc-host-gone", "gone")
				g.DeletionTimestamp = &now
				return append(everythingBut(t, d, host922f), s, g)
			},
			want: func(t *testing.T, d Desired) planNames { return pn(nil, nil, nil, nil, []string{host922f}) },
		},
		{
			name:    "nothing exists: everything created",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return nil
			},
			want: func(t *testing.T, d Desired) planNames { return pn(names(d.Services), nil, nil, nil, nil) },
			check: func(t *testing.T, p Plan) {
				if len(p.Create) != 9 {
					t.Errorf("%d creates", len(p.Create))
				}
			},
		},
		{
			name:    "one created, rest untouched",
			desired: mixed,
			existing: func(t *testing.T, d Desired) []*corev1.Service {
				return everythingBut(t, d, dpuA159)
			},
			want: func(t *testing.T, d Desired) planNames { return pn([]string{dpuA159}, nil, nil, nil, nil) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.desired(t)
			existing := tc.existing(t, d)
			p := Diff(d, existing, opts)
			if got, want := summarize(p), tc.want(t, d); !reflect.DeepEqual(got, want) {
				t.Errorf("plan %+v\nwant %+v", got, want)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
}

// TestDiffSkipNamesBothIDs: a Skip carries the desired mat_id and the
// existing Service's mat_id (annotation, else label) and instance, so the
// clash can be reported with both ids.
func TestDiffSkipNamesBothIDs(t *testing.T) {
	const (
		id922f = "922f3d9b-20be-461f-9b69-90928701ce93"
		idA159 = "a15919aa-5727-4fb9-84e9-2980007cfc58"
	)
	opts := testOptions(IPModeClusterIP)
	tests := []struct {
		name string
		want string // desired name taken by the existing Service
		edit func(s *corev1.Service)
		skip Skip // Reason not compared
	}{
		{"another instance, another mat_id", dpuA159, func(s *corev1.Service) {
			s.Labels[LabelInstance] = "other-ns.mat"
			s.Labels[LabelMatID] = "other-id"
			s.Annotations[AnnotationMatID] = "Other-ID"
		}, Skip{Name: dpuA159, WantMatID: idA159, HaveMatID: "Other-ID", HaveInstance: "other-ns.mat"}},
		{"another instance, mat_id only as a label", dpuA159, func(s *corev1.Service) {
			s.Labels[LabelInstance] = "other-ns.mat"
			s.Labels[LabelMatID] = "other-id"
			delete(s.Annotations, AnnotationMatID)
		}, Skip{Name: dpuA159, WantMatID: idA159, HaveMatID: "other-id", HaveInstance: "other-ns.mat"}},
		{"another managed-by, same mat_id", host922f, func(s *corev1.Service) {
			s.Labels[LabelManagedBy] = "someone-else"
		}, Skip{Name: host922f, WantMatID: id922f, HaveMatID: id922f, HaveInstance: "mat-ns.mat-bmc-mock"}},
		{"foreign Service without our labels or annotations", host922f, func(s *corev1.Service) {
			s.Labels = map[string]string{"app": "x"}
			s.Annotations = nil
		}, Skip{Name: host922f, WantMatID: id922f}},
		{"another pod of this instance", host922f, func(s *corev1.Service) {
			s.Labels[LabelPodName] = "mat-1"
		}, Skip{Name: host922f, WantMatID: id922f, HaveMatID: id922f, HaveInstance: "mat-ns.mat-bmc-mock"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts)
			have := existingFrom(t, d, tc.want, "u1")
			tc.edit(have)
			p := Diff(d, []*corev1.Service{have}, opts)
			if len(p.Skipped) != 1 {
				t.Fatalf("skipped %+v, want one entry", p.Skipped)
			}
			got := p.Skipped[0]
			if got.Reason == "" {
				t.Error("skip without a reason")
			}
			got.Reason = ""
			if got != tc.skip {
				t.Errorf("skip %+v\nwant %+v", got, tc.skip)
			}
		})
	}
}

// TestDiffOverlay: on Update only our fields change; everything foreign is
// kept.
func TestDiffOverlay(t *testing.T) {
	otherOwner := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "cm", UID: "cm-uid"}
	tests := []struct {
		name   string
		mode   IPMode
		mutate func(s *corev1.Service)                    // applied to the existing copy of host922f
		check  func(t *testing.T, old, n *corev1.Service) // on Update.New
	}{
		{
			name: "foreign labels, annotations, owner refs and spec fields kept",
			mode: IPModeClusterIP,
			mutate: func(s *corev1.Service) {
				s.Labels["team"] = "infra"
				s.Labels[LabelMachineType] = "dpu" // ours, wrong
				s.Labels[LabelParentID] = "stray"  // ours, not desired
				s.Annotations["note"] = "keep me"
				s.Annotations[AnnotationIPMIPort] = "623" // ours, not desired
				s.OwnerReferences = append([]metav1.OwnerReference{otherOwner}, s.OwnerReferences...)
				s.Finalizers = []string{"example.com/hold"}
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.ExternalIPs = []string{"192.0.2.77"}
			},
			check: func(t *testing.T, old, n *corev1.Service) {
				if n.Labels["team"] != "infra" || n.Annotations["note"] != "keep me" || n.Labels[LabelMachineType] != "host" {
					t.Errorf("meta %v %v", n.Labels, n.Annotations)
				}
				if _, ok := n.Labels[LabelParentID]; ok {
					t.Error("stray parent label kept")
				}
				if _, ok := n.Annotations[AnnotationIPMIPort]; ok {
					t.Error("stray ipmi annotation kept")
				}
				if !reflect.DeepEqual(n.OwnerReferences, []metav1.OwnerReference{otherOwner, testOwner}) {
					t.Errorf("owners %v", n.OwnerReferences)
				}
				if !slices.Equal(n.Finalizers, old.Finalizers) || n.Spec.SessionAffinity != corev1.ServiceAffinityClientIP ||
					!slices.Equal(n.Spec.ExternalIPs, []string{"192.0.2.77"}) {
					t.Errorf("foreign fields lost: %+v", n)
				}
			},
		},
		{
			name: "stale owner ref to the re-created Deployment replaced, foreign kept",
			mode: IPModeClusterIP,
			mutate: func(s *corev1.Service) {
				stale := testOwner
				stale.UID = "old-deployment-uid"
				s.OwnerReferences = []metav1.OwnerReference{stale, otherOwner}
			},
			check: func(t *testing.T, _, n *corev1.Service) {
				if !reflect.DeepEqual(n.OwnerReferences, []metav1.OwnerReference{testOwner, otherOwner}) {
					t.Errorf("owners %v", n.OwnerReferences)
				}
			},
		},
		{
			name: "NodePort turned back into ClusterIP",
			mode: IPModeClusterIP,
			mutate: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				for i := range s.Spec.Ports {
					s.Spec.Ports[i].NodePort = 30000 + int32(i)
				}
			},
			check: func(t *testing.T, _, n *corev1.Service) {
				if n.Spec.Type != corev1.ServiceTypeClusterIP || n.Spec.ExternalTrafficPolicy != "" || n.Spec.Ports[0].NodePort != 0 {
					t.Errorf("spec %+v", n.Spec)
				}
			},
		},
		{
			name: "selector and ports restored, extra port dropped",
			mode: IPModeClusterIP,
			mutate: func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{"app": "other"}
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "http", Port: 80})
			},
			check: func(t *testing.T, _, n *corev1.Service) {
				if n.Spec.Selector["app"] != "machine-a-tron" || len(n.Spec.Ports) != 2 {
					t.Errorf("spec %+v", n.Spec)
				}
			},
		},
		{
			name: "external-ip: externalIPs restored, assigned clusterIP kept",
			mode: IPModeExternalIP,
			mutate: func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"10.96.64.10", "192.0.2.5"}
			},
			check: func(t *testing.T, old, n *corev1.Service) {
				if !slices.Equal(n.Spec.ExternalIPs, []string{"10.96.64.10"}) || n.Spec.ClusterIP != old.Spec.ClusterIP {
					t.Errorf("spec %+v", n.Spec)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(tc.mode)
			api := deployed(t, "v2-mixed.json", testInstance(), opts)
			existing := api.list()
			i := slices.IndexFunc(existing, func(s *corev1.Service) bool { return s.Name == host922f })
			tc.mutate(existing[i])
			before := make([]*corev1.Service, len(existing))
			for j, s := range existing {
				before[j] = s.DeepCopy()
			}
			d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts)
			p := Diff(d, existing, opts)
			if got := summarize(p); !reflect.DeepEqual(got, pn(nil, []string{host922f}, nil, nil, nil)) {
				t.Fatalf("plan %+v", got)
			}
			u := p.Update[0]
			if u.Old != existing[i] {
				t.Error("Old is not the existing object")
			}
			tc.check(t, u.Old, u.New)
			// New is a deep copy: changing it leaves the input alone.
			u.New.Labels["x"] = "y"
			u.New.Spec.Ports[0].Port = 1
			u.New.OwnerReferences[0].Name = "z"
			if !reflect.DeepEqual(existing, before) {
				t.Error("Diff or its output aliases the existing Services")
			}
			api.apply(Diff(d, api.list(), opts))
			// re-apply after the mutation through the fake API: converges
			cur := api.list()
			cur[slices.IndexFunc(cur, func(s *corev1.Service) bool { return s.Name == host922f })] = existing[i]
			api2 := newFakeAPI(t, cur...)
			api2.apply(Diff(d, api2.list(), opts))
			if p := Diff(d, api2.list(), opts); !p.Empty() {
				t.Errorf("not converged: %+v", summarize(p))
			}
		})
	}
}

// TestDiffModeSwitch: changing --bmc-ip-mode recreates every Service, so the
// BMC IP is released from (or moved into) spec.clusterIP.
func TestDiffModeSwitch(t *testing.T) {
	tests := []struct{ from, to IPMode }{
		{IPModeClusterIP, IPModeExternalIP},
		{IPModeExternalIP, IPModeClusterIP},
	}
	for _, tc := range tests {
		t.Run(string(tc.from)+"->"+string(tc.to), func(t *testing.T) {
			api := deployed(t, "v2-mixed.json", testInstance(), testOptions(tc.from))
			opts := testOptions(tc.to)
			d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts)
			p := Diff(d, api.list(), opts)
			if got := summarize(p); !reflect.DeepEqual(got, pn(nil, nil, v2MixedServices, nil, nil)) {
				t.Fatalf("plan %+v", got)
			}
			for _, r := range p.Recreate {
				ip := ServiceIP(r.Old)
				switch tc.to {
				case IPModeExternalIP:
					if r.New.Spec.ClusterIP != "" || r.New.Spec.ClusterIPs != nil || !slices.Equal(r.New.Spec.ExternalIPs, []string{ip}) {
						t.Errorf("%s: %+v", r.New.Name, r.New.Spec)
					}
				case IPModeClusterIP:
					if r.New.Spec.ClusterIP != ip || r.New.Spec.ExternalIPs != nil {
						t.Errorf("%s: %+v", r.New.Name, r.New.Spec)
					}
				}
				if r.New.Spec.IPFamilies != nil || r.New.Spec.IPFamilyPolicy != nil || r.New.UID != "" || r.New.ResourceVersion != "" ||
					!r.New.CreationTimestamp.IsZero() {
					t.Errorf("%s: server fields kept: %+v", r.New.Name, r.New)
				}
			}
			api.apply(p)
			if p := Diff(d, api.list(), opts); !p.Empty() {
				t.Errorf("not converged: %+v", summarize(p))
			}
		})
	}
}

// TestDiffDoesNotMutateInputs runs a busy diff and checks that neither the
// desired nor the existing Services changed.
func TestDiffDoesNotMutateInputs(t *testing.T) {
	for _, mode := range []IPMode{IPModeClusterIP, IPModeExternalIP} {
		t.Run(string(mode), func(t *testing.T) {
			opts := testOptions(mode)
			existing := deployed(t, "v2-mixed.json", testInstance(), opts).list()
			existing[0].Labels["team"] = "x"
			existing[0].Spec.Type = corev1.ServiceTypeNodePort
			d := Build(testInstance(), loadStatus(t, "v2-generation-bumped.json"), opts)
			wantExisting := make([]*corev1.Service, len(existing))
			for i, s := range existing {
				wantExisting[i] = s.DeepCopy()
			}
			wantDesired := Build(testInstance(), loadStatus(t, "v2-generation-bumped.json"), opts)
			p := Diff(d, existing, opts)
			if p.Empty() {
				t.Fatal("expected work")
			}
			if !reflect.DeepEqual(existing, wantExisting) || !reflect.DeepEqual(d, wantDesired) {
				t.Error("inputs modified")
			}
			for _, c := range p.Create {
				for _, s := range d.Services {
					if c == s {
						t.Error("Create aliases Desired.Services")
					}
				}
			}
		})
	}
}

func TestPlanEmpty(t *testing.T) {
	s := &corev1.Service{}
	tests := []struct {
		name string
		p    Plan
		want bool
	}{
		{"zero", Plan{}, true},
		{"only skipped", Plan{Skipped: []Skip{{Name: "a"}}}, true},
		{"create", Plan{Create: []*corev1.Service{s}}, false},
		{"update", Plan{Update: []Update{{Old: s, New: s}}}, false},
		{"recreate", Plan{Recreate: []Update{{Old: s, New: s}}}, false},
		{"delete", Plan{Delete: []*corev1.Service{s}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Empty(); got != tc.want {
				t.Errorf("Empty() = %v", got)
			}
		})
	}
}
