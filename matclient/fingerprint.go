package matclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
func (c *Client) StatusIfChanged(ctx context.Context, prev string) (*Status, string, error) {
	body, err := c.fetchBody(ctx)
	if err != nil {
		return nil, "", err
	}
	fp := Fingerprint(body)
	if prev != "" && fp == prev {
		return nil, fp, nil
	}
	st, err := Decode(body)
	if err != nil {
		return nil, "", &opError{url: c.statusURL, err: err}
	}
	return st, fp, nil
}
