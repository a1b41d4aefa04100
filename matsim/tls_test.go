package matsim

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
)

// TestServesGivenCertificateFiles: a certificate and key from PEM files
// (cert-manager's tls.crt and tls.key) are what the server presents, and a
// client verifying the DNS name against the issuing CA accepts it.
func TestServesGivenCertificateFiles(t *testing.T) {
	const name = "mat-0-bmc-mock.golden.svc.cluster.local"
	ca := testenv.NewCA(t, "matsim test CA")
	certFile, keyFile := ca.WriteKeyPair(ca.Issue(name))
	s, raw := start(t, Options{Fixture: []byte(`{"machines":[]}`), TLSCertFile: certFile, TLSKeyFile: keyFile})
	if got := s.Certificate(); got == nil || len(got.DNSNames) != 1 || got.DNSNames[0] != name || len(got.IPAddresses) != 0 {
		t.Fatalf("Certificate() = %v, want the file's (DNS name %s only)", got, name)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" {
		t.Fatalf("URL %q: want https", raw)
	}
	_, port, _ := net.SplitHostPort(u.Host)
	byName := "https://" + net.JoinHostPort(name, port)
	c, err := matclient.New(byName, matclient.Config{Timeout: 5 * time.Second, RootCAs: ca.Pool(),
		DialContext: testenv.DialRoutes(map[string]string{net.JoinHostPort(name, port): u.Host})})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatalf("Status via %s: %v", byName, err)
	}
}

func TestTLSOptionErrors(t *testing.T) {
	ca := testenv.NewCA(t, "matsim test CA")
	cert := ca.Issue("a.example")
	certFile, keyFile := ca.WriteKeyPair(cert)
	fixture := []byte(`{"machines":[]}`)
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"cert without key", Options{TLSCertFile: certFile}, "both or neither"},
		{"key without cert", Options{TLSKeyFile: keyFile}, "both or neither"},
		{"files and certificate", Options{TLSCertFile: certFile, TLSKeyFile: keyFile, TLSCertificate: &cert}, "mutually exclusive"},
		{"key file is the cert", Options{TLSCertFile: certFile, TLSKeyFile: certFile}, certFile},
		{"missing file", Options{TLSCertFile: certFile + ".nope", TLSKeyFile: keyFile}, certFile + ".nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Fixture = fixture
			s, err := New(tc.opts)
			if err == nil {
				_ = s.Close()
				t.Fatal("New accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}
