package matclient

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
)

// condServer is a status endpoint whose answers a test scripts: the body,
// the ETag it sends ("" none), and whether it honours If-None-Match. It
// records every request's headers.
type condServer struct {
	*httptest.Server
	mu       sync.Mutex
	body     []byte
	etag     string
	honour   bool   // answer 304 when If-None-Match equals etag
	force304 string // if set, answer every request 304 with this ETag
	headers  []http.Header
}

func newCondServer(t *testing.T, body []byte, etag string) *condServer {
	t.Helper()
	cs := &condServer{body: body, etag: etag, honour: true}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		cs.headers = append(cs.headers, r.Header.Clone())
		if cs.force304 != "" {
			w.Header().Set("ETag", cs.force304)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		if cs.etag != "" {
			w.Header().Set("ETag", cs.etag)
			if cs.honour && r.Header.Get("If-None-Match") == cs.etag {
				w.WriteHeader(http.StatusNotModified)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(cs.body)
	}))
	t.Cleanup(cs.Close)
	return cs
}

func (cs *condServer) set(body []byte, etag string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.body, cs.etag = body, etag
}

// plainRequests fails t unless the server got n requests, each with the
// headers of the first (a test's first request is a plain Status call).
func (cs *condServer) plainRequests(t *testing.T, n int) {
	t.Helper()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.headers) != n {
		t.Fatalf("%d requests, want %d", len(cs.headers), n)
	}
	for i, h := range cs.headers {
		if !reflect.DeepEqual(h, cs.headers[0]) {
			t.Errorf("request %d headers %v, want those of Status %v", i, h, cs.headers[0])
		}
	}
}

// inm returns the If-None-Match of request i ("" none) and how many
// requests there were.
func (cs *condServer) inm(i int) (string, int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if i >= len(cs.headers) {
		return "<no request>", len(cs.headers)
	}
	return cs.headers[i].Get("If-None-Match"), len(cs.headers)
}

func mustChanged(t *testing.T, c *Client, prev string) (*Status, string) {
	t.Helper()
	st, fp, err := c.StatusIfChanged(context.Background(), prev)
	if err != nil {
		t.Fatalf("StatusIfChanged(%.16q): %v", prev, err)
	}
	return st, fp
}

// A MAT that sends no ETag gets exactly the requests of a client without
// conditional requests: every request's headers equal those of a plain
// Status call, whatever the caller's fingerprint.
func TestNoETagRequestsUnchanged(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	srv := newCondServer(t, body, "")
	c := newClient(t, srv.URL, Config{})
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, fp := mustChanged(t, c, "")
	for range 3 {
		if st, got := mustChanged(t, c, fp); st != nil || got != fp {
			t.Fatalf("unchanged body: status %v, fingerprint %q", st != nil, got)
		}
	}
	mustChanged(t, c, "")
	srv.plainRequests(t, 6)
	if v, _ := srv.inm(0); v != "" {
		t.Errorf("If-None-Match %q sent to a MAT without ETag", v)
	}
}

// With a strong ETag: a poll with the fingerprint of the last good body
// sends If-None-Match and a 304 is "unchanged"; a full sync (prev "")
// never sends it; a changed body is decoded and its ETag used next.
func TestConditionalPolls(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	srv := newCondServer(t, body, `"v1"`)
	c := newClient(t, srv.URL, Config{})

	st, fp := mustChanged(t, c, "")
	if st == nil || fp != Fingerprint(body) {
		t.Fatalf("first fetch: status %v, fingerprint %q", st != nil, fp)
	}
	if v, _ := srv.inm(0); v != "" {
		t.Errorf("first fetch sent If-None-Match %q", v)
	}
	st, got := mustChanged(t, c, fp)
	if st != nil || got != fp {
		t.Fatalf("304: status %v, fingerprint %q, want nil, %q", st != nil, got, fp)
	}
	if v, _ := srv.inm(1); v != `"v1"` {
		t.Errorf("poll sent If-None-Match %q, want \"v1\"", v)
	}
	// A full sync asks without conditions and gets the body decoded.
	if st, _ := mustChanged(t, c, ""); st == nil {
		t.Fatal("full sync returned no status")
	}
	if v, _ := srv.inm(2); v != "" {
		t.Errorf("full sync sent If-None-Match %q", v)
	}
	// A fingerprint of another body: no condition.
	mustChanged(t, c, "sha256:other")
	if v, _ := srv.inm(3); v != "" {
		t.Errorf("poll with another fingerprint sent If-None-Match %q", v)
	}

	moved := bytes.Replace(body, []byte(`"10.96.64.13"`), []byte(`"10.96.64.99"`), 1)
	srv.set(moved, `"v2"`)
	st, fp2 := mustChanged(t, c, fp)
	if st == nil || fp2 != Fingerprint(moved) {
		t.Fatalf("changed body: status %v, fingerprint %q", st != nil, fp2)
	}
	if v, _ := srv.inm(4); v != `"v1"` {
		t.Errorf("poll sent If-None-Match %q, want \"v1\"", v)
	}
	mustChanged(t, c, fp2)
	if v, n := srv.inm(5); v != `"v2"` || n != 6 {
		t.Errorf("poll after the change sent If-None-Match %q (%d requests), want \"v2\"", v, n)
	}
}

// Weak ETags cannot vouch for a byte fingerprint: never sent back.
func TestWeakETagIgnored(t *testing.T) {
	srv := newCondServer(t, readFixture(t, "v2-mixed.json"), `W/"v1"`)
	c := newClient(t, srv.URL, Config{})
	_, fp := mustChanged(t, c, "")
	mustChanged(t, c, fp)
	if v, n := srv.inm(1); v != "" || n != 2 {
		t.Errorf("If-None-Match %q after a weak ETag (%d requests)", v, n)
	}
}

// The ETag is forgotten with a body that does not decode and with a 200
// that carries no ETag.
func TestETagForgotten(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	srv := newCondServer(t, body, `"v1"`)
	c := newClient(t, srv.URL, Config{})
	_, fp := mustChanged(t, c, "")

	srv.set([]byte(`{"machines": [`), `"broken"`)
	if _, _, err := c.StatusIfChanged(context.Background(), "sha256:other"); !errors.Is(err, ErrInvalidStatus) {
		t.Fatalf("broken body: err %v, want ErrInvalidStatus", err)
	}
	srv.set(body, `"v1"`)
	mustChanged(t, c, fp)
	if v, _ := srv.inm(2); v != "" {
		t.Errorf("If-None-Match %q after a body that did not decode", v)
	}

	// Now remembered again; a 200 without ETag forgets it.
	mustChanged(t, c, fp)
	if v, _ := srv.inm(3); v != `"v1"` {
		t.Fatalf("If-None-Match %q, want \"v1\"", v)
	}
	srv.set(body, "")
	mustChanged(t, c, "")
	srv.set(body, `"v1"`)
	mustChanged(t, c, fp)
	if v, n := srv.inm(5); v != "" || n != 6 {
		t.Errorf("If-None-Match %q after a 200 without ETag (%d requests)", v, n)
	}
}

// A 304 is "unchanged" only as the answer to this client's own condition:
// one naming another ETag makes the client ask again without conditions,
// and a 304 to that is an error, never a silent skip.
func TestUnexpectedNotModified(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	srv := newCondServer(t, body, `"v1"`)
	c := newClient(t, srv.URL, Config{})
	_, fp := mustChanged(t, c, "")

	// A 304 with another ETag, then the plain GET gets a body.
	srv.mu.Lock()
	srv.force304 = `"other"`
	srv.mu.Unlock()
	_, _, err := c.StatusIfChanged(context.Background(), fp)
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusNotModified {
		t.Fatalf("304 to the plain fallback GET: err %v, want *HTTPError 304", err)
	}
	if v, n := srv.inm(1); v != `"v1"` || n != 3 {
		t.Fatalf("first request If-None-Match %q (%d requests), want \"v1\", 3", v, n)
	}
	if v, _ := srv.inm(2); v != "" {
		t.Errorf("fallback GET sent If-None-Match %q", v)
	}
	if IsTransient(err) {
		t.Error("a 304 to a plain GET is transient")
	}

	// Without a remembered ETag, a 304 is an error at once (one request).
	srv.mu.Lock()
	srv.force304 = `"v1"`
	srv.mu.Unlock()
	if _, _, err := c.StatusIfChanged(context.Background(), fp); !errors.As(err, &he) {
		t.Fatalf("304 without a condition: err %v, want *HTTPError", err)
	}
	if v, n := srv.inm(3); v != "" || n != 4 {
		t.Errorf("request %q (%d requests), want no If-None-Match, 4 requests", v, n)
	}

	// The server recovers: a body, then conditional polls again.
	srv.mu.Lock()
	srv.force304 = ""
	srv.mu.Unlock()
	st, fp2 := mustChanged(t, c, fp)
	if st != nil || fp2 != fp {
		t.Fatalf("same body again: status %v", st != nil)
	}
	mustChanged(t, c, fp)
	if v, _ := srv.inm(5); v != `"v1"` {
		t.Errorf("If-None-Match %q after recovery, want \"v1\"", v)
	}
}

// Poll.NotModified is set only where MAT's strong ETag vouched for the
// body held: a 304 to a poll, or a plain GET whose body and ETag are those
// held. A MAT without ETags, a weak one, one that answers a condition with
// a whole body, and a changed body never set it.
func TestPollNotModified(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	moved := bytes.Replace(body, []byte(`"10.96.64.13"`), []byte(`"10.96.64.99"`), 1)
	poll := func(t *testing.T, c *Client, prev string) Poll {
		t.Helper()
		p, err := c.PollStatus(context.Background(), prev)
		if err != nil {
			t.Fatalf("PollStatus(%.16q): %v", prev, err)
		}
		return p
	}
	t.Run("strong ETag", func(t *testing.T) {
		srv := newCondServer(t, body, `"v1"`)
		c := newClient(t, srv.URL, Config{})
		p := poll(t, c, "")
		if p.NotModified || p.Status == nil {
			t.Fatalf("first fetch: NotModified %v, status %v", p.NotModified, p.Status != nil)
		}
		fp := p.Fingerprint
		if p = poll(t, c, fp); !p.NotModified || p.Status != nil || p.Fingerprint != fp {
			t.Fatalf("304: %+v", p)
		}
		if p = poll(t, c, ""); !p.NotModified || p.Status == nil {
			t.Fatalf("full fetch of the same body and ETag: NotModified %v, status %v", p.NotModified, p.Status != nil)
		}
		srv.set(moved, `"v2"`)
		if p = poll(t, c, fp); p.NotModified || p.Status == nil {
			t.Fatalf("changed body: NotModified %v, status %v", p.NotModified, p.Status != nil)
		}
		srv.set(body, `"v1"`)
		if p = poll(t, c, ""); p.NotModified {
			t.Fatal("full fetch of another body than the one held is NotModified")
		}
	})
	t.Run("condition answered with a body", func(t *testing.T) {
		srv := newCondServer(t, body, `"v1"`)
		srv.mu.Lock()
		srv.honour = false
		srv.mu.Unlock()
		c := newClient(t, srv.URL, Config{})
		fp := poll(t, c, "").Fingerprint
		for range 3 {
			if p := poll(t, c, fp); p.NotModified || p.Status != nil {
				t.Fatalf("200 to If-None-Match: %+v", p)
			}
		}
	})
	for _, etag := range []string{"", `W/"v1"`} {
		t.Run("ETag "+etag, func(t *testing.T) {
			srv := newCondServer(t, body, etag)
			c := newClient(t, srv.URL, Config{})
			fp := poll(t, c, "").Fingerprint
			for _, prev := range []string{fp, fp, "", ""} {
				if p := poll(t, c, prev); p.NotModified {
					t.Fatalf("NotModified with ETag %q (prev %.16q)", etag, prev)
				}
			}
		})
	}
}
