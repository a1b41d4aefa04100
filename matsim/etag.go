package matsim

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strings"
	"sync/atomic"
)

// etagOf returns the strong entity tag of a status body: `"` + the first
// 16 bytes of its SHA-256 in hex + `"` (34 characters). Equal bodies have
// equal tags and a changed body a different one, whatever changed in it
// (the generation, a BMC IP, a DPU).
func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}

// noneMatch reports whether the If-None-Match field value header matches
// the current entity tag etag (a strong tag, quotes included) by RFC 9110
// §13.1.2: "*" matches any current representation; otherwise the value
// is a comma-separated list of entity tags, each optionally weak (W/),
// compared with the weak comparison function (opaque tags equal, the weak
// flag ignored). An empty or malformed value matches nothing: a parse
// error ends the list, and the tags read before it still count.
func noneMatch(header, etag string) bool {
	if etag == "" {
		return false
	}
	want := etag
	for {
		header = strings.TrimLeft(header, " \t,")
		if header == "" {
			return false
		}
		if header[0] == '*' {
			return true
		}
		tag, rest, ok := scanETag(header)
		if !ok {
			return false
		}
		if strings.TrimPrefix(tag, "W/") == want {
			return true
		}
		header = rest
	}
}

// scanETag reads one entity tag (`"opaque"` or `W/"opaque"`) from the
// start of s and returns it and the rest of s. Opaque tags may hold any
// visible character but DQUOTE, commas included (RFC 9110 §8.8.3).
func scanETag(s string) (tag, rest string, ok bool) {
	start := 0
	if strings.HasPrefix(s, "W/") {
		start = 2
	}
	if len(s) < start+2 || s[start] != '"' {
		return "", "", false
	}
	for i := start + 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			return s[:i+1], s[i+1:], true
		case c == 0x21 || (c >= 0x23 && c <= 0x7e) || c >= 0x80:
		default:
			return "", "", false
		}
	}
	return "", "", false
}

// countingListener counts the bytes written to the connections it
// accepts: under TLS, the bytes on the wire (records, handshakes).
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, n: l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}
