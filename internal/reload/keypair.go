package reload

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"time"
)

// KeyPairConfig describes a KeyPair.
type KeyPairConfig struct {
	// CertFile is a PEM certificate chain, KeyFile its PEM private key
	// (e.g. a cert-manager Secret's tls.crt and tls.key).
	CertFile, KeyFile string
	// Name names the files in log lines; default CertFile.
	Name string
	// MinInterval and Log are those of Config.
	MinInterval time.Duration
	Log         *slog.Logger
}

// KeyPair is a TLS certificate and key kept current: both files are read
// again when either changes, and taken only when the key matches the
// certificate, so a pair written one file after the other keeps the last
// good pair until both are new.
type KeyPair struct {
	file *File[tls.Certificate]
}

// NewKeyPair reads the pair and returns the KeyPair. Its error names the
// files and says why they are not a usable pair, never their contents.
func NewKeyPair(cfg KeyPairConfig) (*KeyPair, error) {
	f, err := Open(Config[tls.Certificate]{Paths: []string{cfg.CertFile, cfg.KeyFile}, Name: cfg.Name,
		MinInterval: cfg.MinInterval, Log: cfg.Log, Parse: parseKeyPair})
	if err != nil {
		return nil, err
	}
	return &KeyPair{file: f}, nil
}

func parseKeyPair(data ...[]byte) (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(data[0], data[1])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("not a usable certificate and key: %w", err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("certificate: %w", err)
		}
	}
	return cert, nil
}

// File returns the pair's File.
func (k *KeyPair) File() *File[tls.Certificate] { return k.file }

// Current looks at the files now and returns the pair in use: the new
// one if they changed and match, else the last good one. For callers that
// ask once per connection.
func (k *KeyPair) Current() tls.Certificate {
	k.file.Reload()
	return k.file.Get()
}

// GetClientCertificate is a tls.Config.GetClientCertificate that offers
// the current pair (looked at now) at each handshake.
func (k *KeyPair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c := k.Current()
	return &c, nil
}
