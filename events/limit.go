package events

import (
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Size limits of error events. A longer field is cut and ends with
// TruncatedMarker's text, so an event of any size is delivered.
const (
	// MaxErrorMessage caps Error.Message, in bytes of UTF-8.
	MaxErrorMessage = 32 << 10
	// MaxErrorField caps each of Error.Instance, URL, Service, MatID,
	// Subject and Worker, in bytes of UTF-8.
	MaxErrorField = 4 << 10
	// DefaultMaxPayload is the message size limit assumed while the
	// connection has not yet learnt the server's (1 MiB, the NATS default).
	DefaultMaxPayload = 1 << 20
	// PayloadHeadroom is kept free below the server's limit for the
	// headers (Nats-Msg-Id) and protocol framing of a publish.
	PayloadHeadroom = 4 << 10
)

// minFieldCap is the smallest cap fitError shrinks a field to.
const minFieldCap = 64

// TruncatedMarker returns the text that ends a field cut from n bytes:
// "…[truncated, n bytes]".
func TruncatedMarker(n int) string {
	return "…[truncated, " + strconv.Itoa(n) + " bytes]"
}

// Truncate returns s when it has at most limit bytes; otherwise a prefix of
// s cut at a rune boundary followed by TruncatedMarker(len(s)), together
// at most limit bytes (or just the marker when limit is smaller than it).
// The result is valid UTF-8 when s is.
func Truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	marker := TruncatedMarker(len(s))
	keep := max(limit-len(marker), 0)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + marker
}

// capFields cuts every text field of e to its cap: msgCap for Message,
// fieldCap for the others.
func (e Error) capFields(msgCap, fieldCap int) Error {
	e.Message = Truncate(e.Message, msgCap)
	for _, f := range []*string{&e.Instance, &e.URL, &e.Service, &e.MatID, &e.Subject, &e.Worker} {
		*f = Truncate(*f, fieldCap)
	}
	return e
}

// fitError returns encode(c), c being e with its text fields cut to
// MaxErrorMessage and MaxErrorField bytes, and further (halving both caps,
// down to 64 bytes) until the encoding has at most limit bytes. encode is
// the envelope encoding, whose JSON escaping may make a field longer than
// its bytes. When even the smallest caps do not fit, that last encoding is
// returned (its publish then fails as too big). An error is only encode's.
func fitError(e Error, limit int, encode func(Error) ([]byte, error)) ([]byte, error) {
	msgCap, fieldCap := MaxErrorMessage, MaxErrorField
	for {
		body, err := encode(e.capFields(msgCap, fieldCap))
		if err != nil || len(body) <= limit || (msgCap <= minFieldCap && fieldCap <= minFieldCap) {
			return body, err
		}
		msgCap, fieldCap = max(msgCap/2, minFieldCap), max(fieldCap/2, minFieldCap)
	}
}

// MaxEventBytes returns how large an encoded event may be to be published
// on this bus's connection: the server's max_payload (DefaultMaxPayload
// while not known yet) less PayloadHeadroom, in bytes, and at least 1024.
func (b *Bus) MaxEventBytes() int {
	mp := int64(DefaultMaxPayload)
	if nc := b.js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		mp = nc.MaxPayload()
	}
	return int(max(mp-PayloadHeadroom, 1024))
}

// encodeError is the envelope encoding of an error event published now.
func (b *Bus) encodeError(id string) func(Error) ([]byte, error) {
	now := time.Now()
	return func(e Error) ([]byte, error) { return Encode(TypeError, id, b.cfg.Source, now, e) }
}

// isTooBig reports whether a publish failed because the message exceeds
// the server's max_payload or the stream's maximum message size: retrying
// the same body cannot help.
func isTooBig(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return true
	}
	return strings.Contains(strings.ToLower(err.Error()), "maximum payload")
}
