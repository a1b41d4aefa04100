package operator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/matbus/matbus/plan"
)

// TestFetchHint: check's hints name the flags that fix a refused
// certificate and a cluster DNS name looked up outside the cluster, and
// add nothing to other errors.
func TestFetchHint(t *testing.T) {
	dns := fmt.Errorf("matclient: GET https://mat-0-bmc-mock.ns.svc.cluster.local:1266/machines/status: %w",
		&net.DNSError{Err: "no such host", Name: "mat-0-bmc-mock.ns.svc.cluster.local", IsNotFound: true})
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"unknown authority", fmt.Errorf("x: %w", x509.UnknownAuthorityError{}), "--mat-ca-file"},
		{"name mismatch", &tls.CertificateVerificationError{Err: x509.HostnameError{Host: "b", Certificate: &x509.Certificate{DNSNames: []string{"a"}}}}, "--insecure-skip-verify"},
		{"cluster DNS name", dns, "--mat-host-mode cluster-ip"},
		{"other DNS name", &net.DNSError{Err: "no such host", Name: "mat.example.com"}, ""},
		{"refused", errors.New("connect: connection refused"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fetchHint(tc.err, "cluster.local")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("fetchHint = %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// TestCheckNamespace: a namespace that does not exist is a failure naming
// it and how to create it, and the externalIPs row then blames it, not an
// admission plugin; an identity that may not get namespaces gets a
// warning; an existing namespace is ok.
func TestCheckNamespace(t *testing.T) {
	for _, tc := range []struct {
		name      string
		exists    bool
		forbidden bool
		nsRow     CheckRow
		extIPs    string // part of the externalIPs admitted row
	}{
		{"exists", true, false, CheckRow{"namespace", CheckOK, "ghost exists"}, "was accepted"},
		{"missing", false, false, CheckRow{"namespace", CheckFail, `namespace "ghost" does not exist, so every Service create fails: create it (kubectl create namespace ghost) or set --namespace`},
			`cannot tell: namespace "ghost" does not exist (see the namespace row): namespaces "ghost" not found`},
		{"forbidden", true, true, CheckRow{"namespace", CheckWarn, "could not verify that ghost exists: this identity may not get namespaces (matbus does not need to)"}, "was accepted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewSimpleClientset()
			if tc.exists {
				if _, err := kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ghost"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				// The API server refuses a create in a namespace that is not there.
				kube.PrependReactor("create", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "ghost")
				})
			}
			if tc.forbidden {
				kube.PrependReactor("get", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "ghost", errors.New("no"))
				})
			}
			c := &checker{cfg: CheckConfig{Options: plan.Options{Namespace: "ghost", IPMode: plan.IPModeExternalIP}}, kube: kube}
			c.checkNamespace(context.Background())
			c.checkExternalIPs(context.Background(), nil)
			if len(c.rows) < 2 || c.rows[0] != tc.nsRow {
				t.Fatalf("rows %+v, want first %+v", c.rows, tc.nsRow)
			}
			ext := c.rows[1]
			if ext.Name != "externalIPs admitted" || !strings.Contains(ext.Detail, tc.extIPs) || strings.Contains(ext.Detail, "DenyServiceExternalIPs") {
				t.Errorf("externalIPs row %+v, want one containing %q, not blaming an admission plugin", ext, tc.extIPs)
			}
			if !tc.exists && ext.Result == CheckFail {
				t.Errorf("externalIPs row %+v: the namespace row is the failure, not this one", ext)
			}
		})
	}
}
