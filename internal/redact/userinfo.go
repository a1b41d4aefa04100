package redact

import "strings"

// UserInfoMarker stands in for the user info of a URL in logs and events:
// "nats://***@127.0.0.1:4222".
const UserInfoMarker = "***"

// StripUserInfo returns s with the user info (user:password@ or token@) of
// every URL in it replaced by UserInfoMarker; scheme, host, port, path and
// the text around are kept. s may be one URL, a comma-separated list (as
// --nats-url takes) or free text such as an error message quoting URLs:
//
//	"nats://u:p@h:4222,nats://tok@h2:4222" → "nats://***@h:4222,nats://***@h2:4222"
//	`Get "https://u:p@h/x": EOF`           → `Get "https://***@h/x": EOF`
//
// A URL's authority is taken to end at the first '/', '?', '#', quote,
// angle bracket, comma, semicolon, backslash, space or control character
// after "://"; user info ends at its last '@'.
func StripUserInfo(s string) string {
	if !strings.Contains(s, "@") || !strings.Contains(s, "://") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	rest := s
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		start := i + 3
		end := start
		for end < len(rest) && !endsAuthority(rest[end]) {
			end++
		}
		b.WriteString(rest[:start])
		if at := strings.LastIndexByte(rest[start:end], '@'); at > 0 {
			b.WriteString(UserInfoMarker)
			b.WriteString(rest[start+at : end])
		} else {
			b.WriteString(rest[start:end])
		}
		rest = rest[end:]
	}
	b.WriteString(rest)
	return b.String()
}

func endsAuthority(c byte) bool {
	switch c {
	case '/', '?', '#', '"', '\'', '`', '<', '>', ',', ';', '\\':
		return true
	}
	return c <= ' ' || c == 0x7f
}
