package natsconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/internal/reload"
)

// Config is how a matbus process reaches NATS: the --nats-url and the
// --nats-creds and --nats-tls-* files (empty: not used).
type Config struct {
	// URL lists the servers, comma separated (nats:// or tls://).
	URL string
	// Creds is a .creds file (user JWT and seed).
	Creds string
	// TLSCA is a PEM file of CAs; setting it turns TLS on.
	TLSCA string
	// TLSCert and TLSKey are the PEM client certificate and its key.
	TLSCert, TLSKey string
}

// AddFlags registers --nats-url and --nats-creds on fs.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	fs.StringVar(&c.Creds, "nats-creds", "", "path of a NATS credentials file (.creds), if the server needs one; read again at each connect and reconnect (a missing or half-written file keeps the last good credentials, with a warning)")
}

// AddTLSFlags registers --nats-tls-ca, --nats-tls-cert and --nats-tls-key
// on fs.
func (c *Config) AddTLSFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.TLSCA, "nats-tls-ca", "", "PEM file of the CA(s) that signed the NATS servers' certificates (default: the system's roots); setting it turns TLS on; read again at each connect and reconnect (a missing or broken file keeps the last good CAs, with a warning)")
	fs.StringVar(&c.TLSCert, "nats-tls-cert", "", "PEM file of the client certificate for NATS servers that verify clients (with --nats-tls-key); read again at each connect and reconnect, and taken once the key matches (until then the last good pair is used, with a warning)")
	fs.StringVar(&c.TLSKey, "nats-tls-key", "", "PEM file of the private key of --nats-tls-cert")
}

// Validate returns an error naming the flag when --nats-tls-cert and
// --nats-tls-key are not set together, or a --nats-url entry is not a
// nats:// or tls:// URL that parses (its user info never shown).
func (c *Config) Validate() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--nats-tls-cert and --nats-tls-key go together: set both or neither")
	}
	for _, u := range strings.Split(c.URL, ",") {
		u = strings.TrimSpace(u)
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
			return fmt.Errorf("--nats-url %q: want nats://host:port or tls://host:port", redact.StripUserInfoLoose(u))
		}
		if err := redact.ValidURL("--nats-url", u); err != nil {
			return err
		}
	}
	return nil
}

// FileOptions returns the nats.go options of c's credentials and TLS
// files (none when unset). Each file is read here, so that an
// unusable one is one clear error naming the flag and the file (never its
// contents), and looked at again at every connect and reconnect
// (internal/reload): renewed credentials, client certificates and CAs are
// used from the next connection on, and a file that is missing or
// half-written at that moment keeps the last good contents, with one
// warning to log.
func (c Config) FileOptions(log *slog.Logger) ([]nats.Option, error) {
	var opts []nats.Option
	if c.Creds != "" {
		creds, err := reload.Open(reload.Config[natsCreds]{Paths: []string{c.Creds}, Name: "--nats-creds " + c.Creds,
			Parse: func(data ...[]byte) (natsCreds, error) { return parseNATSCreds(data[0]) }, Log: log})
		if err != nil {
			return nil, err
		}
		opts = append(opts, natsCredsOption(creds))
	}
	var certCB nats.TLSCertHandler
	var rootsCB nats.RootCAsHandler
	if c.TLSCA != "" {
		pem, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-ca: CA file is not readable: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--nats-tls-ca %s: no PEM certificate in the file", c.TLSCA)
		}
		// The file's CAs alone, as nats.RootCAs.
		roots, err := reload.NewRoots(reload.RootsConfig{Path: c.TLSCA, Name: "--nats-tls-ca " + c.TLSCA, Log: log})
		if err != nil {
			return nil, err
		}
		rootsCB = func() (*x509.CertPool, error) {
			roots.Reload()
			return roots.Pool(), nil
		}
	}
	if c.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			return nil, fmt.Errorf("--nats-tls-cert %s and --nats-tls-key %s are not a usable certificate and key: %w", c.TLSCert, c.TLSKey, err)
		}
		pair, err := reload.NewKeyPair(reload.KeyPairConfig{CertFile: c.TLSCert, KeyFile: c.TLSKey,
			Name: "--nats-tls-cert " + c.TLSCert + " and --nats-tls-key " + c.TLSKey, Log: log})
		if err != nil {
			return nil, err
		}
		certCB = func() (tls.Certificate, error) { return pair.Current(), nil }
	}
	if certCB != nil || rootsCB != nil {
		// nats.go calls both at every connect, as its RootCAs and
		// ClientCert options do with their files.
		opts = append(opts, nats.ClientTLSConfig(certCB, rootsCB))
	}
	return opts, nil // a tls:// URL alone means TLS with the system's roots (nats.go)
}

// natsCreds is a NATS credentials file as it was last read whole: the
// user JWT and the seed of the user's key.
type natsCreds struct {
	jwt  string
	seed []byte
}

// parseNATSCreds takes a .creds file only when it is whole: a user JWT
// that decodes and the seed of the user it names. Errors never quote the
// contents.
func parseNATSCreds(data []byte) (natsCreds, error) {
	token, err := nkeys.ParseDecoratedJWT(data)
	if err != nil {
		return natsCreds{}, fmt.Errorf("no user JWT: %w", err)
	}
	claims, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return natsCreds{}, errors.New("the user JWT does not decode (is the file whole?)")
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return natsCreds{}, errors.New("no user seed that parses (is the file whole?)")
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return natsCreds{}, errors.New("the user seed gives no public key")
	}
	if pub != claims.Subject {
		return natsCreds{}, fmt.Errorf("the seed is not the key of the JWT's user %s", claims.Subject)
	}
	seed, err := kp.Seed()
	if err != nil {
		return natsCreds{}, errors.New("the user seed does not parse")
	}
	// A copy: Wipe clears the key pair's own.
	return natsCreds{jwt: token, seed: append([]byte(nil), seed...)}, nil
}

// natsCredsOption authenticates with the credentials as they are at each
// connect: the JWT and the seed that signs the server's nonce come from
// the same reading of the file.
func natsCredsOption(f *reload.File[natsCreds]) nats.Option {
	var cur atomic.Pointer[natsCreds]
	return nats.UserJWT(func() (string, error) {
		f.Reload()
		c := f.Get()
		cur.Store(&c)
		return c.jwt, nil
	}, func(nonce []byte) ([]byte, error) {
		c := cur.Load()
		if c == nil {
			c0 := f.Get()
			c = &c0
		}
		kp, err := nkeys.FromSeed(c.seed)
		if err != nil {
			return nil, fmt.Errorf("nats credentials: %w", err)
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	})
}

// Connect dials c.URL and keeps reconnecting forever; name identifies the
// connection on the server. Refused credentials are retried like any other
// failure and logged at most every 30 s; an unusable credentials or TLS
// file is an error naming the flag and the file. The URL may list several servers of a cluster
// (comma separated): nats.go picks one at random and fails over to the
// others, and learns the rest of the cluster from the server it joins.
func Connect(c Config, name string, log *slog.Logger) (*nats.Conn, error) {
	fileOpts, err := c.FileOptions(log)
	if err != nil {
		return nil, err
	}
	var authLog every
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		// Refused credentials are retried like any other failure (every
		// ReconnectWait, each refusal logged): a server whose account is
		// fixed is joined without a restart, and /readyz says why meanwhile.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if isAuthErr(err) && authLog.allow(time.Now()) {
				log.Error("NATS refused the credentials; retrying (this line repeats at most every 30 s)",
					"url", redact.StripUserInfo(c.URL), "error", err)
			}
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("NATS reconnected", "url", redact.StripUserInfo(nc.ConnectedUrl())) }),
		// Asynchronous errors (e.g. an authorization violation) go to the log,
		// not straight to stderr as nats.go's default does.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Warn("NATS error", "subject", sub.Subject, "error", err)
				return
			}
			log.Warn("NATS error", "error", err)
		}),
		// A connection closed for good (Close, or a failure nats.go does not
		// retry) is said so.
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); isAuthErr(err) {
				log.Error("NATS refused the credentials; connection closed, not reconnecting", "url", redact.StripUserInfo(c.URL), "error", err)
			}
		}),
	}
	opts = append(opts, fileOpts...)
	opts = append(opts, nats.ConnectHandler(func(nc *nats.Conn) { log.Info("NATS connected", "url", redact.StripUserInfo(nc.ConnectedUrl())) }))
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redact.StripUserInfo(c.URL), err)
	}
	if !nc.IsConnected() {
		// RetryOnFailedConnect keeps trying in the background; say so once.
		log.Warn("NATS not reachable yet; retrying until it is (not ready meanwhile)", "url", redact.StripUserInfo(c.URL))
	}
	return nc, nil
}

// isAuthErr reports whether err is NATS refusing the credentials.
func isAuthErr(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// every lets an event through at most once per 30 s. It is safe for
// concurrent use.
type every struct {
	mu   sync.Mutex
	last time.Time
}

func (e *every) allow(now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && now.Sub(e.last) < 30*time.Second {
		return false
	}
	e.last = now
	return true
}

// ConnectReachable connects like Connect and waits up to wait for the
// connection. When none is made by then, it closes the connection and
// returns an error naming the address and the cause (the last connect error,
// or what a plain TCP dial of the first server says: connection refused, no
// such host, a timeout). Credentials in the URL are never shown.
func ConnectReachable(ctx context.Context, c Config, name string, log *slog.Logger, wait time.Duration) (*nats.Conn, error) {
	nc, err := Connect(c, name, log)
	if err != nil {
		return nil, err
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, ctx.Err()
		case <-deadline.C:
			cause := nc.LastError()
			nc.Close()
			if cause == nil || errors.Is(cause, nats.ErrNoServers) {
				cause = dialCause(ctx, c.URL)
			}
			return nil, fmt.Errorf("NATS at %s is not reachable (waited %s): %v", redact.StripUserInfo(c.URL), wait, cause)
		case <-tick.C:
		}
	}
	return nc, nil
}

// dialCause dials the first server of a --nats-url list over TCP (2 s at
// most) and returns why that fails, or a plain note when it does not (then
// the server accepts TCP but not the NATS handshake: TLS or credentials).
func dialCause(ctx context.Context, urls string) error {
	first := strings.TrimSpace(strings.Split(urls, ",")[0])
	u, err := url.Parse(first)
	if err != nil || u.Host == "" {
		return errors.New("no server address in --nats-url")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(dctx, "tcp", host)
	if err != nil {
		return err
	}
	_ = c.Close()
	return errors.New("the server accepts TCP connections but no NATS connection was made (TLS or credentials? see --nats-tls-ca, --nats-creds)")
}
