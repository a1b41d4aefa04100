package matclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Sentinel errors. Test with errors.Is.
var (
	// ErrInvalidURL is wrapped by New and ParseBaseURL for a base URL that
	// is not an absolute http(s) URL with a host and without userinfo,
	// query or fragment.
	ErrInvalidURL = errors.New("matclient: invalid URL")
	// ErrInvalidConfig is wrapped by New for a negative Timeout or
	// MaxBodyBytes or BodyMaxAge.
	ErrInvalidConfig = errors.New("matclient: invalid config")
	// ErrBodyTooLarge is wrapped by Status when the response body is longer
	// than Config.MaxBodyBytes.
	ErrBodyTooLarge = errors.New("matclient: response body too large")
	// ErrClosed is returned by Status after Close (also for a request that
	// was in flight when Close was called) and by a second Close.
	ErrClosed = errors.New("matclient: client closed")
)

// Defaults for the zero Config fields.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultMaxBodyBytes = 10 << 20 // 10 MiB
	DefaultUserAgent    = "matbus-matclient"
)

// StatusPath is the path of MAT's status endpoint, relative to the base URL.
const StatusPath = "machines/status"

const (
	errorBodyBytes = 512       // HTTPError.Body cap
	drainBytes     = 256 << 10 // read at most this much more to reuse a connection
)

// Config tunes a Client. The zero value is usable.
type Config struct {
	// Timeout bounds a whole Status call: connect, TLS, headers and body.
	// 0 means DefaultTimeout (10s); negative is an error.
	Timeout time.Duration
	// MaxBodyBytes caps the status body (after any transparent gzip
	// decompression). 0 means DefaultMaxBodyBytes (10 MiB); negative is an
	// error.
	MaxBodyBytes int64
	// InsecureSkipVerify disables verification of the server certificate,
	// for MAT instances that serve self-signed certificates. Without it
	// the certificate must name the URL's host (a DNS name or IP SAN) and
	// chain to RootCAs.
	InsecureSkipVerify bool
	// RootCAs, if non-nil, replaces the system roots for verifying the
	// server certificate (ignored with InsecureSkipVerify). LoadRootCAs
	// makes one of the system roots plus a private CA bundle.
	RootCAs *x509.CertPool
	// VerifyPeer, if non-nil, verifies the server certificate instead of
	// crypto/tls with RootCAs (ignored with InsecureSkipVerify): it is
	// called at every TLS handshake with the URL's host (a DNS name or IP
	// address) and the chain the server sent, leaf first, and its error
	// fails the handshake. reload.Roots.Verify is one: it verifies against
	// a CA bundle that is re-read when it changes, so clients made before a
	// CA rotation trust the new CA from their next connection on. Return a
	// *tls.CertificateVerificationError (as crypto/tls does) for
	// IsVerificationError and IsTransient to know the failure.
	VerifyPeer func(serverName string, chain []*x509.Certificate) error
	// DialContext, if non-nil, opens the TCP connections instead of a
	// net.Dialer (addr is the URL's "host:port"). TLS still verifies the
	// URL's host name, so tests and tools can serve a DNS name's
	// certificate from a local address; nil dials addr.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// UserAgent is sent as User-Agent; "" means DefaultUserAgent.
	UserAgent string
	// BodyMaxAge lets FullStatus revalidate instead of refetch: the client
	// keeps the last status body that came whole with a strong ETag and
	// decoded (one body, as many bytes as MAT sent), and for BodyMaxAge
	// after that body came, FullStatus sends If-None-Match and decodes the
	// kept body on a 304. Once it is older, FullStatus fetches the whole
	// body again, so a MAT whose ETag failed to change with its body is
	// read in full at least every BodyMaxAge. 0 (the default) keeps no
	// body: FullStatus is exactly PollStatus(ctx, ""). Negative is an
	// error.
	BodyMaxAge time.Duration
}

// Client talks to one MAT instance. It owns one *http.Client with its own
// *http.Transport (keep-alive on), reused for every request, so repeated
// Status calls share one connection. It is safe for concurrent use. Close
// releases its idle connections.
type Client struct {
	baseURL   string
	statusURL string
	userAgent string
	maxBody   int64
	bodyAge   time.Duration // Config.BodyMaxAge

	transport *http.Transport
	http      *http.Client

	// val is the validator of the last good body (see StatusIfChanged).
	valMu sync.Mutex
	val   validator

	closed   atomic.Bool
	closeCtx context.Context // done when Close is called
	closeFn  context.CancelFunc
}

// validator is a strong ETag and the Fingerprint of the body it came with;
// with Config.BodyMaxAge also that body and when it came whole.
type validator struct {
	etag, fingerprint string
	body              []byte
	at                time.Time
}

var _ io.Closer = (*Client)(nil)

// ParseBaseURL validates a MAT base URL: scheme http or https, a host (with
// an optional port in 1..65535), no userinfo, no query, no fragment. A path
// is allowed; the status path is joined onto it, so a path that already
// ends in /machines/status is refused with the base URL to give instead.
// Errors wrap ErrInvalidURL and never echo a password.
func ParseBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the input; drop it in case it holds a password.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidURL, err)
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		if u.Scheme == "" {
			return nil, fmt.Errorf("%w: %q: not absolute (want http:// or https://)", ErrInvalidURL, shown)
		}
		return nil, fmt.Errorf("%w: %q: scheme %q not supported (want http or https)", ErrInvalidURL, shown, u.Scheme)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("%w: %q: host required", ErrInvalidURL, shown)
	case u.User != nil:
		return nil, fmt.Errorf("%w: %q: userinfo not allowed", ErrInvalidURL, shown)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("%w: %q: query not allowed", ErrInvalidURL, shown)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, fmt.Errorf("%w: %q: fragment not allowed", ErrInvalidURL, shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: %q: port %q out of range 1..65535", ErrInvalidURL, shown, p)
		}
	}
	if p := strings.TrimSuffix(u.Path, "/"); p == "/"+StatusPath || strings.HasSuffix(p, "/"+StatusPath) {
		base := *u
		base.Path = strings.TrimSuffix(p, StatusPath)
		base.RawPath = ""
		return nil, fmt.Errorf("%w: %q is a status URL; give the instance's base URL %q (the status path is added to it)", ErrInvalidURL, shown, base.String())
	}
	return u, nil
}

// New returns a Client for the MAT instance at baseURL (see ParseBaseURL);
// its status URL is baseURL joined with "machines/status", e.g.
// "https://h:1266/" -> "https://h:1266/machines/status". Errors wrap
// ErrInvalidURL or ErrInvalidConfig.
func New(baseURL string, cfg Config) (*Client, error) {
	u, err := ParseBaseURL(baseURL)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative Timeout %v", ErrInvalidConfig, cfg.Timeout)
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: negative MaxBodyBytes %d", ErrInvalidConfig, cfg.MaxBodyBytes)
	}
	if cfg.BodyMaxAge < 0 {
		return nil, fmt.Errorf("%w: negative BodyMaxAge %v", ErrInvalidConfig, cfg.BodyMaxAge)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = DefaultUserAgent
	}

	t := newTransport()
	if cfg.DialContext != nil {
		t.DialContext = cfg.DialContext
	}
	t.TLSClientConfig = &tls.Config{
		MinVersion:         tls.VersionTLS12,
		RootCAs:            cfg.RootCAs,
		InsecureSkipVerify: cfg.InsecureSkipVerify, //nolint:gosec // opt-in: MAT serves self-signed certificates.
	}
	if verify := cfg.VerifyPeer; verify != nil && !cfg.InsecureSkipVerify {
		host := u.Hostname()
		// crypto/tls's own check, with a pool fixed at New, makes way for
		// VerifyPeer's, which runs on every connection, resumed ones too.
		t.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // VerifyConnection verifies the chain and host.
		t.TLSClientConfig.RootCAs = nil
		t.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error { return verify(host, cs.PeerCertificates) }
	}
	closeCtx, closeFn := context.WithCancel(context.Background())
	return &Client{
		baseURL:   baseURL,
		statusURL: u.JoinPath(StatusPath).String(),
		userAgent: cfg.UserAgent,
		maxBody:   cfg.MaxBodyBytes,
		bodyAge:   cfg.BodyMaxAge,
		transport: t,
		http:      &http.Client{Transport: t, Timeout: cfg.Timeout},
		closeCtx:  closeCtx,
		closeFn:   closeFn,
	}, nil
}

// newTransport clones http.DefaultTransport (proxy from environment, dial
// and TLS handshake timeouts, HTTP/2) with idle limits for talking to a
// single host.
func newTransport() *http.Transport {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	} else {
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	t.DisableKeepAlives = false
	t.MaxIdleConns = 4
	t.MaxIdleConnsPerHost = 4
	t.IdleConnTimeout = 90 * time.Second
	return t
}

// URL returns the base URL exactly as given to New (the key a client cache
// compares).
func (c *Client) URL() string { return c.baseURL }

// StatusURL returns the full URL Status fetches.
func (c *Client) StatusURL() string { return c.statusURL }

// Status fetches and decodes the MAT `GET /machines/status` body (Accept:
// application/json). The whole call is bounded by ctx and Config.Timeout.
//
// Errors:
//   - non-2xx response: *HTTPError (first 512 bytes of the body kept);
//   - body longer than Config.MaxBodyBytes: wraps ErrBodyTooLarge;
//   - body that Decode rejects: wraps ErrInvalidStatus (and *DecodeError);
//   - after (or during) Close: wraps ErrClosed;
//   - network failures and timeouts: wrap the underlying *url.Error,
//     net.Error or context error.
//
// IsTransient tells which of these are worth retrying. Response bodies are
// always drained (bounded) and closed so the connection is reused.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	resp, err := c.fetchBody(ctx, "")
	if err != nil {
		return nil, err
	}
	body := resp.body
	st, err := Decode(body)
	if err != nil {
		return nil, &opError{url: c.statusURL, err: err}
	}
	return st, nil
}

// fetched is one status response: a 2xx body and its ETag header, or a
// 304 Not Modified (notModified, no body).
type fetched struct {
	body        []byte
	etag        string
	notModified bool
}

// fetchBody GETs the status body (bounded by MaxBodyBytes), with
// If-None-Match: ifNoneMatch unless it is ""; see Status for the errors.
// A 304 to a conditional request is returned as notModified; to a plain
// one it is an *HTTPError like any other non-2xx code.
func (c *Client) fetchBody(ctx context.Context, ifNoneMatch string) (fetched, error) {
	if c.closed.Load() {
		return fetched{}, &opError{url: c.statusURL, err: ErrClosed}
	}
	// Cancel the request if the client is closed while it runs, and make
	// sure a connection that comes back after Close does not linger idle.
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.closeCtx, cancel)
	defer func() {
		stop()
		cancel()
		if c.closed.Load() {
			c.transport.CloseIdleConnections()
		}
	}()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.statusURL, nil)
	if err != nil {
		return fetched{}, &opError{url: c.statusURL, err: err}
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if ifNoneMatch != "" {
		req.Header.Set("If-None-Match", ifNoneMatch)
	}

	resp, err := c.http.Do(req)
	if err != nil {
		return fetched{}, c.netErr(err)
	}
	defer drainAndClose(resp.Body)

	if resp.StatusCode == http.StatusNotModified && ifNoneMatch != "" {
		return fetched{notModified: true, etag: resp.Header.Get("ETag")}, nil
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
		return fetched{}, &HTTPError{
			StatusCode: resp.StatusCode,
			URL:        c.statusURL,
			Body:       string(snippet),
			RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now()),
		}
	}
	if resp.ContentLength > c.maxBody {
		return fetched{}, &opError{url: c.statusURL, err: fmt.Errorf("%w: Content-Length %d exceeds the %d-byte limit", ErrBodyTooLarge, resp.ContentLength, c.maxBody)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		return fetched{}, c.netErr(fmt.Errorf("reading body: %w", err))
	}
	if int64(len(body)) > c.maxBody {
		return fetched{}, &opError{url: c.statusURL, err: fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, c.maxBody)}
	}
	return fetched{body: body, etag: resp.Header.Get("ETag")}, nil
}

// netErr wraps an error of the network phase (request or body read).
func (c *Client) netErr(err error) error {
	if c.closed.Load() && errors.Is(err, context.Canceled) {
		return &opError{url: c.statusURL, err: ErrClosed}
	}
	return &opError{url: c.statusURL, err: err, network: true}
}

// Close closes the client's idle connections and cancels requests in
// flight; later Status calls fail with ErrClosed. A second Close returns
// ErrClosed.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	c.closeFn()
	c.transport.CloseIdleConnections()
	return nil
}

func drainAndClose(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, drainBytes)
	_ = body.Close()
}

// opError is the error Status returns for everything but HTTP status
// errors: "matclient: GET <url>: <cause>".
type opError struct {
	url     string
	err     error
	network bool // failed while talking to the server: worth a retry
}

func (e *opError) Error() string {
	msg := e.err.Error()
	var ue *url.Error
	if errors.As(e.err, &ue) && ue.Err != nil {
		// url.Error repeats method and URL: keep only its cause.
		msg = ue.Err.Error()
	}
	return "matclient: GET " + e.url + ": " + strings.TrimPrefix(msg, "matclient: ") + certHint(e.err)
}

// certHint adds what Go's x509 errors leave out and an operator needs to
// fix a refused certificate: the names a certificate holds when an IP
// address was asked for (" (the certificate names a, b)"), and the issuer
// of a certificate signed by an unknown authority (` (issuer "CN=ca")`).
// It is "" for other errors.
func certHint(err error) string {
	var hne x509.HostnameError
	if errors.As(err, &hne) && hne.Certificate != nil && net.ParseIP(hne.Host) != nil && len(hne.Certificate.IPAddresses) == 0 {
		if names := hne.Certificate.DNSNames; len(names) > 0 {
			return " (the certificate names " + strings.Join(names, ", ") + ")"
		}
	}
	var uae x509.UnknownAuthorityError
	if errors.As(err, &uae) && uae.Cert != nil {
		return fmt.Sprintf(" (issuer %q)", uae.Cert.Issuer.String())
	}
	return ""
}

func (e *opError) Unwrap() error { return e.err }

// HTTPError is returned by Status for a response whose status code is not
// 2xx.
type HTTPError struct {
	StatusCode int    // e.g. 503
	URL        string // the URL fetched
	Body       string // first 512 bytes of the response body
	// RetryAfter is the server's Retry-After header as a duration (0 if
	// absent or unparsable).
	RetryAfter time.Duration
}

// Error returns "matclient: GET <url>: HTTP <code> <text>[: <body>]".
func (e *HTTPError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "matclient: GET %s: HTTP %d", e.URL, e.StatusCode)
	if t := http.StatusText(e.StatusCode); t != "" {
		b.WriteString(" " + t)
	}
	body := strings.TrimSpace(strings.ToValidUTF8(e.Body, string(utf8.RuneError)))
	if body != "" {
		b.WriteString(": " + body)
	}
	return b.String()
}

// Transient reports whether the status code is worth a retry: 408, 429
// and 5xx.
func (e *HTTPError) Transient() bool {
	return e.StatusCode == http.StatusRequestTimeout ||
		e.StatusCode == http.StatusTooManyRequests ||
		e.StatusCode >= 500
}

func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// IsTransient reports whether err (from Status, possibly wrapped further)
// is worth retrying: network errors, timeouts, context.DeadlineExceeded and
// HTTP 408, 429 and 5xx. It is false for nil, context.Canceled, ErrClosed,
// ErrInvalidStatus, ErrInvalidURL, ErrInvalidConfig, ErrBodyTooLarge, other
// HTTP status codes, certificate verification failures (a bad
// certificate stays bad) and plain HTTP answering an https URL.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	for _, permanent := range []error{ErrClosed, ErrInvalidStatus, ErrInvalidURL, ErrInvalidConfig, ErrBodyTooLarge} {
		if errors.Is(err, permanent) {
			return false
		}
	}
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Transient()
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if isCertError(err) {
		return false
	}
	var op *opError
	if errors.As(err, &op) {
		return op.network
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// IsVerificationError reports whether err (from Status, possibly wrapped
// further) is a refused server certificate: unknown authority, a name that
// does not match the URL's host, or an invalid (e.g. expired) certificate.
// Such errors are never transient.
func IsVerificationError(err error) bool {
	var (
		cve *tls.CertificateVerificationError
		uae x509.UnknownAuthorityError
		hne x509.HostnameError
		cie x509.CertificateInvalidError
	)
	return errors.As(err, &cve) || errors.As(err, &uae) || errors.As(err, &hne) || errors.As(err, &cie)
}

func isCertError(err error) bool {
	var (
		cve *tls.CertificateVerificationError
		uae x509.UnknownAuthorityError
		hne x509.HostnameError
		cie x509.CertificateInvalidError
		rhe tls.RecordHeaderError
	)
	return errors.As(err, &cve) || errors.As(err, &uae) || errors.As(err, &hne) ||
		errors.As(err, &cie) || errors.As(err, &rhe) || errors.Is(err, http.ErrSchemeMismatch)
}
