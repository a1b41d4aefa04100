package matclient

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/matbus/matbus/internal/reload"
)

// LoadRootCAs returns the pool Config.RootCAs takes for verifying MAT
// servers: the system roots plus every certificate of the PEM file at path
// (a private CA bundle, e.g. the ca.crt of a cert-manager Secret). Blocks
// other than CERTIFICATE (keys, parameters) are skipped. When the system
// roots cannot be loaded the pool holds the file's certificates only.
//
// Errors wrap ErrInvalidConfig and name the file, never its contents: the
// file cannot be read, holds no CERTIFICATE block, or holds a certificate
// that does not parse.
func LoadRootCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: CA file: %w", ErrInvalidConfig, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	certs, err := reload.ParseCertificates(data)
	if errors.Is(err, reload.ErrNoCertificate) {
		return nil, fmt.Errorf("%w: CA file %s: no PEM CERTIFICATE block", ErrInvalidConfig, path)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: CA file %s: %w", ErrInvalidConfig, path, err)
	}
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}
