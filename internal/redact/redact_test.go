package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestRedactorRedact(t *testing.T) {
	const pw, tok = "s3cr3t/Pass+word", "tok-9a8b7c6d5e"
	r := New([]string{pw, tok, "abc", ""})
	cases := []struct{ name, in, want string }{
		{"plain secret", "password is " + pw + ".", "password is [redacted]."},
		{"query-escaped secret", "p=" + url.QueryEscape(pw), "p=[redacted]"},
		{"path-escaped secret", "/x/" + url.PathEscape(pw), "/x/[redacted]"},
		{"go-quoted secret", fmt.Sprintf("%q", "a\t"+pw), `"a\t[redacted]"`},
		{"token in a URL", "nats://" + tok + "@10.0.0.1:4222", "nats://***@10.0.0.1:4222"},
		{"password in a URL", "nats://bob:" + url.PathEscape(pw) + "@h:4222", "nats://***@h:4222"},
		{"unknown password in a URL", "https://bob:other@h:6443/api", "https://***@h:6443/api"},
		{"bearer header", "Authorization: Bearer eyJhbGciOi.J9xyz-_", "Authorization: Bearer [redacted]"},
		{"bearer word alone", "a bearer of news", "a bearer of news"},
		{"short secret kept", "abc def", "abc def"},
		{"nothing secret", "NATS connected url=nats://127.0.0.1:4222", "NATS connected url=nats://127.0.0.1:4222"},
		{"secret twice", tok + tok, "[redacted][redacted]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := r.Redact(c.in); got != c.want {
				t.Fatalf("Redact(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
	if got := (*Redactor)(nil).Redact("nats://u:p@h:1"); got != "nats://***@h:1" {
		t.Fatalf("nil redactor: %q", got)
	}
	// A secret that contains another is replaced whole.
	r2 := New([]string{"abcdef", "abcdefghij"})
	if got := r2.Redact("xabcdefghijx"); got != "x[redacted]x" {
		t.Fatalf("overlapping secrets: %q", got)
	}
}

type secretValuer struct{ url string }

func (v secretValuer) LogValue() slog.Value { return slog.StringValue("dial " + v.url) }

type withSecret struct {
	Host  string
	Token string
}

func TestRedactHandler(t *testing.T) {
	const pw = "Zx9-pa55-Qw7"
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, nil), New([]string{pw})))
	ue := &url.Error{Op: "Get", URL: "https://admin:" + pw + "@10.1.1.1:6443/api", Err: errors.New("connection refused")}
	log.With("nats", "nats://u:"+pw+"@h:4222").WithGroup("g").Info("connect with "+pw,
		"error", fmt.Errorf("kube: %w", ue),
		"url", "nats://tok@h:4222",
		slog.Group("inner", "secret", pw, "n", 3),
		"valuer", secretValuer{url: "nats://x:" + pw + "@h"},
		"struct", withSecret{Host: "h", Token: pw},
		"cidrs", []string{"10.96.0.0/12"},
		"count", 7)
	line := buf.String()
	if strings.Contains(line, pw) || strings.Contains(line, "admin") || strings.Contains(line, "tok@") {
		t.Fatalf("secret logged: %s", line)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatal(err)
	}
	g, _ := m["g"].(map[string]any)
	inner, _ := g["inner"].(map[string]any)
	cidrs, _ := g["cidrs"].([]any)
	if m["msg"] != "connect with [redacted]" || m["nats"] != "nats://***@h:4222" || g == nil ||
		g["error"] != `kube: Get "https://***@10.1.1.1:6443/api": connection refused` ||
		g["url"] != "nats://***@h:4222" || inner["secret"] != "[redacted]" || inner["n"] != 3.0 ||
		g["valuer"] != "dial nats://***@h" || g["struct"] != "{Host:h Token:[redacted]}" ||
		len(cidrs) != 1 || g["count"] != 7.0 {
		t.Fatalf("redacted line: %s", line)
	}
	if _, ok := slog.Handler(NewHandler(slog.DiscardHandler, nil)).(interface{ Redact(string) string }); !ok {
		t.Fatal("Handler does not implement events.Redactor")
	}
}

func TestFlagSecrets(t *testing.T) {
	dir := t.TempDir()
	const jwt = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJBQkMifQ.c2lnbmF0dXJl"
	const seed = "SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU"
	creds := filepath.Join(dir, "user.creds")
	writeFile(t, creds, "-----BEGIN NATS USER JWT-----\n"+jwt+"\n------END NATS USER JWT------\n\n"+
		"************************* IMPORTANT *************************\nNKEYs are sensitive and should be treated as secrets.\n\n"+
		"-----BEGIN USER NKEY SEED-----\n"+seed+"\n------END USER NKEY SEED------\n")
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, "file-token-123456\n")
	kc := clientcmdapi.NewConfig()
	kc.AuthInfos["a"] = &clientcmdapi.AuthInfo{Token: "kube-token-abcdef"}
	kc.AuthInfos["b"] = &clientcmdapi.AuthInfo{Username: "bob", Password: "kube-pass-987"}
	kc.AuthInfos["c"] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	kc.AuthInfos["d"] = &clientcmdapi.AuthInfo{AuthProvider: &clientcmdapi.AuthProviderConfig{Name: "oidc",
		Config: map[string]string{"id-token": "oidc-id-token-1", "client-id": "public-id"}}}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	const keyLine = "MHcCAQEEIBkQ3h0bXZ1c2tleWxpbmVvbmVpc2FzZWNyZXQxMjM0NTY3ODkwYWJj"
	key := filepath.Join(dir, "client-key.pem")
	writeFile(t, key, "-----BEGIN EC PRIVATE KEY-----\n"+keyLine+"\n-----END EC PRIVATE KEY-----\n")
	for _, name := range []string{"nats-url", "nats-creds", "kubeconfig", "nats-tls-key"} {
		fs.String(name, "", "")
	}
	err := fs.Parse([]string{"--nats-url", "nats://alice:pw%2Fone@h1:4222, nats://tok-two@h2:4222,nats://h3:4222",
		"--nats-creds", creds, "--kubeconfig", kubeconfig, "--nats-tls-key", key})
	if err != nil {
		t.Fatal(err)
	}
	got := FlagSecrets(fs)
	for _, want := range []string{"pw%2Fone", "pw/one", "tok-two", jwt, seed, "kube-token-abcdef", "kube-pass-987", "file-token-123456", "oidc-id-token-1", keyLine} {
		if !slices.Contains(got, want) {
			t.Errorf("FlagSecrets lacks %q: %q", want, got)
		}
	}
	for _, not := range []string{"alice", "bob", "public-id", "h3:4222", key, "-----BEGIN EC PRIVATE KEY-----"} {
		if slices.Contains(got, not) {
			t.Errorf("FlagSecrets holds %q, which is no secret", not)
		}
	}

	// Flags a subcommand lacks and files that do not exist add nothing.
	if got := FlagSecrets(flag.NewFlagSet("empty", flag.ContinueOnError)); len(got) != 0 {
		t.Errorf("no flags: %q", got)
	}
	if got := credsSecrets(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("missing creds file: %q", got)
	}
	if got := kubeSecrets(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("missing kubeconfig: %q", got)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
func TestStripUserInfo(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"user and password", "nats://alice:s3cret@10.0.0.1:4222", "nats://***@10.0.0.1:4222"},
		{"token", "nats://tok3n@nats.example:4222", "nats://***@nats.example:4222"},
		{"no user info", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"list", "nats://a:b@h1:4222,tls://t@h2:4222", "nats://***@h1:4222,tls://***@h2:4222"},
		{"list with spaces", "nats://a:b@h1:4222, nats://h2:4222", "nats://***@h1:4222, nats://h2:4222"},
		{"at sign in password", "nats://u:p@ss@h:1", "nats://***@h:1"},
		{"ipv6 host", "nats://u:p@[::1]:4222", "nats://***@[::1]:4222"},
		{"path and query kept", "https://u:p@h:6443/api?x=a@b", "https://***@h:6443/api?x=a@b"},
		{"quoted in an error", `Get "https://u:p@10.1.2.3:6443/api": dial tcp: refused`, `Get "https://***@10.1.2.3:6443/api": dial tcp: refused`},
		{"net/http masked password", `Get "https://tok:***@h/x": EOF`, `Get "https://***@h/x": EOF`},
		{"mail address is not a URL", "mail ops@example.com now", "mail ops@example.com now"},
		// An '@' after a URL without a path, before the next '/', is taken
		// for the end of user info: more is hidden, never less.
		{"url then mail address", "nats://h:1 ops@example.com", "nats://***@example.com"},
		{"url with path then mail address", "nats://h:1/x ops@example.com", "nats://h:1/x ops@example.com"},
		{"empty user info", "nats://@h:1", "nats://@h:1"},
		{"two urls in text", "from nats://a:b@h1:1 to nats://c@h2:2.", "from nats://***@h1:1 to nats://***@h2:2."},
		{"empty", "", ""},
		// URLs net/url rejects: the rule is textual.
		{"space in password", "nats://bob:s3cret PW@127.0.0.1:4222", "nats://***@127.0.0.1:4222"},
		{"spaces around", "url nats://bob:a b c@h:1 and more", "url nats://***@h:1 and more"},
		{"bad escape in password", "nats://bob:s3%zzcret@h:1", "nats://***@h:1"},
		{"colon, percent and at in password", "nats://bob:a:b%@c@d e@h:1/p", "nats://***@h:1/p"},
		{"quote in password", `nats://bob:pa"ss@h:1`, "nats://***@h:1"},
		{"go parse error", `parse "nats://bob:s3cret PW@127.0.0.1:4222": net/url: invalid userinfo`,
			`parse "nats://***@127.0.0.1:4222": net/url: invalid userinfo`},
		{"go parse error, bad escape", `parse "nats://bob:s3%zzcret@127.0.0.1:1": invalid URL escape "%zz"`,
			`parse "nats://***@127.0.0.1:1": invalid URL escape "%zz"`},
		{"parse error after the url", `connect to NATS at nats://bob:s3cret PW@h:1: parse "nats://bob:s3cret PW@h:1": net/url: invalid userinfo`,
			`connect to NATS at nats://***@h:1: parse "nats://***@h:1": net/url: invalid userinfo`},
		{"unparsable list", "nats://a:p w@h1:1,nats://c:q%zz@h2:2, nats://h3:3", "nats://***@h1:1,nats://***@h2:2, nats://h3:3"},
		{"go-quoted space", `"http://u:pw 9@127.0.0.1:1/v1/sources"`, `"http://***@127.0.0.1:1/v1/sources"`},
		{"scheme text without at", "see https://example.com/a and ftp://h:21 now", "see https://example.com/a and ftp://h:21 now"},
		{"scheme text, at in path", "see https://example.com/a@b", "see https://example.com/a@b"},
		{"line break ends", "nats://h:1\nmail ops@example.com", "nats://h:1\nmail ops@example.com"},
		{"idempotent", "nats://***@h:1", "nats://***@h:1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := StripUserInfo(c.in); got != c.want {
				t.Fatalf("StripUserInfo(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestParseURLUserInfo(t *testing.T) {
	cases := []struct{ in, want, secret string }{
		{"nats://bob:s3cret PW@127.0.0.1:4222", `"nats://***@127.0.0.1:4222": invalid userinfo`, "s3cret"},
		{"nats://bob:s3%zzcret@127.0.0.1:1", `"nats://***@127.0.0.1:1": invalid URL escape`, "zz"},
		{"http://u:pw 9@127.0.0.1:1", `"http://***@127.0.0.1:1": invalid userinfo`, "pw 9"},
		{"nats://svc:pw@nats.example:bad", `"nats://***@nats.example:bad": invalid port after host`, "pw"},
		{"nats://bob:pa/ss@h:1", `"nats://***@h:1": invalid port after host`, "pa/"},
		{"nats://h o:1", `"nats://h o:1": invalid character in host name`, `" "`},
	}
	for _, c := range cases {
		_, err := ParseURL(c.in)
		if err == nil || err.Error() != c.want || strings.Contains(err.Error(), c.secret) {
			t.Errorf("ParseURL(%q) = %v, want %s", c.in, err, c.want)
		}
	}
	if u, err := ParseURL("nats://u:p@h:1"); err != nil || u.Host != "h:1" {
		t.Errorf("ParseURL of a good URL: %v, %v", u, err)
	}
}

func TestFlagSecretsUnparsableURL(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("nats-url", "", "")
	fs.String("sources-url", "", "")
	if err := fs.Parse([]string{"--nats-url", "nats://bob:s3cret PW@h:1,nats://al:x%zz/y?z#w@h2:2", "--sources-url", "http://u:pw 9@h:1"}); err != nil {
		t.Fatal(err)
	}
	got := FlagSecrets(fs)
	for _, want := range []string{"s3cret PW", "x%zz/y?z#w", "pw 9"} {
		if !slices.Contains(got, want) {
			t.Errorf("FlagSecrets lacks %q: %q", want, got)
		}
	}
	var buf bytes.Buffer
	slog.New(NewHandler(slog.NewTextHandler(&buf, nil), New(got))).Info("echo", "pw", "s3cret PW", "err", errors.New(`x%zz/y?z#w and pw 9`))
	if line := buf.String(); strings.Contains(line, "s3cret") || strings.Contains(line, "zz") || strings.Contains(line, "pw 9") {
		t.Fatalf("secret logged: %s", line)
	}
}

func TestStripUserInfoLoose(t *testing.T) {
	cases := []struct{ in, want string }{
		{"u:S3cretPW@127.0.0.1:4223", "***@127.0.0.1:4223"},
		{"//u:pw@host:1", "//***@host:1"},
		{"nats:/u:pw@host:1", "nats:/***@host:1"},
		{"S3cret:x@host", "***@host"},
		{"tok@h:1", "***@h:1"},
		{"u:p@ss@h:1", "***@h:1"},
		{"nats://u:p@h:1", "nats://***@h:1"},
		{"127.0.0.1:4222", "127.0.0.1:4222"},
		{"", ""},
	}
	for _, c := range cases {
		if got := StripUserInfoLoose(c.in); got != c.want {
			t.Errorf("StripUserInfoLoose(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(c.in, "pw") && strings.Contains(StripUserInfoLoose(c.in), "pw") {
			t.Errorf("StripUserInfoLoose(%q) keeps the password", c.in)
		}
	}
}
