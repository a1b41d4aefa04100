package matclient

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newClient(t *testing.T, base string, cfg Config) *Client {
	t.Helper()
	c, err := New(base, cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", base, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// countingServer is an httptest server that counts new TCP connections.
type countingServer struct {
	*httptest.Server
	conns atomic.Int64
}

func newCountingServer(t *testing.T, h http.Handler, tls bool) *countingServer {
	t.Helper()
	cs := &countingServer{Server: httptest.NewUnstartedServer(h)}
	cs.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshake noise
	cs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			cs.conns.Add(1)
		}
	}
	if tls {
		cs.StartTLS()
	} else {
		cs.Start()
	}
	t.Cleanup(cs.Close)
	return cs
}

func fixtureHandler(t *testing.T, name string) http.Handler {
	body := readFixture(t, name)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/machines/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

func TestParseBaseURL(t *testing.T) {
	tests := []struct {
		name, in   string
		wantStatus string // "" = invalid
		notInErr   string // must not leak into the error
		wantErr    string // must be in the error
	}{
		{name: "https with port and slash", in: "https://h:1266/", wantStatus: "https://h:1266/machines/status"},
		{name: "http no slash", in: "http://mat.ns.svc", wantStatus: "http://mat.ns.svc/machines/status"},
		{name: "path prefix", in: "https://h:1266/mat/a", wantStatus: "https://h:1266/mat/a/machines/status"},
		{name: "path prefix with slash", in: "https://h/mat/", wantStatus: "https://h/mat/machines/status"},
		{name: "ipv6 host", in: "http://[::1]:8080", wantStatus: "http://[::1]:8080/machines/status"},
		{name: "upper-case scheme", in: "HTTPS://h", wantStatus: "https://h/machines/status"},
		{name: "max port", in: "http://h:65535", wantStatus: "http://h:65535/machines/status"},
		{name: "empty", in: ""},
		{name: "no scheme", in: "h:1266"},
		{name: "host only", in: "mat.example"},
		{name: "relative", in: "/machines"},
		{name: "ftp", in: "ftp://h/"},
		{name: "ws", in: "ws://h/"},
		{name: "no host", in: "https://"},
		{name: "port without host", in: "https://:1266/"},
		{name: "opaque", in: "http:h:1266"},
		{name: "mailto", in: "mailto:someone@h"},
		{name: "userinfo", in: "https://admin:s3cr3t@h:1266/", notInErr: "s3cr3t"},
		{name: "user only", in: "https://admin@h/"},
		{name: "query", in: "https://h/?x=1"},
		{name: "empty query", in: "https://h/?"},
		{name: "fragment", in: "https://h/#top"},
		{name: "empty fragment", in: "https://h/#"},
		{name: "port zero", in: "https://h:0/"},
		{name: "port too big", in: "https://h:70000/"},
		{name: "port not numeric", in: "https://h:https/"},
		{name: "control char", in: "https://h/\n"},
		{name: "space in host", in: "https://h h/"},
		{name: "status URL", in: "https://127.0.0.1:37631/machines/status", wantErr: `give the instance's base URL "https://127.0.0.1:37631/"`},
		{name: "status URL with slash", in: "https://h/machines/status/", wantErr: `base URL "https://h/"`},
		{name: "status URL under a prefix", in: "https://h/mat/a/machines/status", wantErr: `base URL "https://h/mat/a/"`},
		{name: "path merely containing it", in: "https://h/machines/status-api", wantStatus: "https://h/machines/status-api/machines/status"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.in, Config{})
			if tt.wantStatus == "" {
				if err == nil {
					_ = c.Close()
					t.Fatalf("New(%q) succeeded, want ErrInvalidURL", tt.in)
				}
				if !errors.Is(err, ErrInvalidURL) {
					t.Errorf("error %v does not wrap ErrInvalidURL", err)
				}
				if IsTransient(err) {
					t.Errorf("IsTransient(%v) = true", err)
				}
				if tt.notInErr != "" && strings.Contains(err.Error(), tt.notInErr) {
					t.Errorf("error %q leaks %q", err, tt.notInErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not say %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%q): %v", tt.in, err)
			}
			defer c.Close()
			if c.StatusURL() != tt.wantStatus {
				t.Errorf("StatusURL = %q, want %q", c.StatusURL(), tt.wantStatus)
			}
			if c.URL() != tt.in {
				t.Errorf("URL = %q, want %q", c.URL(), tt.in)
			}
		})
	}
}

func TestNewConfig(t *testing.T) {
	for _, cfg := range []Config{{Timeout: -time.Second}, {MaxBodyBytes: -1}} {
		if _, err := New("http://h", cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	c := newClient(t, "http://h", Config{})
	if c.http.Timeout != DefaultTimeout || c.maxBody != DefaultMaxBodyBytes || c.userAgent != DefaultUserAgent {
		t.Errorf("defaults = %v %d %q", c.http.Timeout, c.maxBody, c.userAgent)
	}
	if c.transport == http.DefaultTransport || c.http.Transport != c.transport || c.transport.DisableKeepAlives {
		t.Errorf("client must own a keep-alive transport")
	}
}

func TestStatusOK(t *testing.T) {
	var gotAccept, gotUA, gotMethod atomic.Value
	srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAccept.Store(r.Header.Get("Accept"))
		gotUA.Store(r.Header.Get("User-Agent"))
		gotMethod.Store(r.Method)
		fixtureHandler(t, "v2-mixed.json").ServeHTTP(w, r)
	}), false)
	c := newClient(t, srv.URL+"/", Config{UserAgent: "matbus-test/1"})
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.Generation != 7 || st.Counts().Total() != 10 {
		t.Errorf("status = generation %d, %d devices", st.Generation, st.Counts().Total())
	}
	if gotAccept.Load() != "application/json" || gotUA.Load() != "matbus-test/1" || gotMethod.Load() != http.MethodGet {
		t.Errorf("request = %v Accept %v UA %v", gotMethod.Load(), gotAccept.Load(), gotUA.Load())
	}
}

func TestStatusBasePath(t *testing.T) {
	var path atomic.Value
	srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.Path)
		_, _ = io.WriteString(w, `{"machines":[]}`)
	}), false)
	c := newClient(t, srv.URL+"/proxy/mat-0", Config{})
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	if path.Load() != "/proxy/mat-0/machines/status" {
		t.Errorf("path = %v", path.Load())
	}
}

func TestStatusHTTPErrors(t *testing.T) {
	long := strings.Repeat("x", 2000)
	tests := []struct {
		code      int
		body      string
		transient bool
	}{
		{http.StatusBadRequest, "bad", false},
		{http.StatusUnauthorized, "", false},
		{http.StatusForbidden, "forbidden", false},
		{http.StatusNotFound, "404 page not found", false},
		{http.StatusRequestTimeout, "", true},
		{http.StatusConflict, "", false},
		{http.StatusUnprocessableEntity, "", false},
		{http.StatusTooManyRequests, "slow down", true},
		{http.StatusInternalServerError, long, true},
		{http.StatusNotImplemented, "", true},
		{http.StatusBadGateway, "", true},
		{http.StatusServiceUnavailable, "", true},
		{http.StatusGatewayTimeout, "", true},
		{http.StatusNotModified, "", false},
		{http.StatusMultipleChoices, "", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.code), func(t *testing.T) {
			srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(tt.code)
				_, _ = io.WriteString(w, tt.body)
			}), false)
			c := newClient(t, srv.URL, Config{})
			for range 3 {
				_, err := c.Status(context.Background())
				var he *HTTPError
				if !errors.As(err, &he) {
					t.Fatalf("error %v is not *HTTPError", err)
				}
				if he.StatusCode != tt.code || he.URL != srv.URL+"/machines/status" {
					t.Errorf("HTTPError = %d %q", he.StatusCode, he.URL)
				}
				wantBody := tt.body
				if tt.code == http.StatusNotModified {
					wantBody = "" // no body allowed
				}
				if len(wantBody) > 512 {
					wantBody = wantBody[:512]
				}
				if he.Body != wantBody {
					t.Errorf("Body = %d bytes %.20q, want %d bytes", len(he.Body), he.Body, len(wantBody))
				}
				if he.RetryAfter != 7*time.Second {
					t.Errorf("RetryAfter = %v", he.RetryAfter)
				}
				if got := IsTransient(err); got != tt.transient {
					t.Errorf("IsTransient = %v, want %v", got, tt.transient)
				}
				if got := IsTransient(fmt.Errorf("sync: %w", err)); got != tt.transient {
					t.Errorf("IsTransient(wrapped) = %v, want %v", got, tt.transient)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("HTTP %d", tt.code)) {
					t.Errorf("message %q", err)
				}
			}
			// Error bodies are drained: one connection for all three calls.
			if n := srv.conns.Load(); n != 1 {
				t.Errorf("%d connections for 3 error responses, want 1", n)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 8, 21, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"": 0, "0": 0, "30": 30 * time.Second, "-5": 0, "soon": 0,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat):       0,
	} {
		if got := retryAfter(in, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestStatusInvalidBody(t *testing.T) {
	srv := newCountingServer(t, fixtureHandler(t, "malformed/generation-as-string.json"), false)
	c := newClient(t, srv.URL, Config{})
	for range 5 {
		_, err := c.Status(context.Background())
		if !errors.Is(err, ErrInvalidStatus) || IsTransient(err) {
			t.Fatalf("Status = %v (transient %v), want permanent ErrInvalidStatus", err, IsTransient(err))
		}
		want := "matclient: GET " + srv.URL + "/machines/status: invalid status: generation: cannot unmarshal string into uint64"
		if !strings.HasPrefix(err.Error(), want) {
			t.Errorf("error = %q\nwant prefix %q", err, want)
		}
		var de *DecodeError
		if !errors.As(err, &de) || de.Path != "generation" {
			t.Errorf("DecodeError = %+v", de)
		}
	}
	if n := srv.conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// TestStatusInvalidDevice: a body whose only fault is in one device is a
// status, not an error; the device is listed in Invalid.
func TestStatusInvalidDevice(t *testing.T) {
	srv := newCountingServer(t, fixtureHandler(t, "malformed/port-out-of-range.json"), false)
	st, err := newClient(t, srv.URL, Config{}).Status(context.Background())
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	want := []InvalidDevice{{Path: "machines[0]", MatID: "0c6f3a52-91d4-4b7e-8f20-5a6b7c8d9e01",
		Reason: "bmc.redfish.listen_port: 70000 is out of range 1..65535"}}
	if len(st.Machines) != 0 || !reflect.DeepEqual(st.Invalid, want) {
		t.Errorf("machines %+v invalid %+v, want none and %+v", st.Machines, st.Invalid, want)
	}
}

func TestStatusBodyCap(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	n := int64(len(body))
	tests := []struct {
		name    string
		max     int64
		chunked bool
		wantErr bool
	}{
		{"exact limit", n, false, false},
		{"exact limit chunked", n, true, false},
		{"one byte over", n - 1, false, true},
		{"one byte over chunked", n - 1, true, true},
		{"far over", 100, false, true},
		{"far over chunked", 100, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.chunked {
					// Flush before the body so no Content-Length is set.
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
				} else {
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				}
				_, _ = w.Write(body)
			}), false)
			c := newClient(t, srv.URL, Config{MaxBodyBytes: tt.max})
			st, err := c.Status(context.Background())
			if !tt.wantErr {
				if err != nil || st.Generation != 7 {
					t.Fatalf("Status = %v, %v", st, err)
				}
				return
			}
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("Status error = %v, want ErrBodyTooLarge", err)
			}
			if IsTransient(err) || errors.Is(err, ErrInvalidStatus) {
				t.Errorf("body cap error %v: transient %v", err, IsTransient(err))
			}
		})
	}
}

func TestStatusLargeBodyNotBuffered(t *testing.T) {
	// 64 MiB of garbage with a 1 KiB cap: the client reads at most cap+1
	// bytes plus a bounded drain, then gives up.
	var written atomic.Int64
	srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		chunk := []byte(strings.Repeat(" ", 64<<10))
		for range 1024 {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}), false)
	c := newClient(t, srv.URL, Config{MaxBodyBytes: 1 << 10})
	if _, err := c.Status(context.Background()); !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("Status = %v, want ErrBodyTooLarge", err)
	}
	srv.CloseClientConnections()
	if w := written.Load(); w >= 64<<20 {
		t.Errorf("server wrote the whole %d bytes", w)
	}
}

func TestStatusTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}), false)
	defer close(release)

	t.Run("config timeout", func(t *testing.T) {
		c := newClient(t, srv.URL, Config{Timeout: 100 * time.Millisecond})
		start := time.Now()
		_, err := c.Status(context.Background())
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("took %v", el)
		}
		if err == nil || !IsTransient(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Status = %v (transient %v), want transient deadline", err, IsTransient(err))
		}
	})
	t.Run("context deadline", func(t *testing.T) {
		c := newClient(t, srv.URL, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.Status(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !IsTransient(err) {
			t.Errorf("Status = %v (transient %v), want transient deadline", err, IsTransient(err))
		}
	})
	t.Run("context canceled", func(t *testing.T) {
		c := newClient(t, srv.URL, Config{})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := c.Status(ctx)
		if !errors.Is(err, context.Canceled) || IsTransient(err) {
			t.Errorf("Status = %v (transient %v), want non-transient canceled", err, IsTransient(err))
		}
	})
	t.Run("timeout while reading body", func(t *testing.T) {
		slow := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"machines": [`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}), false)
		c := newClient(t, slow.URL, Config{Timeout: 150 * time.Millisecond})
		_, err := c.Status(context.Background())
		if err == nil || !IsTransient(err) || errors.Is(err, ErrInvalidStatus) {
			t.Errorf("Status = %v (transient %v), want transient timeout", err, IsTransient(err))
		}
	})
}

func TestStatusConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c := newClient(t, "http://"+addr, Config{Timeout: 2 * time.Second})
	_, err = c.Status(context.Background())
	if err == nil || !IsTransient(err) {
		t.Fatalf("Status = %v, want transient network error", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) {
		t.Errorf("error %v is not a net.Error", err)
	}
	if !strings.HasPrefix(err.Error(), "matclient: GET http://"+addr+"/machines/status: ") || strings.Contains(err.Error(), `Get "`) {
		t.Errorf("message = %q", err)
	}
}

func TestStatusServerDropsConnection(t *testing.T) {
	srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Error("no hijacker")
			return
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"machines\":")
		_ = buf.Flush()
		_ = conn.Close()
	}), false)
	c := newClient(t, srv.URL, Config{})
	_, err := c.Status(context.Background())
	if err == nil || !IsTransient(err) || errors.Is(err, ErrInvalidStatus) {
		t.Errorf("Status = %v (transient %v), want transient unexpected EOF", err, IsTransient(err))
	}
}

func TestStatusHTTPS(t *testing.T) {
	srv := newCountingServer(t, fixtureHandler(t, "v2-empty.json"), true)

	t.Run("unknown CA is permanent", func(t *testing.T) {
		c := newClient(t, srv.URL, Config{})
		_, err := c.Status(context.Background())
		if err == nil || IsTransient(err) {
			t.Errorf("Status = %v (transient %v), want permanent certificate error", err, IsTransient(err))
		}
	})
	t.Run("insecure skip verify", func(t *testing.T) {
		c := newClient(t, srv.URL, Config{InsecureSkipVerify: true})
		if _, err := c.Status(context.Background()); err != nil {
			t.Errorf("Status: %v", err)
		}
	})
	t.Run("root CAs", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		c := newClient(t, srv.URL, Config{RootCAs: pool})
		if _, err := c.Status(context.Background()); err != nil {
			t.Errorf("Status: %v", err)
		}
	})
	t.Run("https to plain http is permanent", func(t *testing.T) {
		plain := newCountingServer(t, fixtureHandler(t, "v2-empty.json"), false)
		c := newClient(t, strings.Replace(plain.URL, "http://", "https://", 1), Config{})
		_, err := c.Status(context.Background())
		if err == nil || IsTransient(err) {
			t.Errorf("Status = %v (transient %v), want permanent", err, IsTransient(err))
		}
	})
}

func TestConnectionReuse(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tls), func(t *testing.T) {
			srv := newCountingServer(t, fixtureHandler(t, "v2-mixed.json"), tls)
			c := newClient(t, srv.URL, Config{InsecureSkipVerify: true})
			for i := range 20 {
				if _, err := c.Status(context.Background()); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			if n := srv.conns.Load(); n != 1 {
				t.Errorf("20 calls opened %d connections, want 1", n)
			}
		})
	}
}

func TestConcurrentStatus(t *testing.T) {
	srv := newCountingServer(t, fixtureHandler(t, "v2-mixed.json"), false)
	c := newClient(t, srv.URL, Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 8 {
		wg.Go(func() {
			for range 5 {
				if _, err := c.Status(context.Background()); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Connections beyond the idle pool (4) are closed after use, so the
	// count depends on scheduling; but most calls must reuse one.
	if n := srv.conns.Load(); n > 20 {
		t.Errorf("%d connections for 40 calls", n)
	}
}

func TestClose(t *testing.T) {
	srv := newCountingServer(t, fixtureHandler(t, "v2-empty.json"), false)
	c, err := New(srv.URL, Config{})
	if err != nil {
		t.Fatal(err)
	}
	var closer io.Closer = c
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := closer.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := closer.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
	_, err = c.Status(context.Background())
	if !errors.Is(err, ErrClosed) || IsTransient(err) {
		t.Errorf("Status after Close = %v, want permanent ErrClosed", err)
	}
	if c.URL() != srv.URL {
		t.Errorf("URL after Close = %q", c.URL())
	}
}

func TestCloseCancelsInFlight(t *testing.T) {
	started := make(chan struct{}, 1)
	srv := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-r.Context().Done()
	}), false)
	c, err := New(srv.URL, Config{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Status(context.Background())
		done <- err
	}()
	<-started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) || IsTransient(err) {
			t.Errorf("in-flight Status = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight Status not canceled by Close")
	}
}

type fakeNetErr struct{ timeout bool }

func (e fakeNetErr) Error() string   { return "fake net error" }
func (e fakeNetErr) Timeout() bool   { return e.timeout }
func (e fakeNetErr) Temporary() bool { return false }

func TestIsTransient(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("boom"), false},
		{"canceled", context.Canceled, false},
		{"wrapped canceled", fmt.Errorf("x: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, true},
		{"wrapped deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"net op error", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{"net error", fakeNetErr{}, true},
		{"dns", &net.DNSError{Err: "no such host", Name: "mat", IsNotFound: true}, true},
		{"url error with net cause", &url.Error{Op: "Get", URL: "http://h", Err: &net.OpError{Op: "dial", Err: errors.New("refused")}}, true},
		{"url error canceled", &url.Error{Op: "Get", URL: "http://h", Err: context.Canceled}, false},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"EOF", io.EOF, true},
		{"408", &HTTPError{StatusCode: 408}, true},
		{"429", &HTTPError{StatusCode: 429}, true},
		{"500", &HTTPError{StatusCode: 500}, true},
		{"503 wrapped", fmt.Errorf("sync: %w", &HTTPError{StatusCode: 503}), true},
		{"599", &HTTPError{StatusCode: 599}, true},
		{"400", &HTTPError{StatusCode: 400}, false},
		{"403", &HTTPError{StatusCode: 403}, false},
		{"404", &HTTPError{StatusCode: 404}, false},
		{"invalid status", invalid("machines", "is null"), false},
		{"invalid status wrapping EOF", &DecodeError{Reason: "x", Err: io.ErrUnexpectedEOF}, false},
		{"invalid url", fmt.Errorf("%w: x", ErrInvalidURL), false},
		{"closed", ErrClosed, false},
		{"closed op", &opError{url: "u", err: ErrClosed}, false},
		{"body too large", &opError{url: "u", err: fmt.Errorf("%w: big", ErrBodyTooLarge), network: true}, false},
		{"network op error", &opError{url: "u", err: errors.New("http2: stream reset"), network: true}, true},
		{"scheme mismatch", &url.Error{Op: "Get", URL: "https://h", Err: http.ErrSchemeMismatch}, false},
		{"unknown authority", &url.Error{Op: "Get", URL: "https://h", Err: x509.UnknownAuthorityError{}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsTransient(tt.err); got != tt.want {
				t.Errorf("IsTransient(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestHTTPErrorMessage(t *testing.T) {
	e := &HTTPError{StatusCode: 503, URL: "https://h/machines/status", Body: " overloaded\n"}
	if got, want := e.Error(), "matclient: GET https://h/machines/status: HTTP 503 Service Unavailable: overloaded"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &HTTPError{StatusCode: 599, URL: "u", Body: "\xff"}
	if got := e.Error(); !strings.Contains(got, "HTTP 599: \uFFFD") {
		t.Errorf("Error() = %q", got)
	}
}
