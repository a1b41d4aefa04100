package reload

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ErrNoCertificate is wrapped by ParseCertificates for contents without a
// PEM CERTIFICATE block (an empty or half-written file, a key file).
var ErrNoCertificate = errors.New("no PEM CERTIFICATE block")

// ParseCertificates returns every certificate of the PEM blocks of type
// CERTIFICATE in data, in order; other blocks (keys, parameters) are
// skipped. Errors name the certificate by its position ("certificate 2: …"),
// never the contents, or wrap ErrNoCertificate.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
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
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, cert)
	}
	if len(out) == 0 {
		return nil, ErrNoCertificate
	}
	return out, nil
}

// RootsConfig describes a Roots.
type RootsConfig struct {
	// Path is a PEM bundle of CA certificates (e.g. a cert-manager Secret's
	// ca.crt), re-read when it changes; "" means none.
	Path string
	// Name names the file in log lines; default Path.
	Name string
	// System starts every pool from the system roots (when they load).
	System bool
	// MinInterval and Log are those of Config.
	MinInterval time.Duration
	Log         *slog.Logger
	// OnChange, if set, is called after a new bundle was accepted.
	OnChange func()
}

// Roots is the set of CAs a TLS client verifies servers against: the
// system roots (RootsConfig.System), certificates trusted with Trust, and
// a CA bundle file kept current by a File. It is safe for concurrent use.
type Roots struct {
	file   *File[[]*x509.Certificate] // nil without a bundle file
	system bool

	mu      sync.Mutex
	extra   []*x509.Certificate
	pool    *x509.CertPool // built for poolFor; nil: build again
	poolFor uint64         // file version the pool was built from
}

// NewRoots reads the bundle at cfg.Path (if any) and returns the Roots.
// Its error names the file and says what is wrong with it (unreadable, no
// certificate, a certificate that does not parse), never the contents.
func NewRoots(cfg RootsConfig) (*Roots, error) {
	r := &Roots{system: cfg.System}
	if cfg.Path == "" {
		return r, nil
	}
	f, err := Open(Config[[]*x509.Certificate]{Paths: []string{cfg.Path}, Name: cfg.Name, MinInterval: cfg.MinInterval,
		Log: cfg.Log, OnChange: cfg.OnChange,
		Parse: func(data ...[]byte) ([]*x509.Certificate, error) { return ParseCertificates(data[0]) }})
	if err != nil {
		return nil, err
	}
	r.file = f
	return r, nil
}

// File returns the bundle's File, nil without a bundle file.
func (r *Roots) File() *File[[]*x509.Certificate] { return r.file }

// Trust adds certs to every pool from now on (e.g. self-signed
// certificates of local simulators).
func (r *Roots) Trust(certs ...*x509.Certificate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.extra = append(r.extra, certs...)
	r.pool = nil
}

// Pool returns the current pool: system roots (if asked for), trusted
// certificates and the bundle as last read (the file is looked at when
// the last look is older than its MinInterval). Do not modify it.
func (r *Roots) Pool() *x509.CertPool {
	var certs []*x509.Certificate
	var version uint64
	if r.file != nil {
		certs = r.file.Get()
		version = r.file.Version()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pool != nil && r.poolFor == version {
		return r.pool
	}
	var p *x509.CertPool
	if r.system {
		p, _ = x509.SystemCertPool()
	}
	if p == nil {
		p = x509.NewCertPool()
	}
	for _, c := range r.extra {
		p.AddCert(c)
	}
	for _, c := range certs {
		p.AddCert(c)
	}
	r.pool, r.poolFor = p, version
	return p
}

// Reload looks at the bundle file now and reports whether it changed.
func (r *Roots) Reload() bool {
	return r.file != nil && r.file.Reload()
}

// Verify verifies a server's certificate chain (leaf first, as sent) for
// serverName (a DNS name or IP address) against the current pool, as
// crypto/tls does when it verifies a server itself. When the chain's
// authority is unknown it looks at the bundle file at once and, if the
// file changed, verifies once more against the new pool, so a CA added to
// the bundle is trusted by the first handshake after the change. The error
// is a *tls.CertificateVerificationError wrapping x509's (e.g.
// x509.UnknownAuthorityError, x509.HostnameError).
func (r *Roots) Verify(serverName string, chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return &tls.CertificateVerificationError{Err: errors.New("the server sent no certificate")}
	}
	if serverName == "" {
		return &tls.CertificateVerificationError{UnverifiedCertificates: chain, Err: errors.New("no server name to verify the certificate against")}
	}
	err := verify(r.Pool(), serverName, chain)
	var uae x509.UnknownAuthorityError
	if err != nil && errors.As(err, &uae) && r.Reload() {
		err = verify(r.Pool(), serverName, chain)
	}
	if err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: chain, Err: err}
	}
	return nil
}

// VerifyConnection returns a tls.Config.VerifyConnection for a client of
// the server serverName (what the client dials: a DNS name or an IP
// address) that verifies with Verify. Use it with InsecureSkipVerify set,
// which turns off only crypto/tls's own verification with a fixed pool.
func (r *Roots) VerifyConnection(serverName string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error { return r.Verify(serverName, cs.PeerCertificates) }
}

func verify(roots *x509.CertPool, serverName string, chain []*x509.Certificate) error {
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: serverName, Intermediates: inter})
	return err
}
