package plan

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/matbus/matbus/matclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// fixtureDir holds the MAT status fixtures (copies of
// shared/fixtures/mat-status kept by matclient).
const fixtureDir = "../matclient/testdata"

// loadStatus decodes a fixture with matclient.Decode.
func loadStatus(t testing.TB, name string) *matclient.Status {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(fixtureDir, name))
	if err != nil {
		t.Fatal(err)
	}
	st, err := matclient.Decode(body)
	if err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
	return st
}

// testOwner is the MAT Deployment of testInstance.
var testOwner = metav1.OwnerReference{
	APIVersion: "apps/v1", Kind: "Deployment", Name: "mat",
	UID: "d-uid-1", Controller: new(true), BlockOwnerDeletion: new(true),
}

func testInstance() Instance {
	o := testOwner
	return Instance{Key: "mat-ns.mat-bmc-mock", Owner: &o}
}

func testOptions(mode IPMode) Options {
	return Options{
		Namespace:      "bmc",
		IPMode:         mode,
		TargetSelector: map[string]string{"app": "machine-a-tron"},
	}
}

// device finds the device whose mat_id starts with prefix.
func device(t testing.TB, st *matclient.Status, prefix string) *matclient.Device {
	t.Helper()
	var found *matclient.Device
	st.Walk(func(d, _ *matclient.Device) {
		if len(d.MatID) >= len(prefix) && d.MatID[:len(prefix)] == prefix {
			found = d
		}
	})
	if found == nil {
		t.Fatalf("no device %s…", prefix)
	}
	return found
}

// names returns the names of svcs, in order.
func names(svcs []*corev1.Service) []string {
	out := make([]string, 0, len(svcs))
	for _, s := range svcs {
		out = append(out, s.Name)
	}
	return out
}

func updateNames(us []Update) []string {
	out := make([]string, 0, len(us))
	for _, u := range us {
		out = append(out, u.Old.Name)
	}
	return out
}

// checkValid fails t for any name, label key or label value of svc that
// apimachinery's validation rejects.
func checkValid(t testing.TB, svc *corev1.Service) {
	t.Helper()
	if errs := validation.IsDNS1035Label(svc.Name); len(errs) > 0 {
		t.Errorf("name %q: %v", svc.Name, errs)
	}
	for k, v := range svc.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s: label key %q: %v", svc.Name, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: label %s=%q: %v", svc.Name, k, v, errs)
		}
	}
	for k, v := range svc.Spec.Selector {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: selector %s=%q: %v", svc.Name, k, v, errs)
		}
	}
}

// fakeAPI applies plans the way the API server would, and fails the test
// on anything the API server would reject (AlreadyExists, stale
// resourceVersion or UID precondition, clusterIP change, IP already
// allocated, resourceVersion on create). It sets server defaults, so that
// Diff must ignore them.
type fakeAPI struct {
	t    testing.TB
	svcs map[string]*corev1.Service
	seq  int
}

func newFakeAPI(t testing.TB, existing ...*corev1.Service) *fakeAPI {
	a := &fakeAPI{t: t, svcs: map[string]*corev1.Service{}}
	for _, s := range existing {
		a.svcs[s.Name] = s.DeepCopy()
	}
	return a
}

// list returns deep copies of the stored Services, sorted by name.
func (a *fakeAPI) list() []*corev1.Service {
	out := make([]*corev1.Service, 0, len(a.svcs))
	for _, s := range a.svcs {
		out = append(out, s.DeepCopy())
	}
	slices.SortFunc(out, func(x, y *corev1.Service) int {
		if x.Name < y.Name {
			return -1
		}
		return 1
	})
	return out
}

func (a *fakeAPI) next() int { a.seq++; return a.seq }

func (a *fakeAPI) create(s *corev1.Service) {
	a.t.Helper()
	if _, ok := a.svcs[s.Name]; ok {
		a.t.Fatalf("create %s: AlreadyExists", s.Name)
	}
	if s.UID != "" || s.ResourceVersion != "" {
		a.t.Fatalf("create %s: uid %q / resourceVersion %q set", s.Name, s.UID, s.ResourceVersion)
	}
	n := s.DeepCopy()
	n.UID = types.UID(fmt.Sprintf("uid-%d", a.next()))
	n.ResourceVersion = strconv.Itoa(a.next())
	n.CreationTimestamp = metav1.Unix(int64(a.seq), 0)
	if n.Spec.ClusterIP == "" {
		i := a.next()
		n.Spec.ClusterIP = fmt.Sprintf("10.0.%d.%d", i/200, i%200+1)
	}
	for _, o := range a.svcs {
		if o.Spec.ClusterIP == n.Spec.ClusterIP {
			a.t.Fatalf("create %s: provided IP %s is already allocated (to %s)", n.Name, n.Spec.ClusterIP, o.Name)
		}
	}
	n.Spec.ClusterIPs = []string{n.Spec.ClusterIP}
	n.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	n.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicySingleStack)
	n.Spec.SessionAffinity = corev1.ServiceAffinityNone
	n.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyCluster)
	a.trafficPolicy(n, "create")
	a.svcs[n.Name] = n
}

// trafficPolicy defaults and validates spec.externalTrafficPolicy as the
// API server does: Cluster on an externally accessible Service (external
// IPs, NodePort, LoadBalancer), refused on any other.
func (a *fakeAPI) trafficPolicy(n *corev1.Service, verb string) {
	a.t.Helper()
	external := len(n.Spec.ExternalIPs) > 0 || n.Spec.Type == corev1.ServiceTypeNodePort || n.Spec.Type == corev1.ServiceTypeLoadBalancer
	switch {
	case external && n.Spec.ExternalTrafficPolicy == "":
		n.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	case !external && n.Spec.ExternalTrafficPolicy != "":
		a.t.Fatalf("%s %s: spec.externalTrafficPolicy %q may only be set for externally-accessible services", verb, n.Name, n.Spec.ExternalTrafficPolicy)
	}
}

func (a *fakeAPI) update(u Update) {
	a.t.Helper()
	cur, ok := a.svcs[u.New.Name]
	switch {
	case !ok:
		a.t.Fatalf("update %s: NotFound", u.New.Name)
	case cur.UID != u.New.UID || cur.ResourceVersion != u.New.ResourceVersion:
		a.t.Fatalf("update %s: Conflict (uid %s rv %s, have %s %s)", u.New.Name, u.New.UID, u.New.ResourceVersion, cur.UID, cur.ResourceVersion)
	case cur.Spec.ClusterIP != u.New.Spec.ClusterIP:
		a.t.Fatalf("update %s: spec.clusterIP is immutable (%s -> %s)", u.New.Name, cur.Spec.ClusterIP, u.New.Spec.ClusterIP)
	}
	n := u.New.DeepCopy()
	n.ResourceVersion = strconv.Itoa(a.next())
	a.trafficPolicy(n, "update")
	a.svcs[n.Name] = n
}

func (a *fakeAPI) delete(s *corev1.Service) {
	a.t.Helper()
	cur, ok := a.svcs[s.Name]
	if !ok || cur.UID != s.UID {
		a.t.Fatalf("delete %s: precondition failed (uid %s)", s.Name, s.UID)
	}
	delete(a.svcs, s.Name)
}

func (a *fakeAPI) apply(p Plan) {
	a.t.Helper()
	for _, s := range p.Delete {
		a.delete(s)
	}
	for _, u := range p.Recreate {
		a.delete(u.Old)
		a.create(u.New)
	}
	for _, u := range p.Update {
		a.update(u)
	}
	for _, s := range p.Create {
		a.create(s)
	}
}
