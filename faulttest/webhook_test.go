package faulttest

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// failWebhook makes the real API server refuse writes (ops; default create
// and update) of the Services in the test namespace that carry matchLabels,
// with HTTP status code, through a validating admission webhook served by
// the test. It is
// how a test injects a persistent server-side failure (e.g. 503) for one
// instance's Services while the API server keeps serving everything else.
type failWebhook struct {
	w      *world
	name   string
	srv    *httptest.Server
	denied atomic.Int64
}

func (w *world) failServices(matchLabels map[string]string, code int32, ops ...admissionregistrationv1.OperationType) *failWebhook {
	w.t.Helper()
	f := &failWebhook{w: w, name: "faulttest-" + w.ns}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(rw, "bad review", http.StatusBadRequest)
			return
		}
		f.denied.Add(1)
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: false,
			Result: &metav1.Status{Code: code, Reason: metav1.StatusReasonServiceUnavailable,
				Message: "faulttest: injected failure"}}
		review.Request = nil
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(review)
	}))
	url := f.srv.URL
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	scope := admissionregistrationv1.NamespacedScope
	none := admissionregistrationv1.SideEffectClassNone
	fail := admissionregistrationv1.Fail
	timeout := int32(5)
	if len(ops) == 0 {
		ops = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: f.name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "fail.faulttest.matbus.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: ops,
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
					Resources: []string{"services"}, Scope: &scope},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": w.ns}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: matchLabels},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := adminKube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(w.ctx, cfg, metav1.CreateOptions{}); err != nil {
		f.srv.Close()
		w.t.Fatalf("create webhook: %v", err)
	}
	w.onStop(f.Remove)
	if !slices.Contains(ops, admissionregistrationv1.Create) {
		time.Sleep(2 * time.Second) // no dry-run probe for other operations
		return f
	}
	// Wait until the API server uses it: a dry-run create is refused.
	probe := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: w.ns, Labels: matchLabels},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "x", Port: 1}}}}
	w.waitFor("webhook active", 30*time.Second, func() (bool, string) {
		_, err := adminKube.CoreV1().Services(w.ns).Create(w.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && apierrors.ReasonForError(err) == metav1.StatusReasonServiceUnavailable, "probe accepted"
	})
	return f
}

// Remove deletes the webhook configuration; later writes are accepted
// again (once the API server has noticed). It is idempotent.
func (f *failWebhook) Remove() {
	err := adminKube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(f.w.ctx, f.name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		f.w.t.Errorf("delete webhook: %v", err)
	}
	f.srv.Close()
}
