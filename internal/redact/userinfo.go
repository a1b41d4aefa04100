package redact

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

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
//	`parse "nats://u:p w@h:1": net/url: invalid userinfo` → `parse "nats://***@h:1": net/url: invalid userinfo`
//
// The rule is textual, so it holds for URLs net/url rejects too: after
// each "://", everything up to the last '@' before the next '/' (or line
// break, or the end of s) is user info. A password may thus hold spaces,
// quotes, ':', '%' and '@'. The price is that an '@' later in the same
// stretch of text (a mail address after a URL without a path) is taken
// for the end of user info as well: more is hidden, never less.
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
		for end < len(rest) && !endsUserInfo(rest[end]) {
			end++
		}
		if strings.HasPrefix(rest[end:], "//") && end > start && rest[end-1] == ':' {
			end-- // the next URL's "://": left for the next round
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

// StripUserInfoLoose is StripUserInfo for one value meant as a URL that
// may lack its "://" (a mistyped flag value such as "u:pw@host:4222",
// "//u:pw@host" or "nats:/u:pw@host"): without "://", everything before
// its last '@' except a leading scheme with slashes ("nats:/") or the
// slashes alone is replaced by UserInfoMarker, so the value can be quoted
// in an error:
//
//	"u:pw@h:4222" → "***@h:4222";  "nats:/u:pw@h" → "nats:/***@h"
//
// More is hidden than user info when a later '@' stands in a path, never
// less. A value with "://" gets StripUserInfo.
func StripUserInfoLoose(raw string) string {
	if strings.Contains(raw, "://") {
		return StripUserInfo(raw)
	}
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return raw
	}
	keep := looseSchemeRE.FindString(raw[:at])
	return keep + UserInfoMarker + raw[at:]
}

// looseSchemeRE matches what StripUserInfoLoose keeps before the user
// info: a scheme followed by one or more slashes, or slashes alone.
var looseSchemeRE = regexp.MustCompile(`^(?:[A-Za-z][A-Za-z0-9+.-]*:/+|/+)`)

// endsUserInfo reports whether c ends the text after "://" in which user
// info is looked for: the path's '/' (the next URL's "://" too) or a line
// break.
func endsUserInfo(c byte) bool {
	return c == '/' || c == '\n' || c == '\r'
}

// quotedRE matches a Go-quoted fragment (with the space before it) in the
// text of a net/url error, such as the bad escape of `invalid URL escape
// "%zz"`, which may be a piece of a password.
var quotedRE = regexp.MustCompile(`\s*"(?:[^"\\]|\\.)*"`)

// URLError is the error of ParseURL: the URL without its user info and
// why net/url rejected it, without any quoted piece of the URL.
type URLError struct {
	URL    string // the URL as given, its user info replaced by UserInfoMarker
	Reason string // e.g. "invalid userinfo", "invalid URL escape"
}

func (e *URLError) Error() string { return fmt.Sprintf("%q: %s", e.URL, e.Reason) }

// ParseURL is url.Parse whose error never holds a secret of raw: it names
// the URL without its user info (up to its last '@') and the reason without the quoted
// pieces net/url adds (a bad escape or port may be part of a password):
//
//	url.Parse("nats://bob:pw 1@h:1") → parse "nats://bob:pw 1@h:1": net/url: invalid userinfo
//	ParseURL("nats://bob:pw 1@h:1")  → "nats://***@h:1": invalid userinfo
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err == nil {
		return u, nil
	}
	return nil, &URLError{URL: stripOne(raw), Reason: urlReason(err)}
}

// stripOne is StripUserInfo for raw, one URL net/url rejected: a '/', '?'
// or '#' in its password may end its authority early, so its user info
// ends at its last '@'.
func stripOne(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return StripUserInfo(raw)
	}
	start := i + 3
	if at := strings.LastIndexByte(raw[start:], '@'); at > 0 {
		return raw[:start] + UserInfoMarker + raw[start+at:]
	}
	return raw
}

// urlReason is the cause of a url.Parse error without the URL or any
// quoted piece of it.
func urlReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var esc url.EscapeError
	var host url.InvalidHostError
	var reason string
	switch {
	case errors.As(err, &esc):
		reason = "invalid URL escape"
	case errors.As(err, &host):
		reason = "invalid character in host name"
	default:
		reason = quotedRE.ReplaceAllString(strings.TrimPrefix(err.Error(), "net/url: "), "")
	}
	return StripUserInfo(reason)
}

// ValidURL is the error of a URL flag net/url cannot parse; it names the
// URL without its user info and never quotes a piece of it (a space or
// bad escape in a password): `invalid --nats-url "nats://***@h:4222":
// invalid userinfo`.
func ValidURL(flagName, raw string) error {
	if _, err := ParseURL(raw); err != nil {
		return fmt.Errorf("invalid %s %v", flagName, err)
	}
	return nil
}
