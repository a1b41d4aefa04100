package redact

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Marker stands in for a known secret value in logs and events.
const Marker = "[redacted]"

// minSecretLen is the shortest secret replaced by value: shorter ones
// would blank out common words. URL user info is stripped whatever its length.
const minSecretLen = 4

// bearerRE matches an HTTP bearer credential ("Bearer <token>").
var bearerRE = regexp.MustCompile(`\b([Bb]earer)\s+[A-Za-z0-9\-._~+/]{8,}=*`)

// decoratedRE matches one armoured block of a NATS .creds file (the user
// JWT or the NKEY seed) and captures its content.
var decoratedRE = regexp.MustCompile(`(?m)^\s*-{3,}[^\n]*-{3,}\s*\n\s*([A-Za-z0-9\-_.=]+)\s*\n\s*-{3,}[^\n]*-{3,}`)

// Redactor removes secrets from text: the known secret values given to
// New (and their URL-escaped and Go-quoted forms), the user info of URLs
// and bearer credentials. The zero value and nil strip only the latter two.
type Redactor struct {
	rep *strings.Replacer // nil when no secret is known
}

// New returns a Redactor for secrets; empty values and values of fewer
// than 4 bytes (minSecretLen) are ignored.
func New(secrets []string) *Redactor {
	seen := map[string]bool{}
	var forms []string
	for _, s := range secrets {
		for _, f := range secretForms(strings.TrimSpace(s)) {
			if len(f) >= minSecretLen && !seen[f] {
				seen[f] = true
				forms = append(forms, f)
			}
		}
	}
	if len(forms) == 0 {
		return &Redactor{}
	}
	// The longest first: a secret that contains another is replaced whole.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, Marker)
	}
	return &Redactor{rep: strings.NewReplacer(pairs...)}
}

// secretForms returns s as it may appear in text: as is, escaped in a URL
// (user info, path, query) and escaped in a Go-quoted string.
func secretForms(s string) []string {
	if s == "" {
		return nil
	}
	q := strconv.Quote(s)
	return []string{s, url.QueryEscape(s), url.PathEscape(s), url.User(s).String(),
		strings.TrimPrefix(url.UserPassword("x", s).String(), "x:"), q[1 : len(q)-1]}
}

// Redact returns s with every known secret replaced by "[redacted]", the
// user info of URLs by "***" (StripUserInfo) and the token after
// "Bearer " by "[redacted]". It is safe for concurrent use.
func (r *Redactor) Redact(s string) string {
	if r != nil && r.rep != nil {
		s = r.rep.Replace(s)
	}
	s = StripUserInfo(s)
	if strings.Contains(s, "earer") {
		s = bearerRE.ReplaceAllString(s, "${1} "+Marker)
	}
	return s
}

// Handler is a slog.Handler that passes the message and every attribute
// (inside groups too) through a Redactor before the next handler: strings
// and errors are redacted; any other value whose text (fmt %+v or JSON)
// holds a secret is replaced by its redacted text. Its Redact method makes
// it an events.Redactor, so a Reporter logging through it redacts its
// events too.
type Handler struct {
	next slog.Handler
	r    *Redactor
}

// NewHandler returns a Handler redacting with r (nil strips only URL user
// info and bearer tokens) before next.
func NewHandler(next slog.Handler, r *Redactor) *Handler {
	return &Handler{next: next, r: r}
}

// Redact applies the handler's Redactor to s.
func (h *Handler) Redact(s string) string { return h.r.Redact(s) }

func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *Handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.Redact(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.attr(a)
	}
	return &Handler{next: h.next.WithAttrs(red), r: h.r}
}

func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), r: h.r}
}

func (h *Handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.r.Redact(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]slog.Attr, len(g))
		for i, ga := range g {
			red[i] = h.attr(ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(red...)}
	case slog.KindAny:
		x := v.Any()
		if err, ok := x.(error); ok {
			return slog.String(a.Key, h.r.Redact(err.Error()))
		}
		text := fmt.Sprintf("%+v", x)
		if red := h.r.Redact(text); red != text {
			return slog.String(a.Key, red)
		}
		if j, err := json.Marshal(x); err == nil {
			if s := string(j); h.r.Redact(s) != s {
				return slog.String(a.Key, h.r.Redact(text))
			}
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
