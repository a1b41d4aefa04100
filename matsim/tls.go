package matsim

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"github.com/matbus/matbus/internal/reload"
	"math/big"
	"net"
	"time"
)

// selfSignedCert makes a self-signed ECDSA P-256 certificate for
// 127.0.0.1, ::1, localhost and names (host names or IP addresses), valid
// from an hour before now for 30 days, like the self-signed certificates
// real MAT instances serve.
func selfSignedCert(names []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("matsim: tls key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("matsim: tls serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "matsim", Organization: []string{"matbus matsim"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // self-signed: it is its own trust anchor
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if n != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("matsim: tls certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("matsim: tls certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// serverCert returns the certificate New serves: the given one, the one
// of the given files (and the files, kept current), a self-signed one with
// opts.TLS, or nil (plain HTTP). The returned certificate's Leaf is set.
func serverCert(opts Options) (*tls.Certificate, *reload.KeyPair, error) {
	files := opts.TLSCertFile != "" || opts.TLSKeyFile != ""
	switch {
	case files && (opts.TLSCertFile == "" || opts.TLSKeyFile == ""):
		return nil, nil, errors.New("matsim: TLSCertFile and TLSKeyFile go together (both or neither)")
	case files && opts.TLSCertificate != nil:
		return nil, nil, errors.New("matsim: TLSCertificate and TLSCertFile/TLSKeyFile are mutually exclusive")
	case files:
		pair, err := reload.NewKeyPair(reload.KeyPairConfig{CertFile: opts.TLSCertFile, KeyFile: opts.TLSKeyFile,
			Name: "TLS certificate " + opts.TLSCertFile + ", key " + opts.TLSKeyFile, Log: opts.Logger})
		if err != nil {
			return nil, nil, fmt.Errorf("matsim: %w", err)
		}
		cert := pair.Current()
		return &cert, pair, nil
	case opts.TLSCertificate != nil:
		cert, err := withLeaf(*opts.TLSCertificate)
		return cert, nil, err
	case opts.TLS:
		cert, err := selfSignedCert(opts.TLSNames, time.Now())
		if err != nil {
			return nil, nil, err
		}
		return &cert, nil, nil
	}
	return nil, nil, nil
}

func withLeaf(cert tls.Certificate) (*tls.Certificate, error) {
	if len(cert.Certificate) == 0 {
		return nil, errors.New("matsim: TLS certificate without a certificate")
	}
	if cert.Leaf == nil {
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("matsim: TLS certificate: %w", err)
		}
		cert.Leaf = leaf
	}
	return &cert, nil
}
