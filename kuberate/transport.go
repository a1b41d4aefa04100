package kuberate

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The API Priority and Fairness response headers.
const (
	HeaderFlowSchemaUID    = "X-Kubernetes-PF-FlowSchema-UID"
	HeaderPriorityLevelUID = "X-Kubernetes-PF-PriorityLevel-UID"
)

// Wrap returns a transport that sends through rt and feeds l: every
// request except long-running ones (see LongRunning) waits for an
// in-flight slot, holds it until its response headers arrive (or the
// round trip fails), and has its status, Retry-After, API Priority and
// Fairness headers and (for a write answered 2xx) latency observed.
// Long-running requests pass straight through; only their APF headers
// are read. It has the shape of rest.Config.WrapTransport.
func (l *Limiter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return &transport{l: l, rt: rt}
}

type transport struct {
	l  *Limiter
	rt http.RoundTripper
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if LongRunning(r) {
		resp, err := t.rt.RoundTrip(r)
		if err == nil {
			if k := apfOf(resp); k != (apfKey{}) {
				t.l.mu.Lock()
				t.l.responses[k]++
				t.l.last = k
				t.l.mu.Unlock()
			}
		}
		return resp, err
	}
	if err := t.l.acquire(r.Context()); err != nil {
		return nil, err
	}
	start := t.l.clk.Now()
	resp, err := t.rt.RoundTrip(r)
	o := observation{method: r.Method, start: start, latency: t.l.clk.Since(start)}
	if err == nil {
		o.status = resp.StatusCode
		o.apf = apfOf(resp)
		o.retryAfter = retryAfter(resp.Header.Get("Retry-After"), t.l.clk.Now())
		o.write = isWrite(r.Method) && resp.StatusCode >= 200 && resp.StatusCode < 300
	}
	t.l.observe(o)
	return resp, err
}

// LongRunning reports whether r is a request whose response streams for
// long (a watch: ?watch=true or a /watch/ path; a followed log): such
// requests hold no in-flight slot and give no latency sample.
func LongRunning(r *http.Request) bool {
	q := r.URL.Query()
	if v := q.Get("watch"); v == "true" || v == "1" {
		return true
	}
	if q.Get("follow") == "true" {
		return true
	}
	return strings.Contains(r.URL.Path, "/watch/")
}

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

func apfOf(resp *http.Response) apfKey {
	return apfKey{FlowSchemaUID: resp.Header.Get(HeaderFlowSchemaUID), PriorityLevelUID: resp.Header.Get(HeaderPriorityLevelUID)}
}

// retryAfter parses a Retry-After value: whole seconds (what the API
// server sends) or an HTTP date; 0 for none or garbage.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
