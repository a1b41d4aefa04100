package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/events"
)

// redactedMarker stands in for a known secret value in logs and events.
const redactedMarker = "[redacted]"

// minSecretLen is the shortest secret replaced by value: shorter ones
// would blank out common words. URL user info is stripped whatever its length.
const minSecretLen = 4

// inClusterTokenFile is where rest.InClusterConfig reads the service account token.
const inClusterTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// bearerRE matches an HTTP bearer credential ("Bearer <token>").
var bearerRE = regexp.MustCompile(`\b([Bb]earer)\s+[A-Za-z0-9\-._~+/]{8,}=*`)

// decoratedRE matches one armoured block of a NATS .creds file (the user
// JWT or the NKEY seed) and captures its content.
var decoratedRE = regexp.MustCompile(`(?m)^\s*-{3,}[^\n]*-{3,}\s*\n\s*([A-Za-z0-9\-_.=]+)\s*\n\s*-{3,}[^\n]*-{3,}`)

// redactor removes secrets from text: the known secret values given to
// newRedactor (and their URL-escaped and Go-quoted forms), the user info of
// URLs and bearer credentials. The zero value and nil strip only the latter two.
type redactor struct {
	rep *strings.Replacer // nil when no secret is known
}

// newRedactor returns a redactor for secrets; empty values and values of
// fewer than minSecretLen bytes are ignored.
func newRedactor(secrets []string) *redactor {
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
		return &redactor{}
	}
	// The longest first: a secret that contains another is replaced whole.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, redactedMarker)
	}
	return &redactor{rep: strings.NewReplacer(pairs...)}
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
// user info of URLs by "***" (events.StripUserInfo) and the token after
// "Bearer " by "[redacted]". It is safe for concurrent use.
func (r *redactor) Redact(s string) string {
	if r != nil && r.rep != nil {
		s = r.rep.Replace(s)
	}
	s = events.StripUserInfo(s)
	if strings.Contains(s, "earer") {
		s = bearerRE.ReplaceAllString(s, "${1} "+redactedMarker)
	}
	return s
}

// redactHandler is a slog.Handler that passes the message and every
// attribute (inside groups too) through a redactor before the next handler:
// strings and errors are redacted; any other value whose text (fmt %+v or
// JSON) holds a secret is replaced by its redacted text. It implements
// events.Redactor, so a Reporter logging through it redacts its events too.
type redactHandler struct {
	next slog.Handler
	r    *redactor
}

var _ events.Redactor = (*redactHandler)(nil)

func newRedactHandler(next slog.Handler, r *redactor) *redactHandler {
	return &redactHandler{next: next, r: r}
}

// Redact applies the handler's redactor to s.
func (h *redactHandler) Redact(s string) string { return h.r.Redact(s) }

func (h *redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.Redact(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *redactHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.attr(a)
	}
	return &redactHandler{next: h.next.WithAttrs(red), r: h.r}
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{next: h.next.WithGroup(name), r: h.r}
}

func (h *redactHandler) attr(a slog.Attr) slog.Attr {
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

// flagSecrets returns the secrets that the parsed flags of fs lead to: the
// password or token in --nats-url, the JWT and seed in the --nats-creds
// file, the contents of the --nats-tls-key file, the tokens and passwords of the --kubeconfig file (and of the token
// files it names) or, without --kubeconfig, the in-cluster service account
// token. A flag fs lacks, or a file that cannot be read, adds nothing (the
// command reports an unreadable file when it uses it).
func flagSecrets(fs *flag.FlagSet) []string {
	val := func(name string) (string, bool) {
		f := fs.Lookup(name)
		if f == nil {
			return "", false
		}
		return f.Value.String(), true
	}
	var out []string
	if v, ok := val("nats-url"); ok {
		out = append(out, urlSecrets(v)...)
	}
	if v, ok := val("nats-creds"); ok && v != "" {
		out = append(out, credsSecrets(v)...)
	}
	if v, ok := val("kubeconfig"); ok {
		out = append(out, kubeSecrets(v)...)
	}
	if v, ok := val("nats-tls-key"); ok && v != "" {
		out = append(out, keySecrets(v)...)
	}
	return out
}

// keySecrets returns the base64 lines of the PEM private key file at path
// (the --nats-tls-key file), each of which must never be logged; the
// path itself is no secret.
func keySecrets(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if len(line) >= 16 && !strings.HasPrefix(line, "-----") && !strings.Contains(line, ":") {
			out = append(out, line)
		}
	}
	return out
}

// urlSecrets returns the password (or, without one, the token: the user
// name) of each URL in a comma-separated list, as written and unescaped.
func urlSecrets(list string) []string {
	var out []string
	for _, u := range strings.Split(list, ",") {
		_, rest, ok := strings.Cut(strings.TrimSpace(u), "://")
		if !ok {
			continue
		}
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			rest = rest[:i]
		}
		at := strings.LastIndexByte(rest, '@')
		if at <= 0 {
			continue
		}
		secret := rest[:at]
		if _, pw, ok := strings.Cut(secret, ":"); ok {
			secret = pw
		}
		out = append(out, secret)
		if un, err := url.PathUnescape(secret); err == nil && un != secret {
			out = append(out, un)
		}
	}
	return out
}

// credsSecrets returns the user JWT and NKEY seed of a NATS .creds file.
func credsSecrets(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range decoratedRE.FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// kubeSecrets returns the bearer tokens, passwords and token-file contents
// of every user in the kubeconfig at path, and the token values of their
// auth-provider settings; for path "" the in-cluster token.
func kubeSecrets(path string) []string {
	readFile := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	if path == "" {
		return []string{readFile(inClusterTokenFile)}
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, ai := range cfg.AuthInfos {
		out = append(out, ai.Token, ai.Password)
		if ai.TokenFile != "" {
			out = append(out, readFile(ai.TokenFile))
		}
		if ai.AuthProvider != nil {
			for k, v := range ai.AuthProvider.Config {
				if k = strings.ToLower(k); strings.Contains(k, "token") || strings.Contains(k, "secret") || strings.Contains(k, "password") {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// redactedError is err's text without the user info of the URLs it names,
// for the final line of a failed subcommand, written without the logger.
func redactedError(err error) string { return events.StripUserInfo(err.Error()) }
