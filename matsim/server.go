package matsim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/matbus/matbus/matclient"
)

// Errors of Server methods.
var (
	// ErrUnknownDevice: no device with that mat_id.
	ErrUnknownDevice = errors.New("matsim: unknown device")
	// ErrFixtureMode: the server serves a fixture file, which cannot be
	// changed device by device (SetFleet switches to a fleet).
	ErrFixtureMode = errors.New("matsim: serving a fixture")
	// ErrStarted: Start was already called.
	ErrStarted = errors.New("matsim: server already started")
	// ErrServerClosed: the server was closed.
	ErrServerClosed = errors.New("matsim: server closed")
)

// DefaultSlowDelay is how long FaultSlow delays a response unless
// Options.SlowDelay says otherwise.
const DefaultSlowDelay = 2 * time.Second

// FaultMode is a fault injected into `GET /machines/status` responses.
type FaultMode int32

const (
	// FaultNone serves the status normally.
	FaultNone FaultMode = iota
	// Fault500 answers 500 Internal Server Error with a short JSON body.
	Fault500
	// FaultMalformed answers 200 with the status body cut in half (invalid
	// JSON).
	FaultMalformed
	// FaultSlow waits Options.SlowDelay, then serves normally.
	FaultSlow
	// FaultHang never answers: the handler blocks until the request's
	// context ends (client gone or server closed).
	FaultHang
)

var faultNames = []string{"none", "500", "malformed", "slow", "hang"}

// String returns the name ParseFaultMode accepts.
func (f FaultMode) String() string {
	if int(f) >= 0 && int(f) < len(faultNames) {
		return faultNames[f]
	}
	return fmt.Sprintf("FaultMode(%d)", int(f))
}

// ParseFaultMode parses "none", "500", "malformed", "slow" or "hang".
func ParseFaultMode(s string) (FaultMode, error) {
	if i := slices.Index(faultNames, strings.ToLower(strings.TrimSpace(s))); i >= 0 {
		return FaultMode(i), nil
	}
	return FaultNone, fmt.Errorf("matsim: unknown fault mode %q (want one of %s)", s, strings.Join(faultNames, ", "))
}

// Options configure a Server. Exactly one of Fleet, Fixture and FixturePath
// is set.
type Options struct {
	// Fleet is served (a copy is kept; change it with SetFleet,
	// RemoveDevice, SetBMCIP).
	Fleet *Fleet
	// Fixture is a status body served byte for byte (it need not be valid,
	// so malformed fixtures can be served).
	Fixture []byte
	// FixturePath names a file read at New and served like Fixture.
	FixturePath string
	// Legacy serves a fleet in the July 2026 shape (no inventory identity,
	// no device_kind). Fixtures are served as they are.
	Legacy bool
	// TLS makes Start serve HTTPS with a self-signed ECDSA certificate made
	// at New, valid for 127.0.0.1, ::1, localhost and TLSNames (host names
	// or IP addresses).
	TLS      bool
	TLSNames []string
	// TLSCertificate, if non-nil, is served instead of the self-signed
	// certificate (TLS is then implied; TLSNames is ignored), e.g. one
	// with DNS names only, signed by a test CA. Its Leaf may be nil.
	TLSCertificate *tls.Certificate
	// TLSCertFile and TLSKeyFile (both or neither) name PEM files of a
	// certificate chain and its key, read at New and served like
	// TLSCertificate; mutually exclusive with it. They are looked at on
	// every TLS handshake and a renewed pair is served from then on (a
	// missing or mismatched pair keeps the last good one, with a warning).
	TLSCertFile, TLSKeyFile string
	// SlowDelay is the FaultSlow delay; 0 means DefaultSlowDelay.
	SlowDelay time.Duration
	// EpochID is the v2 epoch_id; "" means the time New was called, in
	// MAT's format (RFC 3339 UTC with nanoseconds).
	EpochID string
	// DisableETag makes the server a MAT without conditional requests:
	// no ETag header, If-None-Match ignored, and the body rendered anew on
	// every request. By default a response carries a strong ETag of its
	// body (rendered once per change and cached), and a GET or HEAD whose
	// If-None-Match matches it is answered 304 Not Modified without a body.
	DisableETag bool
	// FaultControl serves FaultPath: PUT with a body that ParseFaultMode
	// accepts ("500", "none", ...) sets the fault mode of later status
	// requests, GET reads it. For local runs (matbus dev), so that a user
	// can make a simulator fail and heal it; anyone who reaches the port
	// can, so it is off by default.
	FaultControl bool
	// Logger receives debug logs (requests, TLS handshake errors) and
	// the warning for a fixture that does not decode as a MAT status; nil
	// discards them.
	Logger *slog.Logger
}

// Server simulates one MAT instance's `GET /machines/status` endpoint
// (besides `GET /healthz` and, with Options.FaultControl, FaultPath; every
// other path is 404). It is safe for concurrent use; all state is
// per Server.
type Server struct {
	legacy    bool
	etags     bool
	slowDelay time.Duration
	epochID   string
	log       *slog.Logger
	tlsConfig *tls.Config       // nil for plain HTTP
	cert      *x509.Certificate // nil for plain HTTP
	mux       *http.ServeMux

	mu          sync.Mutex
	fleet       *Fleet // nil in fixture mode
	fixture     []byte
	generation  uint64
	fingerprint string
	// version counts changes of what is served (SetFleet, RemoveDevice,
	// SetBMCIP); cached holds the body rendered for cachedAt (ETags on).
	version    uint64
	cached     rendered
	cachedAt   uint64
	cacheValid bool
	started    bool
	closed     bool
	url        string
	srv        *http.Server

	fault       atomic.Int32
	requests    atomic.Int64
	notModified atomic.Int64
	conns       atomic.Int64
	bytesSent   atomic.Int64

	baseCtx    context.Context // parent of every request context
	cancelBase context.CancelFunc
	done       chan struct{} // closed by Close
	wg         sync.WaitGroup
	closeOnce  sync.Once
	closeErr   error
}

var _ http.Handler = (*Server)(nil)

// New returns a server for a fleet or a fixture; call Start to listen.
func New(opts Options) (*Server, error) {
	set := 0
	for _, b := range []bool{opts.Fleet != nil, opts.Fixture != nil, opts.FixturePath != ""} {
		if b {
			set++
		}
	}
	if set != 1 {
		return nil, errors.New("matsim: exactly one of Options.Fleet, Fixture and FixturePath must be set")
	}
	if opts.SlowDelay < 0 {
		return nil, fmt.Errorf("matsim: negative SlowDelay %v", opts.SlowDelay)
	}
	s := &Server{
		legacy:     opts.Legacy,
		etags:      !opts.DisableETag,
		slowDelay:  opts.SlowDelay,
		epochID:    opts.EpochID,
		log:        opts.Logger,
		generation: 1,
		done:       make(chan struct{}),
	}
	if s.slowDelay == 0 {
		s.slowDelay = DefaultSlowDelay
	}
	if s.epochID == "" {
		s.epochID = time.Now().UTC().Format("2006-01-02T15:04:05.000000000Z")
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case opts.Fleet != nil:
		if err := opts.Fleet.Validate(); err != nil {
			return nil, fmt.Errorf("matsim: fleet: %w", err)
		}
		s.fleet = opts.Fleet.Clone()
		s.fingerprint = fingerprint(s.fleet.Machines)
	case opts.Fixture != nil:
		s.fixture = slices.Clone(opts.Fixture)
	default:
		b, err := os.ReadFile(opts.FixturePath)
		if err != nil {
			return nil, fmt.Errorf("matsim: fixture: %w", err)
		}
		s.fixture = b
	}
	if s.fixture != nil {
		// Served as it is all the same (a malformed body is what some
		// fixtures are for), but Devices and BMCs count 0 for it.
		if _, err := matclient.Decode(s.fixture); err != nil {
			name := opts.FixturePath
			if name == "" {
				name = "Options.Fixture"
			}
			s.log.Warn("matsim: the fixture is not a MAT status: served byte for byte, counted as 0 devices", "fixture", name, "error", err)
		}
	}
	cert, pair, err := serverCert(opts)
	if err != nil {
		return nil, err
	}
	if cert != nil {
		s.cert = cert.Leaf
		s.tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}}
	}
	if pair != nil {
		// A re-issued certificate (cert-manager renewing the Secret) is
		// served from the next handshake on.
		s.tlsConfig.Certificates = nil
		s.tlsConfig.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c := pair.Current()
			return &c, nil
		}
	}
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /machines/status", s.serveStatus)
	// Liveness for healthchecks (compose, probes); not counted in Requests.
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if opts.FaultControl {
		s.mux.HandleFunc("GET "+FaultPath, s.serveFault)
		s.mux.HandleFunc("PUT "+FaultPath, s.serveFault)
	}
	return s, nil
}

// ServeHTTP serves `GET /machines/status` (HEAD too) and `GET /healthz`;
// other paths are 404.
// Start uses it; it can also be mounted in another server (the connection
// counter then stays 0).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Start listens on addr (e.g. "127.0.0.1:0") and serves in a goroutine
// until ctx ends or Close is called. It returns the base URL,
// "http://host:port" or "https://host:port" (an unspecified listen address
// is reported as 127.0.0.1). A Server starts at most once.
func (s *Server) Start(ctx context.Context, addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", ErrServerClosed
	}
	if s.started {
		return "", ErrStarted
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("matsim: listen: %w", err)
	}
	s.started = true
	ln = countingListener{Listener: ln, n: &s.bytesSent}
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		TLSConfig:         s.tlsConfig,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
	}
	scheme := "http"
	if s.tlsConfig != nil {
		scheme = "https"
	}
	s.url = scheme + "://" + reportedAddr(ln.Addr())

	srv := s.srv
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		var err error
		if s.tlsConfig != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("matsim: serve", "url", s.url, "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		select {
		case <-ctx.Done():
			_ = s.shutdown()
		case <-s.done:
		}
	}()
	s.log.Debug("matsim: started", "url", s.url)
	return s.url, nil
}

func reportedAddr(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	if ap.Addr().IsUnspecified() {
		return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port()).String()
	}
	return ap.String()
}

// Close stops the server: request contexts are canceled (so FaultHang and
// FaultSlow handlers return), connections are shut down and every goroutine
// Start began has exited when it returns. Close is idempotent; a Server that
// was never started just becomes closed.
func (s *Server) Close() error {
	err := s.shutdown()
	s.wg.Wait()
	return err
}

func (s *Server) shutdown() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		srv := s.srv
		s.mu.Unlock()
		close(s.done)
		s.cancelBase()
		if srv == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			s.closeErr = errors.Join(fmt.Errorf("matsim: shutdown: %w", err), srv.Close())
		}
	})
	return s.closeErr
}

// URL returns the base URL Start reported ("" before Start).
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Certificate returns the server's leaf certificate, self-signed or given
// (nil without TLS).
func (s *Server) Certificate() *x509.Certificate { return s.cert }

// CertPool returns a pool holding only the server's leaf certificate, for
// clients that verify it (nil without TLS). It verifies a self-signed
// certificate; one issued by a CA is verified with that CA instead.
func (s *Server) CertPool() *x509.CertPool {
	if s.cert == nil {
		return nil
	}
	p := x509.NewCertPool()
	p.AddCert(s.cert)
	return p
}

// FaultPath is where a Server with Options.FaultControl serves its fault
// mode (not counted in Requests).
const FaultPath = "/matsim/fault"

// serveFault answers GET FaultPath with the fault mode ("500\n") and PUT
// FaultPath, whose body (at most 64 bytes) names a mode, by setting it and
// answering "fault 500: every status request fails that way; PUT none to
// heal" (400 with the accepted names for an unknown mode).
func (s *Server) serveFault(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method == http.MethodGet {
		fmt.Fprintf(w, "%s\n", s.Fault())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 65))
	if err != nil || len(body) > 64 {
		http.Error(w, "matsim: want a fault mode of at most 64 bytes in the body", http.StatusBadRequest)
		return
	}
	f, err := ParseFaultMode(string(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.SetFault(f)
	s.log.Info("fault mode set", "fault", f.String())
	if f == FaultNone {
		fmt.Fprintf(w, "fault none: status requests are served normally\n")
		return
	}
	fmt.Fprintf(w, "fault %s: every status request fails that way; PUT none to heal\n", f)
}

// SetFault sets the fault mode for later requests.
func (s *Server) SetFault(f FaultMode) { s.fault.Store(int32(f)) }

// Fault returns the current fault mode.
func (s *Server) Fault() FaultMode { return FaultMode(s.fault.Load()) }

// Requests returns how many `GET /machines/status` requests the server has
// received (faulted ones included).
func (s *Server) Requests() int64 { return s.requests.Load() }

// NotModified returns how many `GET /machines/status` requests were
// answered 304 Not Modified (a matching If-None-Match; always 0 with
// Options.DisableETag).
func (s *Server) NotModified() int64 { return s.notModified.Load() }

// BytesSent returns how many bytes the server has written to its
// connections since Start: everything on the wire above TCP (TLS records
// and handshakes included, /healthz too). It stays 0 for a Server mounted
// in another server (ServeHTTP).
func (s *Server) BytesSent() int64 { return s.bytesSent.Load() }

// Connections returns how many TCP connections the server has accepted
// (counted via http.Server.ConnState). A client that reuses connections
// keeps this at 1.
func (s *Server) Connections() int64 { return s.conns.Load() }

// Generation returns the generation of the last served body (1 before the
// first request). Like MAT, a request bumps it by exactly 1 when the host
// set's fingerprint (top-level machines' mat_id, machine_id, hardware_type
// and InfiniBand ports) changed since the previous request; BMC IP changes,
// DPUs, switches and power shelves do not bump it. 0 in fixture mode.
func (s *Server) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet == nil {
		return 0
	}
	return s.generation
}

// Fleet returns a copy of the served fleet (nil in fixture mode).
func (s *Server) Fleet() *Fleet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fleet.Clone()
}

// Devices returns the number of devices the server reports (DPUs
// included). In fixture mode it decodes the fixture; a fixture that does
// not decode counts 0.
func (s *Server) Devices() int {
	f := s.countable()
	if f == nil {
		return 0
	}
	return f.Devices()
}

// BMCs returns the number of devices with a BMC IP, i.e. how many BMC
// Services a controller should make for this instance (if no two share an
// IP). Fixture mode as for Devices.
func (s *Server) BMCs() int {
	f := s.countable()
	if f == nil {
		return 0
	}
	return f.BMCs()
}

func (s *Server) countable() *Fleet {
	s.mu.Lock()
	fleet, fixture := s.fleet, s.fixture
	s.mu.Unlock()
	if fleet != nil {
		return fleet // never mutated in place: setters swap in copies
	}
	st, err := matclient.Decode(fixture)
	if err != nil {
		return nil
	}
	return &Fleet{InventoryID: st.InventoryID, Machines: st.Machines}
}

// SetFleet replaces what the server reports with a copy of f (switching a
// fixture server to fleet mode). The generation is bumped on the next
// request if the host set differs.
func (s *Server) SetFleet(f *Fleet) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("matsim: fleet: %w", err)
	}
	c := f.Clone()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet == nil {
		s.fingerprint = fingerprint(c.Machines)
		s.generation = 1
	}
	s.fleet, s.fixture = c, nil
	s.version++
	return nil
}

// Restart makes the server answer as a MAT that restarted: a new epoch_id
// (epochID; "" means now, in MAT's format), generation 1 and a copy of f as
// its inventory (an empty Fleet for a MAT that has registered nothing
// yet). Later SetFleet calls keep that epoch and bump the generation as
// usual, as MAT does while it registers its machines.
func (s *Server) Restart(epochID string, f *Fleet) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("matsim: fleet: %w", err)
	}
	if epochID == "" {
		epochID = time.Now().UTC().Format("2006-01-02T15:04:05.000000000Z")
	}
	c := f.Clone()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fleet, s.fixture = c, nil
	s.epochID, s.generation, s.fingerprint = epochID, 1, fingerprint(c.Machines)
	s.version++
	return nil
}

// RemoveDevice removes the device with the given mat_id (a top-level device
// with its DPUs, or one DPU). Errors: ErrUnknownDevice, ErrFixtureMode.
func (s *Server) RemoveDevice(matID string) error {
	return s.update(matID, func(ms []matclient.Device, i int) []matclient.Device {
		return slices.Delete(ms, i, i+1)
	})
}

// SetBMCIP sets the BMC IP of the device with the given mat_id; "" removes
// it (the BMC has no DHCP lease yet). The IP may equal another device's, to
// simulate duplicate BMC IPs. Errors: an invalid IPv4 address,
// ErrUnknownDevice, ErrFixtureMode.
func (s *Server) SetBMCIP(matID, ip string) error {
	if ip != "" {
		a, err := netip.ParseAddr(ip)
		if err != nil || !a.Is4() {
			return fmt.Errorf("matsim: %q is not an IPv4 address", ip)
		}
		ip = a.String()
	}
	return s.update(matID, func(ms []matclient.Device, i int) []matclient.Device {
		ms[i].BMC.IP = ip
		return ms
	})
}

// update finds matID in a copy of the fleet, applies fn to the slice
// holding it and swaps the copy in.
func (s *Server) update(matID string, fn func(ms []matclient.Device, i int) []matclient.Device) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet == nil {
		return ErrFixtureMode
	}
	f := s.fleet.Clone()
	for i := range f.Machines {
		if f.Machines[i].MatID == matID {
			f.Machines = fn(f.Machines, i)
			s.fleet = f
			s.version++
			return nil
		}
		h := &f.Machines[i]
		for j := range h.DPUs {
			if h.DPUs[j].MatID == matID {
				h.DPUs = fn(h.DPUs, j)
				if len(h.DPUs) == 0 {
					h.DPUs = nil
				}
				s.fleet = f
				s.version++
				return nil
			}
		}
	}
	return fmt.Errorf("%w: %q", ErrUnknownDevice, matID)
}

// rendered is a status body and its entity tag ("" with ETags off).
type rendered struct {
	body []byte
	etag string
}

// body returns the current status, bumping the generation like MAT does.
// With ETags on, a body is rendered and tagged once per version and then
// served from the cache: what is served changes only through the setters,
// which bump the version, so the generation rule sees every change.
func (s *Server) body() (rendered, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etags && s.cacheValid && s.cachedAt == s.version {
		return s.cached, nil
	}
	var r rendered
	if s.fleet == nil {
		r.body = s.fixture
	} else {
		if fp := fingerprint(s.fleet.Machines); fp != s.fingerprint {
			s.fingerprint = fp
			s.generation++
		}
		b, err := s.fleet.Encode(s.epochID, s.generation, s.legacy)
		if err != nil {
			return rendered{}, err
		}
		r.body = b
	}
	if s.etags {
		r.etag = etagOf(r.body)
		s.cached, s.cachedAt, s.cacheValid = r, s.version, true
	}
	return r, nil
}

func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	fault := s.Fault()
	s.log.Debug("matsim: request", "remote", r.RemoteAddr, "fault", fault)
	switch fault {
	case Fault500:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"matsim: injected fault"}`))
		return
	case FaultHang:
		<-r.Context().Done()
		return
	case FaultSlow:
		t := time.NewTimer(s.slowDelay)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
	cur, err := s.body()
	if err != nil {
		http.Error(w, "matsim: encode: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if fault == FaultMalformed {
		// A broken body has no entity tag and is never "not modified".
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(cur.body[:len(cur.body)/2])
		return
	}
	if cur.etag != "" {
		w.Header().Set("ETag", cur.etag)
		if inm := strings.Join(r.Header.Values("If-None-Match"), ","); inm != "" && noneMatch(inm, cur.etag) {
			s.notModified.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(cur.body)
}
