package operator

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
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
