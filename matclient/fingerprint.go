package matclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
)

// Fingerprint returns a short string that changes whenever the status body
// body can describe different devices:
//
//   - a v2 body with a top-level `generation`: "v2:<epoch_id>:<generation>"
//     (MAT bumps the generation on every change of its inventory, and a
//     restarted MAT has a new epoch_id);
//   - any other body (legacy schema, or v2 without a generation):
//     "sha256:<hex of the SHA-256 of the whole body>".
//
// It reads only the top-level fields and never fails: a body it cannot
// read gets the hash form, which Decode then rejects or accepts as usual.
func Fingerprint(body []byte) string {
	var top struct {
		EpochID    json.RawMessage `json:"epoch_id"`
		Generation json.RawMessage `json:"generation"`
	}
	if json.Unmarshal(body, &top) == nil && len(top.Generation) > 0 {
		if gen, err := parseGeneration(top.Generation); err == nil {
			var epoch string
			if len(top.EpochID) > 0 {
				_ = json.Unmarshal(top.EpochID, &epoch)
			}
			return "v2:" + strconv.Quote(epoch) + ":" + strconv.FormatUint(gen, 10)
		}
	}
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// StatusIfChanged fetches the status like Status, and decodes it only when
// its Fingerprint differs from prev. It returns (nil, prev, nil) when the
// status is unchanged: one keep-alive GET and no decoding. Otherwise it
// returns the decoded status and its fingerprint, or the errors of Status.
// prev "" never matches.
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
