package matsim

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/matbus/matbus/matclient"
)

// condGet sends one request with the given If-None-Match values (none: no
// header) and returns the status code, the ETag header and the body.
func condGet(t *testing.T, method, url string, inm ...string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url+"/machines/status", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range inm {
		req.Header.Add("If-None-Match", v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("ETag"), body
}

// The ETag is strong and changes exactly when the body does: a BMC IP
// change (which keeps MAT's generation) and a host change change it; a
// SetFleet with the same devices does not.
func TestETagFollowsBody(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 3, DPUsPerHost: 1, Switches: 1, Seed: 5})
	s, url := start(t, Options{Fleet: f, EpochID: "2026-08-21T19:04:05.417203981Z"})
	_, tag0, body0 := condGet(t, http.MethodGet, url)
	if len(tag0) != 34 || tag0[0] != '"' || tag0[33] != '"' {
		t.Fatalf("ETag %q is not a strong 32-hex-digit tag", tag0)
	}
	seen := map[string]string{string(body0): tag0}
	check := func(step string, wantSame bool) {
		t.Helper()
		code, tag, body := condGet(t, http.MethodGet, url)
		if code != http.StatusOK || tag != etagOf(body) {
			t.Fatalf("%s: %d, ETag %q is not the body's", step, code, tag)
		}
		if wantSame != (tag == tag0) || wantSame != bytes.Equal(body, body0) {
			t.Errorf("%s: ETag same %v, body same %v, want both %v", step, tag == tag0, bytes.Equal(body, body0), wantSame)
		}
		if prev, ok := seen[string(body)]; ok && prev != tag {
			t.Errorf("%s: the same body got ETag %q before, %q now", step, prev, tag)
		}
		seen[string(body)] = tag
		for b, tg := range seen {
			if tg == tag && b != string(body) {
				t.Errorf("%s: ETag %q was another body's", step, tag)
			}
		}
	}
	check("again", true)
	if err := s.SetFleet(f); err != nil {
		t.Fatal(err)
	}
	check("same fleet set again", true)
	if err := s.SetBMCIP(f.Machines[0].MatID, "10.96.100.1"); err != nil {
		t.Fatal(err)
	}
	check("bmc ip change", false)
	if s.Generation() != 1 {
		t.Errorf("a BMC IP change bumped the generation to %d", s.Generation())
	}
	if err := s.SetBMCIP(f.Machines[0].MatID, f.Machines[0].BMC.IP); err != nil {
		t.Fatal(err)
	}
	check("bmc ip back", true)
	if err := s.RemoveDevice(f.Machines[1].MatID); err != nil {
		t.Fatal(err)
	}
	check("host removed", false)
	if s.Generation() != 2 {
		t.Errorf("generation %d after a host change, want 2", s.Generation())
	}
}

// If-None-Match per RFC 9110 §13.1.2: a list, weak tags compared weakly,
// "*", several header lines; a match is a 304 with the ETag and no body.
func TestIfNoneMatch(t *testing.T) {
	s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 2, Seed: 9})})
	_, tag, _ := condGet(t, http.MethodGet, url)
	weak := "W/" + tag
	tests := []struct {
		name string
		inm  []string
		want int
	}{
		{"none", nil, http.StatusOK},
		{"equal", []string{tag}, http.StatusNotModified},
		{"weak form of it", []string{weak}, http.StatusNotModified},
		{"in a list", []string{`"a", ` + tag + `, "b"`}, http.StatusNotModified},
		{"list without spaces", []string{`"a",` + weak}, http.StatusNotModified},
		{"second header line", []string{`"a"`, tag}, http.StatusNotModified},
		{"star", []string{"*"}, http.StatusNotModified},
		{"other", []string{`"a", W/"b"`}, http.StatusOK},
		{"unquoted", []string{tag[1 : len(tag)-1]}, http.StatusOK},
		{"prefix of it", []string{tag[:10] + `"`}, http.StatusOK},
		{"comma inside a tag", []string{`"a,` + tag[1:]}, http.StatusOK},
		{"after garbage", []string{`junk, ` + tag}, http.StatusOK},
		{"empty", []string{""}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.NotModified()
			for _, m := range []string{http.MethodGet, http.MethodHead} {
				code, got, body := condGet(t, m, url, tt.inm...)
				if code != tt.want || got != tag {
					t.Errorf("%s If-None-Match %q: %d ETag %q, want %d %q", m, tt.inm, code, got, tt.want, tag)
				}
				if code == http.StatusNotModified && len(body) != 0 {
					t.Errorf("304 with %d bytes of body", len(body))
				}
			}
			if n := s.NotModified() - before; (tt.want == http.StatusNotModified) != (n == 2) {
				t.Errorf("NotModified rose by %d", n)
			}
		})
	}
}

// A 304 after a change is impossible: the old tag no longer matches.
func TestIfNoneMatchAfterChange(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 2, Seed: 9})
	s, url := start(t, Options{Fleet: f})
	_, tag, _ := condGet(t, http.MethodGet, url)
	if err := s.SetBMCIP(f.Machines[0].MatID, ""); err != nil {
		t.Fatal(err)
	}
	code, tag2, body := condGet(t, http.MethodGet, url, tag)
	if code != http.StatusOK || tag2 == tag || tag2 != etagOf(body) {
		t.Errorf("after a change: %d, ETag %q (was %q)", code, tag2, tag)
	}
}

// DisableETag: a MAT without conditional requests. No ETag, If-None-Match
// ignored, and the body rendered on every request.
func TestDisableETag(t *testing.T) {
	s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 2, Seed: 9}), DisableETag: true})
	for range 2 {
		code, tag, body := condGet(t, http.MethodGet, url, "*")
		if code != http.StatusOK || tag != "" || len(body) == 0 {
			t.Errorf("%d ETag %q, %d bytes", code, tag, len(body))
		}
	}
	a, err := s.body()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.body()
	if &a.body[0] == &b.body[0] {
		t.Error("DisableETag served a cached body")
	}
	if s.NotModified() != 0 {
		t.Errorf("NotModified %d", s.NotModified())
	}
}

// With ETags the body is rendered once per change.
func TestBodyCachedPerVersion(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 2, Seed: 9})
	s, err := New(Options{Fleet: f})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.body()
	b, _ := s.body()
	if &a.body[0] != &b.body[0] || a.etag != b.etag {
		t.Error("unchanged fleet rendered twice")
	}
	if err := s.SetBMCIP(f.Machines[0].MatID, "10.96.100.9"); err != nil {
		t.Fatal(err)
	}
	c, _ := s.body()
	if &c.body[0] == &a.body[0] || c.etag == a.etag {
		t.Error("changed fleet served from the cache")
	}
}

// Faults win over conditions: a malformed body has no ETag and is never
// "not modified"; a 500 stays a 500.
func TestETagAndFaults(t *testing.T) {
	s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 2, Seed: 9})})
	_, tag, full := condGet(t, http.MethodGet, url)
	s.SetFault(FaultMalformed)
	code, got, body := condGet(t, http.MethodGet, url, tag)
	if code != http.StatusOK || got != "" || len(body) != len(full)/2 {
		t.Errorf("malformed: %d ETag %q, %d bytes", code, got, len(body))
	}
	s.SetFault(Fault500)
	if code, _, _ := condGet(t, http.MethodGet, url, tag); code != http.StatusInternalServerError {
		t.Errorf("500 fault with a matching tag: %d", code)
	}
	s.SetFault(FaultNone)
	if code, _, _ := condGet(t, http.MethodGet, url, tag); code != http.StatusNotModified {
		t.Errorf("after the fault: %d, want 304", code)
	}
}

// matclient's conditional polls against matsim: 304s carry no body, so a
// poll of an unchanged fleet costs a small fraction of the full body's
// bytes on the wire, over one TLS connection.
func TestConditionalPollsBytes(t *testing.T) {
	s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 100, DPUsPerHost: 1, IPMI: true, Seed: 2}), TLS: true})
	c := client(t, url, matclient.Config{InsecureSkipVerify: true})
	ctx := context.Background()
	_, fp, err := c.StatusIfChanged(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	full := s.BytesSent()
	for range 10 {
		st, got, err := c.StatusIfChanged(ctx, fp)
		if err != nil || st != nil || got != fp {
			t.Fatalf("poll: %v, status %v", err, st != nil)
		}
	}
	polls := s.BytesSent() - full
	if s.NotModified() != 10 || s.Requests() != 11 || s.Connections() != 1 {
		t.Errorf("%d 304s of %d requests over %d connections; want 10 of 11 over 1", s.NotModified(), s.Requests(), s.Connections())
	}
	if polls*10 > full {
		t.Errorf("10 conditional polls sent %d bytes, the first full GET %d", polls, full)
	}
	t.Logf("first GET (handshake + body): %d bytes; 10 polls answered 304: %d bytes", full, polls)
}
