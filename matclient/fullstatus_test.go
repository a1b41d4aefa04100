package matclient

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func mustFull(t *testing.T, c *Client) Poll {
	t.Helper()
	p, err := c.FullStatus(context.Background())
	if err != nil {
		t.Fatalf("FullStatus: %v", err)
	}
	if p.Status == nil {
		t.Fatal("FullStatus returned no status")
	}
	return p
}

// With BodyMaxAge, a full fetch of an unchanged status is a conditional
// GET answered 304, and it returns exactly what the whole body decodes to;
// a changed status comes whole (its new ETag is used next); a body a
// poll brought is the one the next full fetch revalidates.
func TestFullStatusRevalidates(t *testing.T) {
	v1, v2 := readFixture(t, "v2-mixed.json"), readFixture(t, "legacy-small.json")
	want1, err := Decode(v1)
	if err != nil {
		t.Fatal(err)
	}
	want2, err := Decode(v2)
	if err != nil {
		t.Fatal(err)
	}
	srv := newCondServer(t, v1, `"v1"`)
	c := newClient(t, srv.URL, Config{BodyMaxAge: time.Hour})

	p := mustFull(t, c)
	if inm, _ := srv.inm(0); inm != "" || p.NotModified || p.Fingerprint != Fingerprint(v1) {
		t.Fatalf("first full fetch: If-None-Match %q, NotModified %v, fingerprint ok %v", inm, p.NotModified, p.Fingerprint == Fingerprint(v1))
	}
	p = mustFull(t, c)
	if inm, n := srv.inm(1); inm != `"v1"` || n != 2 {
		t.Fatalf("second full fetch: If-None-Match %q (%d requests), want \"v1\"", inm, n)
	}
	if !p.NotModified || p.Fingerprint != Fingerprint(v1) || !reflect.DeepEqual(p.Status, want1) {
		t.Fatalf("revalidated full fetch: NotModified %v, fingerprint ok %v, status equal %v", p.NotModified, p.Fingerprint == Fingerprint(v1), reflect.DeepEqual(p.Status, want1))
	}

	srv.set(v2, `"v2"`)
	p = mustFull(t, c)
	if inm, _ := srv.inm(2); inm != `"v1"` || p.NotModified || !reflect.DeepEqual(p.Status, want2) || p.Fingerprint != Fingerprint(v2) {
		t.Fatalf("changed status: If-None-Match %q, NotModified %v, new status %v", inm, p.NotModified, reflect.DeepEqual(p.Status, want2))
	}
	if p = mustFull(t, c); !p.NotModified || !reflect.DeepEqual(p.Status, want2) {
		t.Fatalf("after the change: NotModified %v, status is the new one %v", p.NotModified, reflect.DeepEqual(p.Status, want2))
	}
	if inm, _ := srv.inm(3); inm != `"v2"` {
		t.Fatalf("after the change: If-None-Match %q, want \"v2\"", inm)
	}

	// A poll brings v1 back; the next full fetch revalidates v1, not v2.
	srv.set(v1, `"v1"`)
	if st, _ := mustChanged(t, c, Fingerprint(v2)); st == nil {
		t.Fatal("the poll saw no change")
	}
	if p = mustFull(t, c); !p.NotModified || !reflect.DeepEqual(p.Status, want1) || p.Fingerprint != Fingerprint(v1) {
		t.Fatalf("after a poll: NotModified %v, status is the poll's %v", p.NotModified, reflect.DeepEqual(p.Status, want1))
	}
	if inm, _ := srv.inm(5); inm != `"v1"` {
		t.Fatalf("after a poll: If-None-Match %q, want \"v1\"", inm)
	}
}

// Without BodyMaxAge, with a body older than BodyMaxAge, and against a MAT
// that sends no ETag or a weak one, every full fetch is a plain GET with
// the headers of Status, and it gets the whole body.
func TestFullStatusPlain(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	for _, tt := range []struct {
		name string
		etag string
		age  time.Duration
	}{
		{"no BodyMaxAge", `"v1"`, 0},
		{"body too old", `"v1"`, time.Nanosecond},
		{"no ETag", "", time.Hour},
		{"weak ETag", `W/"v1"`, time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newCondServer(t, body, tt.etag)
			c := newClient(t, srv.URL, Config{BodyMaxAge: tt.age})
			if _, err := c.Status(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if p := mustFull(t, c); p.NotModified && tt.etag == "" {
					t.Error("NotModified from a MAT without ETags")
				}
			}
			srv.plainRequests(t, 4)
		})
	}
}

// A 304 that names another ETag than the one sent is never taken for the
// kept body: the body is forgotten and the status asked for plainly (a
// 304 to that is an *HTTPError); a body that does not decode is never
// kept, so the next full fetch asks plainly.
func TestFullStatusRefusesForeign304(t *testing.T) {
	body := readFixture(t, "v2-mixed.json")
	srv := newCondServer(t, body, `"v1"`)
	c := newClient(t, srv.URL, Config{BodyMaxAge: time.Hour})
	mustFull(t, c)

	srv.mu.Lock()
	srv.force304 = `"other"`
	srv.mu.Unlock()
	_, err := c.FullStatus(context.Background())
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != 304 {
		t.Fatalf("304 naming another ETag: err %v, want the plain GET's *HTTPError 304", err)
	}
	if inm, n := srv.inm(1); inm != `"v1"` || n != 3 {
		t.Fatalf("If-None-Match %q, %d requests; want \"v1\" then a plain GET", inm, n)
	}
	if inm, _ := srv.inm(2); inm != "" {
		t.Fatalf("the retry carried If-None-Match %q", inm)
	}

	srv.mu.Lock()
	srv.force304 = ""
	srv.mu.Unlock()
	srv.set([]byte(`{"machines": [`), `"bad"`)
	if _, err := c.FullStatus(context.Background()); !errors.Is(err, ErrInvalidStatus) {
		t.Fatalf("malformed body: %v, want ErrInvalidStatus", err)
	}
	srv.set(body, `"bad"`)
	p := mustFull(t, c)
	if inm, _ := srv.inm(4); inm != "" || p.NotModified {
		t.Fatalf("after a body that did not decode: If-None-Match %q, NotModified %v; want a plain GET", inm, p.NotModified)
	}
}

func TestNegativeBodyMaxAge(t *testing.T) {
	if _, err := New("https://mat.example:8443", Config{BodyMaxAge: -time.Second}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a negative BodyMaxAge: %v, want ErrInvalidConfig", err)
	}
}
