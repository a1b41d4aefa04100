package matclient

import (
	"context"
	"crypto/x509"
	"log/slog"

	"github.com/matbus/matbus/internal/reload"
)

// Trust is what MAT certificates are verified against: the system roots,
// a CA bundle file kept current (re-read when it changes: each new
// connection verifies against the bundle as it is, a bad file keeps the
// last good bundle with one warning) and certificates added with Add
// (dev's simulators). The zero value, and a nil *Trust, is the system
// roots alone, as Config without VerifyPeer.
type Trust struct {
	roots   *reload.Roots
	changed chan struct{}
}

// OpenTrust reads the PEM bundle at caFile ("" for none: the system roots)
// at once, so that a missing, unreadable or certificate-less file is one
// error that starts with label (e.g. "--mat-ca-file /x (MATBUS_MAT_CA_FILE)")
// and never quotes the contents. Warnings about later changes go to log.
func OpenTrust(caFile, label string, log *slog.Logger) (*Trust, error) {
	t := &Trust{changed: make(chan struct{}, 1)}
	if caFile == "" {
		return t, nil
	}
	if err := reload.CheckReadable(label, caFile); err != nil {
		return nil, err
	}
	roots, err := reload.NewRoots(reload.RootsConfig{Path: caFile, Name: label, System: true, Log: log,
		OnChange: func() {
			select {
			case t.changed <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		return nil, err
	}
	t.roots = roots
	return t, nil
}

// Add trusts certs from now on, besides the system roots and the file.
func (t *Trust) Add(certs ...*x509.Certificate) {
	if len(certs) == 0 {
		return
	}
	if t.roots == nil {
		t.roots, _ = reload.NewRoots(reload.RootsConfig{System: true}) // no file: no error
	}
	t.roots.Trust(certs...)
}

// Configure sets cfg.VerifyPeer to verify against t as it is at each
// handshake (nothing for the system roots alone).
func (t *Trust) Configure(cfg *Config) {
	if t != nil && t.roots != nil {
		cfg.VerifyPeer = t.roots.Verify
	}
}

// Follow runs until ctx ends: it looks at the CA file every second (so a
// change is seen while no MAT connection is made, e.g. while every
// instance with a refused certificate waits for its next probe) and calls
// changed after each change. Without a file it returns at once.
func (t *Trust) Follow(ctx context.Context, changed func(context.Context)) {
	if t == nil || t.roots == nil || t.roots.File() == nil {
		return
	}
	go t.roots.File().Watch(ctx, reload.DefaultMinInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.changed:
			changed(ctx)
		}
	}
}
