package plan

import (
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/matbus/matbus/matclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// oldControllerDir holds services.json: the Services the old polling
// controller itself wrote for three status fixtures (a copy of
// shared/fixtures/old-controller, with its README).
const oldControllerDir = "testdata/old-controller"

// goldenInstance is one MAT instance of the old controller's fixture run.
type goldenInstance struct {
	service, pod, fixture string
}

// goldenInstances are the fixture run's instances (README of
// testdata/old-controller): discovered Service, its pod-name label (also
// the Deployment), status body.
var goldenInstances = []goldenInstance{
	{"mat-0-bmc-mock", "mat-0", "v2-mixed.json"},
	{"mat-1-bmc-mock", "mat-1", "legacy-small.json"},
	{"mat-2-bmc-mock", "mat-2", "long-ids.json"},
}

// goldenServiceRange is the service range of the fixture run's API server.
var goldenServiceRange = netip.MustParsePrefix("10.96.0.0/12")

// additionLabels and additionAnnotations are matbus's documented additions
// to the old controller's Service (docs/adr/0014): nothing else may differ.
// AnnotationSSHPort and the "ssh" port are the newer controller's (the
// fixture's version ignored bmc.ssh): present exactly when MAT advertises
// SSH, never in place of another port.
var (
	additionLabels      = []string{LabelInstance, LabelDeviceKind, LabelPodName}
	additionAnnotations = []string{AnnotationMatID, AnnotationSSHPort}
)

// withoutSSH returns ports without the "ssh" port, and whether it was
// there.
func withoutSSH(ports []corev1.ServicePort) ([]corev1.ServicePort, bool) {
	out := slices.DeleteFunc(slices.Clone(ports), func(p corev1.ServicePort) bool { return p.Name == PortSSH })
	return out, len(out) != len(ports)
}

// loadOldServices reads services.json, keyed by name, each in namespace
// "golden" with a UID and its owner's UID set as the API server would.
func loadOldServices(t testing.TB) map[string]*corev1.Service {
	t.Helper()
	body, err := os.ReadFile(oldControllerDir + "/services.json")
	if err != nil {
		t.Fatal(err)
	}
	var list corev1.ServiceList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("services.json: %v", err)
	}
	out := make(map[string]*corev1.Service, len(list.Items))
	for i := range list.Items {
		s := &list.Items[i]
		s.Namespace = "golden"
		s.UID = types.UID("uid-" + s.Name)
		s.ResourceVersion = "1"
		for j := range s.OwnerReferences {
			s.OwnerReferences[j].UID = goldenOwnerUID(s.OwnerReferences[j].Name)
		}
		out[s.Name] = s
	}
	if len(out) != 17 {
		t.Fatalf("services.json has %d Services, want the 17 the old controller made", len(out))
	}
	return out
}

func goldenOwnerUID(deployment string) types.UID { return types.UID("deploy-uid-" + deployment) }

// goldenOptions are matbus's defaults in the fixture run's namespace.
func goldenOptions() Options {
	k, v, _ := strings.Cut(DefaultTargetSelector, "=")
	return Options{Namespace: "golden", IPMode: IPModeClusterIP, TargetSelector: map[string]string{k: v}, StateAnnotations: true}
}

func goldenBuild(t testing.TB, gi goldenInstance) Desired {
	t.Helper()
	inst := Instance{
		Key:     "golden." + gi.service,
		PodName: gi.pod,
		Owner:   &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: gi.pod, UID: goldenOwnerUID(gi.pod)},
	}
	return Build(inst, loadStatus(t, gi.fixture), goldenOptions())
}

// withoutKeys returns a copy of m without keys.
func withoutKeys(m map[string]string, keys []string) map[string]string {
	c := maps.Clone(m)
	for _, k := range keys {
		delete(c, k)
	}
	return c
}

// oldRuleFails says why the old controller's create of want failed, or ""
// when it would have succeeded: its name rule (no sanitising) gives an
// invalid name, its label values are raw and so may be invalid, and in
// ClusterIP mode the IP must lie in the service range.
func oldRuleFails(want *corev1.Service, matID string, parentID string) string {
	typ := MachineType(want.Labels[LabelDeviceKind])
	id := matID
	if len(id) > legacyIDBytes {
		id = id[:legacyIDBytes] + "-" + hash8(matID)
	}
	oldName := "mat-bmc-" + typ.nameToken() + "-" + id
	if errs := validation.IsDNS1035Label(oldName); len(errs) > 0 {
		return "name " + oldName + ": " + strings.Join(errs, "; ")
	}
	for _, v := range []string{matID, parentID} {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return "label value " + v + ": " + strings.Join(errs, "; ")
		}
	}
	if ip, err := netip.ParseAddr(want.Spec.ClusterIP); err != nil || !goldenServiceRange.Contains(ip) {
		return "IP " + want.Spec.ClusterIP + " outside the service range"
	}
	return ""
}

// TestOldControllerContract: for the old controller's own fixture run,
// every Service it wrote is built by matbus with exactly its labels,
// annotations, selector, ports, IPs and owner, plus only the documented
// additions (with their values); a Service it wrote without a BMC IP
// belongs to a device that matbus holds back (HoldNoBMCIP); and every
// Service matbus builds beyond those is one whose create the old
// controller's own rules made fail.
func TestOldControllerContract(t *testing.T) {
	old := loadOldServices(t)
	seen := map[string]bool{}
	for _, gi := range goldenInstances {
		t.Run(gi.service, func(t *testing.T) {
			d := goldenBuild(t, gi)
			held := map[string]HoldReason{}
			for _, h := range d.Held {
				held[h.Name] = h.Reason
			}
			parentOf := map[string]string{}
			st := loadStatus(t, gi.fixture)
			st.Walk(func(dev, parent *matclient.Device) {
				if parent != nil {
					parentOf[dev.MatID] = parent.MatID
				}
			})
			for _, want := range d.Services {
				checkValid(t, want)
				o, ok := old[want.Name]
				matID := want.Annotations[AnnotationMatID]
				if !ok && want.Labels[LabelDeviceKind] == string(MachineTypeNVOS) {
					t.Logf("%s: the newer controller's NVOS Service", want.Name)
					continue
				}
				if !ok {
					if why := oldRuleFails(want, matID, parentOf[matID]); why == "" {
						t.Errorf("%s (mat_id %q): the old controller made no such Service, but its rules would have", want.Name, matID)
					} else {
						t.Logf("%s: beyond the old controller (%s)", want.Name, why)
					}
					continue
				}
				seen[want.Name] = true
				if got := o.OwnerReferences[0].Name; got != gi.pod {
					t.Fatalf("%s: fixture owner %s, built for %s", want.Name, got, gi.pod)
				}
				compareWithOld(t, o, want, gi)
			}
			for name, o := range old {
				if o.OwnerReferences[0].Name != gi.pod || seen[name] {
					continue
				}
				if _, hasIP := o.Annotations[AnnotationBMCIP]; hasIP {
					t.Errorf("%s: the old controller made it with a BMC IP, matbus builds no such Service", name)
					continue
				}
				if held[name] != HoldNoBMCIP {
					t.Errorf("%s: the old controller made it without a BMC IP; matbus holds it as %q, want %q", name, held[name], HoldNoBMCIP)
				}
				seen[name] = true
			}
		})
	}
	for name := range old {
		if !seen[name] {
			t.Errorf("%s of services.json is neither built nor held", name)
		}
	}
}

// compareWithOld checks want (built) against o (the old controller's) on
// every field the old controller wrote.
func compareWithOld(t *testing.T, o, want *corev1.Service, gi goldenInstance) {
	t.Helper()
	if got, exp := withoutKeys(want.Labels, additionLabels), o.Labels; !maps.Equal(got, exp) {
		t.Errorf("%s: labels\n got %v\nwant %v", want.Name, got, exp)
	}
	if got, exp := withoutKeys(want.Annotations, additionAnnotations), o.Annotations; !maps.Equal(got, exp) {
		t.Errorf("%s: annotations\n got %v\nwant %v", want.Name, got, exp)
	}
	// The additions carry what ADR 14 says.
	matID := want.Annotations[AnnotationMatID]
	if want.Labels[LabelInstance] != "golden."+gi.service || want.Labels[LabelPodName] != gi.pod ||
		MachineType(want.Labels[LabelDeviceKind]).ContractType() != o.Labels[LabelMachineType] ||
		LabelValue(matID) != o.Labels[LabelMatID] {
		t.Errorf("%s: additions %v / mat_id %q do not fit the contract labels %v", want.Name, want.Labels, matID, o.Labels)
	}
	if !maps.Equal(want.Spec.Selector, o.Spec.Selector) {
		t.Errorf("%s: selector %v, want %v", want.Name, want.Spec.Selector, o.Spec.Selector)
	}
	ports, ssh := withoutSSH(want.Spec.Ports)
	if !reflect.DeepEqual(ports, o.Spec.Ports) {
		t.Errorf("%s: ports %+v, want %+v (and ssh when advertised)", want.Name, want.Spec.Ports, o.Spec.Ports)
	}
	if _, ann := want.Annotations[AnnotationSSHPort]; ssh != ann {
		t.Errorf("%s: ssh port %v, %s %v", want.Name, ssh, AnnotationSSHPort, ann)
	}
	if want.Spec.ClusterIP != o.Spec.ClusterIP || !slices.Equal(want.Spec.ClusterIPs, o.Spec.ClusterIPs) || len(want.Spec.ExternalIPs) != 0 {
		t.Errorf("%s: IPs %s %v %v, want %s %v", want.Name, want.Spec.ClusterIP, want.Spec.ClusterIPs, want.Spec.ExternalIPs, o.Spec.ClusterIP, o.Spec.ClusterIPs)
	}
	if serviceType(want) != serviceType(o) {
		t.Errorf("%s: type %s, want %s", want.Name, want.Spec.Type, o.Spec.Type)
	}
	if !reflect.DeepEqual(want.OwnerReferences, o.OwnerReferences) {
		t.Errorf("%s: owner references %+v, want %+v", want.Name, want.OwnerReferences, o.OwnerReferences)
	}
}

// TestAdoptOldControllerServices: Diff over the old controller's own
// Services changes nothing of the contract: one update per adopted Service
// that only adds the documented additions (no selector, port, IP or owner
// change, no create, recreate or delete of any of them), the Services
// without a BMC IP are left alone, and a second Diff over the result is
// empty.
func TestAdoptOldControllerServices(t *testing.T) {
	old := loadOldServices(t)
	all := slices.Collect(maps.Values(old))
	for _, gi := range goldenInstances {
		t.Run(gi.service, func(t *testing.T) {
			d := goldenBuild(t, gi)
			p := Diff(d, all, goldenOptions())
			if len(p.Recreate) > 0 || len(p.Delete) > 0 || len(p.Skipped) > 0 {
				t.Fatalf("recreate %d, delete %d, skipped %+v: want none", len(p.Recreate), len(p.Delete), p.Skipped)
			}
			for _, c := range p.Create {
				if _, ok := old[c.Name]; ok {
					t.Errorf("create of %s, which the old controller made", c.Name)
				}
			}
			updated := map[string]bool{}
			for _, u := range p.Update {
				updated[u.Old.Name] = true
				o := old[u.Old.Name]
				if o == nil || u.Old != o {
					t.Fatalf("update of %s, not an old controller's Service", u.Old.Name)
				}
				spec := u.New.Spec.DeepCopy()
				spec.Ports, _ = withoutSSH(spec.Ports)
				if !reflect.DeepEqual(*spec, o.Spec) {
					t.Errorf("%s: adoption changes the spec beyond an ssh port\n got %+v\nwant %+v", o.Name, u.New.Spec, o.Spec)
				}
				if !reflect.DeepEqual(u.New.OwnerReferences, o.OwnerReferences) || u.New.UID != o.UID || u.New.ResourceVersion != o.ResourceVersion {
					t.Errorf("%s: adoption changes owner, UID or resourceVersion", o.Name)
				}
				if got := withoutKeys(u.New.Labels, additionLabels); !maps.Equal(got, o.Labels) {
					t.Errorf("%s: adoption changes contract labels: %v, want %v", o.Name, got, o.Labels)
				}
				if got := withoutKeys(u.New.Annotations, additionAnnotations); !maps.Equal(got, o.Annotations) {
					t.Errorf("%s: adoption changes contract annotations: %v, want %v", o.Name, got, o.Annotations)
				}
			}
			for name, o := range old {
				_, hasIP := o.Annotations[AnnotationBMCIP]
				if o.OwnerReferences[0].Name == gi.pod && hasIP != updated[name] {
					t.Errorf("%s (BMC IP %v): adopted %v", name, hasIP, updated[name])
				}
			}

			// Applied, the next Diff has nothing to do for these Services.
			after := make([]*corev1.Service, 0, len(all))
			for _, s := range all {
				n := s
				for _, u := range p.Update {
					if u.Old == s {
						n = u.New
					}
				}
				after = append(after, n)
			}
			after = append(after, p.Create...)
			if p2 := Diff(d, after, goldenOptions()); !p2.Empty() {
				t.Errorf("second Diff: %d creates, %d updates, %d recreates, %d deletes", len(p2.Create), len(p2.Update), len(p2.Recreate), len(p2.Delete))
			}
		})
	}
}

// legacyForm returns svc as a matbus version before the contract wrote it:
// matbus.io/* keys only.
func legacyForm(svc *corev1.Service) *corev1.Service {
	s := svc.DeepCopy()
	ren := func(m map[string]string, from, to string) {
		if v, ok := m[from]; ok {
			delete(m, from)
			m[to] = v
		}
	}
	ren(s.Labels, LabelMatID, legacyLabelMatID)
	ren(s.Labels, LabelMachineID, legacyLabelMachineID)
	ren(s.Labels, LabelParentID, legacyLabelParentID)
	delete(s.Labels, LabelMachineType) // legacy matbus.io/machine-type is LabelDeviceKind
	for k, v := range map[string]string{
		AnnotationBMCIP: legacyAnnBMCIP, AnnotationNVOSIP: legacyAnnNVOSIP, AnnotationAPIState: legacyAnnAPIState,
		AnnotationPowerState: legacyAnnPowerState, AnnotationHardwareType: legacyAnnHardwareType,
		AnnotationRedfishPort: legacyAnnRedfishPort, AnnotationIPMIPort: legacyAnnIPMIPort, AnnotationSSHPort: legacyAnnSSHPort,
	} {
		ren(s.Annotations, k, v)
	}
	return s
}

// TestLegacyMatbusServicesConverge: Services written by matbus before the
// contract (matbus.io/* keys only) are updated in place — same UID, no
// recreate, no delete — to exactly what Build asks for: contract keys
// written, legacy keys gone, foreign keys kept.
func TestLegacyMatbusServicesConverge(t *testing.T) {
	for _, mode := range []IPMode{IPModeClusterIP, IPModeExternalIP} {
		t.Run(string(mode), func(t *testing.T) {
			opts := testOptions(mode)
			d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), opts)
			var existing []*corev1.Service
			for i, want := range d.Services {
				s := legacyForm(want)
				s.UID = types.UID("uid-" + s.Name)
				s.Labels["team.example.com/owner"] = "infra"
				if mode == IPModeExternalIP {
					s.Spec.ClusterIP = "10.100.200." + string(rune('1'+i%9))
				}
				if _, ok := s.Labels[LabelMatID]; ok {
					t.Fatalf("%s: legacy form still has %s", s.Name, LabelMatID)
				}
				existing = append(existing, s)
			}
			p := Diff(d, existing, opts)
			if len(p.Create)+len(p.Recreate)+len(p.Delete) > 0 || len(p.Update) != len(d.Services) {
				t.Fatalf("create %d recreate %d delete %d update %d, want %d updates only",
					len(p.Create), len(p.Recreate), len(p.Delete), len(p.Update), len(d.Services))
			}
			for i, u := range p.Update {
				want := d.Services[i]
				if u.New.UID != u.Old.UID {
					t.Errorf("%s: UID changed", want.Name)
				}
				if got := withoutKeys(u.New.Labels, []string{"team.example.com/owner"}); !maps.Equal(got, want.Labels) {
					t.Errorf("%s: labels %v, want %v", want.Name, got, want.Labels)
				}
				if !maps.Equal(u.New.Annotations, want.Annotations) {
					t.Errorf("%s: annotations %v, want %v", want.Name, u.New.Annotations, want.Annotations)
				}
			}
			applied := make([]*corev1.Service, len(p.Update))
			for i, u := range p.Update {
				applied[i] = u.New
			}
			if p2 := Diff(d, applied, opts); !p2.Empty() {
				t.Errorf("second Diff not empty: %+v", p2)
			}
		})
	}
}
