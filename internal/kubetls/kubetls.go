package kubetls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/connrotation"

	"github.com/matbus/matbus/internal/reload"
)

// WatchInterval is how often Apply's goroutine looks at the files while
// no new connection does, so that a rotation also ends the connections
// made before it (an HTTP/2 connection to the API server lives for hours).
const WatchInterval = 10 * time.Second

// Files says which files of a configuration Apply keeps current.
type Files struct {
	// CAFile is the CA bundle the API server's certificate is verified
	// against ("" when the configuration holds the CA inline, or none).
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (""
	// when inline or none).
	CertFile, KeyFile string
}

// Apply replaces the file-based TLS of cfg (TLSClientConfig.CAFile,
// CertFile and KeyFile, as a kubeconfig's certificate-authority,
// client-certificate and client-key, or the in-cluster ca.crt give them)
// with a transport of its own whose trust and client certificate follow
// the files: every new connection verifies the API server against the CA
// file as it is (at once again when the authority is unknown), and offers
// the certificate and key as they are (taken only when they match). A
// file that is missing or half-written keeps its last good contents, with
// one warning to log. Until ctx ends, a goroutine looks at the files every
// WatchInterval and ends the connections made before a change, as
// client-go does when its own certificate rotation sees one.
//
// Inline data (CAData, CertData, KeyData), Insecure, ServerName,
// NextProtos, Proxy, Dial and DisableCompression keep their meaning.
// Apply leaves cfg as it is, and returns the zero Files, when no CA or
// certificate comes from a file, or when client-go must keep the TLS
// (cfg.Transport is set, or an exec plugin may supply certificates).
// Errors name the file and say what is wrong with it (never its contents).
func Apply(ctx context.Context, cfg *rest.Config, log *slog.Logger) (Files, error) {
	tc := cfg.TLSClientConfig
	var files Files
	if tc.CAFile != "" && len(tc.CAData) == 0 && !tc.Insecure {
		files.CAFile = tc.CAFile
	}
	if tc.CertFile != "" && tc.KeyFile != "" && len(tc.CertData) == 0 && len(tc.KeyData) == 0 {
		files.CertFile, files.KeyFile = tc.CertFile, tc.KeyFile
	}
	if files == (Files{}) || cfg.Transport != nil || cfg.ExecProvider != nil {
		return Files{}, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	conns := connrotation.NewDialer(dial)
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: tc.ServerName, NextProtos: tc.NextProtos}
	var versions []func() uint64 // each looks at its files now and returns their version
	switch {
	case tc.Insecure:
		tlsCfg.InsecureSkipVerify = true //nolint:gosec // the configuration asks for it (insecure-skip-tls-verify).
	case files.CAFile != "":
		roots, err := reload.NewRoots(reload.RootsConfig{Path: files.CAFile, Name: "Kubernetes CA file " + files.CAFile, Log: log})
		if err != nil {
			return Files{}, err
		}
		host := tc.ServerName
		if host == "" {
			u, err := url.Parse(cfg.Host)
			if err != nil || u.Hostname() == "" {
				return Files{}, fmt.Errorf("kubernetes API server %q: no host name to verify its certificate against", cfg.Host)
			}
			host = u.Hostname()
		}
		// crypto/tls's own check, with a pool fixed now, makes way for
		// the current bundle's.
		tlsCfg.InsecureSkipVerify = true //nolint:gosec // VerifyConnection verifies the chain and host.
		tlsCfg.VerifyConnection = roots.VerifyConnection(host)
		versions = append(versions, func() uint64 { roots.Reload(); return roots.File().Version() })
	case len(tc.CAData) > 0:
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(tc.CAData) {
			return Files{}, errors.New("kubernetes CA data: no PEM certificate")
		}
		tlsCfg.RootCAs = pool
	}
	switch {
	case files.CertFile != "":
		pair, err := reload.NewKeyPair(reload.KeyPairConfig{CertFile: files.CertFile, KeyFile: files.KeyFile,
			Name: "Kubernetes client certificate " + files.CertFile + " and key " + files.KeyFile, Log: log})
		if err != nil {
			return Files{}, err
		}
		tlsCfg.GetClientCertificate = pair.GetClientCertificate
		versions = append(versions, func() uint64 { pair.File().Reload(); return pair.File().Version() })
	case len(tc.CertData) > 0 || len(tc.KeyData) > 0:
		cert, err := tls.X509KeyPair(tc.CertData, tc.KeyData)
		if err != nil {
			return Files{}, fmt.Errorf("kubernetes client certificate data: %w", err)
		}
		tlsCfg.Certificates = []tls.Certificate{cert}
	}

	proxy := cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	// client-go's own transport settings (transport.cache), HTTP/2 and its
	// health checks included.
	cfg.Transport = utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               proxy,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tlsCfg,
		MaxIdleConnsPerHost: 25,
		DialContext:         conns.DialContext,
		DisableCompression:  cfg.DisableCompression,
	})
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	cfg.Dial = nil
	go closeOnChange(ctx, versions, conns, log)
	return files, nil
}

// closeOnChange looks at the files every WatchInterval until ctx ends and
// ends every connection of conns when a version moved since the last look
// (whether this look or a new connection's took the change).
func closeOnChange(ctx context.Context, versions []func() uint64, conns *connrotation.Dialer, log *slog.Logger) {
	seen := make([]uint64, len(versions))
	for i, v := range versions {
		seen[i] = v()
	}
	t := time.NewTicker(WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed := false
		for i, v := range versions {
			if n := v(); n != seen[i] {
				seen[i], changed = n, true
			}
		}
		if changed {
			log.Info("Kubernetes TLS files changed: ending the connections made before, new ones use the new files")
			conns.CloseAll()
		}
	}
}
