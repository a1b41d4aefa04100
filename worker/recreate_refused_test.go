package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/matsim"
)

// denyClusterIP installs a ValidatingAdmissionPolicy and its binding that
// refuse the create of a Service of the test's namespace with cluster IP
// ip, as a cluster's policy engine or webhook may, and waits until the API
// server applies it. Both are removed when the test ends.
func (e *env) denyClusterIP(ip string) {
	e.t.Helper()
	name := "deny-" + e.ns
	fail := admissionv1.Fail
	api := e.kube.AdmissionregistrationV1()
	policy := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}},
				}}}},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("object.spec.clusterIP != '%s'", ip),
				Message:    "the test's policy refuses cluster IP " + ip,
			}},
		}}
	if _, err := api.ValidatingAdmissionPolicies().Create(e.ctx, policy, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns}}},
		}}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(e.ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = api.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = api.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})
	waitFor(e.t, "the policy in force", func() (bool, string) {
		_, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, svcWithIP("probe-policy", ip), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "the test's policy") {
			return true, ""
		}
		if apierrors.IsAlreadyExists(err) {
			e.t.Fatal(err)
		}
		return false, fmt.Sprint(err)
	})
}

// TestRefusedRecreateIsHeldBack: a device's new IP means a recreate; the
// API server takes the delete but refuses the replacement (an admission
// policy here). The old Service is put back once and, at the next syncs,
// the same replacement is held back: one delete in all, not one per sync,
// so the BMC keeps its route. A changed replacement (yet another IP) is
// tried at once.
func TestRefusedRecreateIsHeldBack(t *testing.T) {
	e := newEnv(t)
	sim := e.startSim(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed)})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	w := e.startWorker(workerOpts{})
	e.waitServices(v2MixedNames()...)

	const (
		name      = "mat-bmc-host-7ec7b7c3-126-c030b365" // BMC 10.96.64.13
		matID     = "7ec7b7c3-126b-412a-babf-fd79d002e921"
		refusedIP = "10.96.64.51"
		laterIP   = "10.96.64.52"
	)
	e.denyClusterIP(refusedIP)
	life := e.watchServiceLife()
	if err := sim.SetBMCIP(matID, refusedIP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a permanent create error: the replacement refused, the old Service put back", func() (bool, string) {
		for _, ev := range e.errs.Of(errKind("create")) {
			if ev.Service == e.ns+"/"+name && ev.Permanent && hasAll(ev.Message, "the test's policy", "put back") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("create events: %+v", e.errs.Of(errKind("create")))
	})
	waitSyncs(t, w, 4)
	if s := e.service(name); s == nil || s.Spec.ClusterIP != "10.96.64.13" {
		t.Fatalf("Service after the refused recreate: %+v", s)
	}
	if n := len(life.gaps()[name]); n != 1 {
		t.Errorf("%d deletes of %s over 4 syncs, want 1 (a refused replacement held back)", n, name)
	}

	if err := sim.SetBMCIP(matID, laterIP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the changed replacement tried at once", func() (bool, string) {
		s := e.service(name)
		if s == nil {
			return false, "missing"
		}
		return s.Spec.ClusterIP == laterIP, "clusterIP " + s.Spec.ClusterIP
	})
	if st := w.Stats(); st.Recreated != 1 {
		t.Errorf("stats = %+v, want 1 recreate", st)
	}
}
