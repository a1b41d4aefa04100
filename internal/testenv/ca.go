package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test, as cert-manager's CA
// issuer would be in a cluster: it issues server certificates with DNS
// names only.
type CA struct {
	t    testing.TB
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded (what a ca.crt holds).
	PEM []byte
}

// NewCA makes a self-signed ECDSA P-256 CA named cn, valid from an hour
// ago for a day. It fails t on error.
func NewCA(t testing.TB, cn string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{t: t, cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool returns a pool holding only the CA.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// WriteFile writes the CA certificate (PEM) to a file in a fresh temporary
// folder and returns its path.
func (c *CA) WriteFile() string {
	c.t.Helper()
	path := filepath.Join(c.t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, c.PEM, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return path
}

// Issue returns a server certificate for dnsNames (no IP addresses, no
// common name), signed by the CA, with its leaf set.
func (c *CA) Issue(dnsNames ...string) tls.Certificate {
	c.t.Helper()
	return c.issue(&x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: dnsNames})
}

// IssueIP returns a server certificate for DNS names and IP addresses
// (e.g. "localhost", "127.0.0.1"), signed by the CA, with its leaf set.
func (c *CA) IssueIP(names ...string) tls.Certificate {
	c.t.Helper()
	tmpl := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	return c.issue(tmpl)
}

// issue signs tmpl (its names and key usage) for a day with a new key.
func (c *CA) issue(tmpl *x509.Certificate) tls.Certificate {
	c.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		c.t.Fatal(err)
	}
	now := time.Now()
	tmpl.SerialNumber = serial(c.t)
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		c.t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		c.t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// KeyPairPEM returns cert's chain and key as PEM (what a cert-manager
// Secret's tls.crt and tls.key hold).
func (c *CA) KeyPairPEM(cert tls.Certificate) (certPEM, keyPEM []byte) {
	c.t.Helper()
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		c.t.Fatal(err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// IssueClient returns a client certificate for cn in the organizations
// orgs (Kubernetes takes them as user name and groups), signed by the CA,
// with its leaf set.
func (c *CA) IssueClient(cn string, orgs ...string) tls.Certificate {
	c.t.Helper()
	return c.issue(&x509.Certificate{Subject: pkix.Name{CommonName: cn, Organization: orgs}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// WriteKeyPair writes cert's chain and key as PEM files (tls.crt, tls.key,
// cert-manager's names) to a fresh temporary folder and returns their paths.
func (c *CA) WriteKeyPair(cert tls.Certificate) (certFile, keyFile string) {
	c.t.Helper()
	dir := c.t.TempDir()
	chain, key := c.KeyPairPEM(cert)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, chain, 0o600); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return certFile, keyFile
}

// DialRoutes returns a dial function (matclient.Config.DialContext's
// shape) that connects an address found in routes ("host:port" → the
// "127.0.0.1:port" to dial instead) to its route and every other address as
// it is: DNS names of a cluster resolved to local servers without a
// resolver. routes must not change afterwards.
func DialRoutes(routes map[string]string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if to, ok := routes[addr]; ok {
			addr = to
		}
		return d.DialContext(ctx, network, addr)
	}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
