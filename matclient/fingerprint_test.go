package matclient

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
)

// A BMC IP change keeps MAT's generation but must change the fingerprint;
// an identical body keeps it.
func TestFingerprintSeesChangesGenerationMisses(t *testing.T) {
	body, err := os.ReadFile("testdata/v2-mixed.json")
	if err != nil {
		t.Fatal(err)
	}
	moved := bytes.Replace(body, []byte(`"10.96.64.13"`), []byte(`"10.96.64.99"`), 1)
	if bytes.Equal(moved, body) {
		t.Fatal("fixture has no 10.96.64.13")
	}
	if Fingerprint(body) != Fingerprint(bytes.Clone(body)) {
		t.Error("equal bodies, different fingerprints")
	}
	if Fingerprint(body) == Fingerprint(moved) {
		t.Error("a BMC IP change under the same generation kept the fingerprint")
	}
}

// StatusIfChanged decodes only a changed body.
func TestStatusIfChanged(t *testing.T) {
	body, err := os.ReadFile("testdata/v2-mixed.json")
	if err != nil {
		t.Fatal(err)
	}
	var cur atomic.Value
	cur.Store(body)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(cur.Load().([]byte))
	}))
	defer srv.Close()
	c, err := New(srv.URL, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	st, fp, err := c.StatusIfChanged(ctx, "")
	if err != nil || st == nil || fp == "" {
		t.Fatalf("first fetch: %v, %v, %q", st, err, fp)
	}
	st2, fp2, err := c.StatusIfChanged(ctx, fp)
	if err != nil || st2 != nil || fp2 != fp {
		t.Fatalf("unchanged body: status %v, fp %q, err %v; want nil, %q, nil", st2, fp2, err, fp)
	}
	cur.Store(bytes.Replace(body, []byte(`"10.96.64.13"`), []byte(`"10.96.64.99"`), 1))
	st3, fp3, err := c.StatusIfChanged(ctx, fp)
	if err != nil || st3 == nil || fp3 == fp {
		t.Fatalf("changed body: status %v, fp %q, err %v; want a decoded status and a new fingerprint", st3, fp3, err)
	}
	cur.Store([]byte(`{"machines": null}`))
	if _, _, err := c.StatusIfChanged(ctx, fp3); err == nil {
		t.Fatal("an invalid changed body decoded without error")
	}
}
