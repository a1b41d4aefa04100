package matclient

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
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
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: CA file %s: certificate %d: %w", ErrInvalidConfig, path, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: CA file %s: no PEM CERTIFICATE block", ErrInvalidConfig, path)
	}
	return pool, nil
}
