package matclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
)

// Fingerprint returns "sha256:<hex>" of the whole status body: equal
// fingerprints mean byte-identical bodies.
//
// The v2 `generation` is not used: MAT bumps it only when its host set
// changes (top-level machines' mat_id, machine_id, hardware_type and
// InfiniBand ports), so a changed BMC IP, a DPU, a switch or a power shelf
// leaves it as it was, and each of those changes a Service.
func Fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// StatusIfChanged fetches the status like Status, and decodes it only when
// its Fingerprint differs from prev. It returns (nil, prev, nil) when the
// body is byte for byte the one fingerprinted as prev: one keep-alive GET
// and no decoding. Otherwise it returns the decoded status and its
// fingerprint, or the errors of Status. prev "" never matches.
//
// Conditional requests (RFC 9110 §13.1.2): the client remembers the
// strong ETag that came with the last body that decoded. When prev is
// that body's fingerprint, the GET carries If-None-Match with that ETag,
// and a 304 Not Modified answer returns (nil, prev, nil) with no body sent
// and nothing decoded. In every other case — a MAT that sends no ETag or a
// weak one, prev "" (a full sync), prev of another body — the request is
// exactly Status's. A 2xx replaces the remembered ETag (one without an
// ETag forgets it), and a body that does not decode forgets it. A 304 naming
// another ETag than the one sent is never taken as "unchanged": the ETag is forgotten and the
// status fetched again without conditions (a 304 to a plain GET is an
// *HTTPError, as for Status).
func (c *Client) StatusIfChanged(ctx context.Context, prev string) (*Status, string, error) {
	p, err := c.PollStatus(ctx, prev)
	return p.Status, p.Fingerprint, err
}

// Poll is the answer of PollStatus.
type Poll struct {
	// Status is the decoded status; nil when it is unchanged since prev.
	Status *Status
	// Fingerprint is the body's Fingerprint (prev when unchanged).
	Fingerprint string
	// NotModified reports that MAT's entity tag vouched that the status is
	// the body the client held: a 304 Not Modified to the If-None-Match
	// sent, or, for a request without If-None-Match (prev ""), a whole
	// body with the strong ETag and the Fingerprint of the body before. A
	// conditional request answered with a whole body is never NotModified,
	// and neither is any answer of a MAT that sends no strong ETag.
	NotModified bool
}

// PollStatus is StatusIfChanged, and it tells in Poll.NotModified whether
// MAT's entity tag said the status was not modified (the discovery
// scheduler polls such instances less often, ADR 23).
func (c *Client) PollStatus(ctx context.Context, prev string) (Poll, error) {
	c.valMu.Lock()
	held := c.val
	c.valMu.Unlock()
	inm := ""
	if prev != "" && held.fingerprint == prev {
		inm = held.etag
	}
	resp, err := c.fetchBody(ctx, inm)
	if err != nil {
		return Poll{}, err
	}
	if resp.notModified {
		if inm != "" && (resp.etag == "" || resp.etag == inm) {
			return Poll{Fingerprint: prev, NotModified: true}, nil
		}
		// The 304 refers to no body this client holds: ask again plainly.
		c.forget()
		held, inm = validator{}, ""
		if resp, err = c.fetchBody(ctx, ""); err != nil {
			return Poll{}, err
		}
	}
	fp := Fingerprint(resp.body)
	same := inm == "" && held.etag != "" && held.etag == resp.etag && held.fingerprint == fp
	if prev != "" && fp == prev {
		c.remember(resp.etag, fp, resp.body)
		return Poll{Fingerprint: fp, NotModified: same}, nil
	}
	p, err := c.decodeBody(resp, fp)
	p.NotModified = same && err == nil
	return p, err
}

// FullStatus fetches the whole status for a full sync: on success
// Poll.Status is never nil, and Poll.Fingerprint is its body's
// Fingerprint. Errors are those of Status.
//
// Without Config.BodyMaxAge it is PollStatus(ctx, ""): a plain GET.
// With it, while the client keeps a body that came whole with a strong
// ETag less than BodyMaxAge ago, the GET carries If-None-Match with that
// ETag. A 304 naming that ETag (or none) decodes the kept body again and
// returns it with NotModified true: the status and fingerprint a whole
// body would have given, since a strong ETag names those exact bytes
// (RFC 9110 §8.8.1), with no body on the wire. A 2xx is read like a
// plain GET's; a 304 naming another ETag forgets the kept body and asks
// again without conditions. A kept body older than BodyMaxAge, or none
// (a MAT that sends no ETag or a weak one), means the plain GET.
func (c *Client) FullStatus(ctx context.Context) (Poll, error) {
	c.valMu.Lock()
	held := c.val
	c.valMu.Unlock()
	if c.bodyAge <= 0 || held.body == nil || time.Since(held.at) >= c.bodyAge {
		return c.PollStatus(ctx, "")
	}
	resp, err := c.fetchBody(ctx, held.etag)
	if err != nil {
		return Poll{}, err
	}
	if resp.notModified {
		if resp.etag != "" && resp.etag != held.etag {
			c.forget()
			return c.PollStatus(ctx, "")
		}
		st, err := Decode(held.body)
		if err != nil { // kept only after it decoded; never expected
			c.forget()
			return Poll{}, &opError{url: c.statusURL, err: err}
		}
		return Poll{Status: st, Fingerprint: held.fingerprint, NotModified: true}, nil
	}
	return c.decodeBody(resp, Fingerprint(resp.body))
}

// decodeBody decodes a whole body fingerprinted fp and remembers its
// validator, or forgets the validator when the body does not decode
// (errors wrap ErrInvalidStatus).
func (c *Client) decodeBody(resp fetched, fp string) (Poll, error) {
	st, err := Decode(resp.body)
	if err != nil {
		c.forget()
		return Poll{}, &opError{url: c.statusURL, err: err}
	}
	c.remember(resp.etag, fp, resp.body)
	return Poll{Status: st, Fingerprint: fp}, nil
}

// remember keeps etag as the validator of the body fingerprinted fp if it
// is a strong entity tag (`"…"`), and forgets any validator otherwise. A
// weak tag (W/"…") promises an equivalent body, not the same bytes, so it
// cannot vouch for a fingerprint. With Config.BodyMaxAge the body is kept
// too, and now is when it came whole.
func (c *Client) remember(etag, fp string, body []byte) {
	v := validator{}
	if len(etag) >= 2 && etag[0] == '"' && etag[len(etag)-1] == '"' && !strings.Contains(etag[1:len(etag)-1], `"`) {
		v = validator{etag: etag, fingerprint: fp}
		if c.bodyAge > 0 {
			v.body, v.at = body, time.Now()
		}
	}
	c.valMu.Lock()
	c.val = v
	c.valMu.Unlock()
}

// forget drops the validator (and any kept body).
func (c *Client) forget() { c.remember("", "", nil) }
