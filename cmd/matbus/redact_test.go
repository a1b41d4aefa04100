package main

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
	r := newRedactor([]string{pw, tok, "abc", ""})
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
	if got := (*redactor)(nil).Redact("nats://u:p@h:1"); got != "nats://***@h:1" {
		t.Fatalf("nil redactor: %q", got)
	}
	// A secret that contains another is replaced whole.
	r2 := newRedactor([]string{"abcdef", "abcdefghij"})
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
	log := slog.New(newRedactHandler(slog.NewJSONHandler(&buf, nil), newRedactor([]string{pw})))
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
	if _, ok := slog.Handler(newRedactHandler(slog.DiscardHandler, nil)).(interface{ Redact(string) string }); !ok {
		t.Fatal("redactHandler does not implement events.Redactor")
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
	var n natsOpts
	var k kubeOpts
	n.register(fs)
	n.registerTLS(fs)
	k.register(fs)
	err := fs.Parse([]string{"--nats-url", "nats://alice:pw%2Fone@h1:4222, nats://tok-two@h2:4222,nats://h3:4222",
		"--nats-creds", creds, "--kubeconfig", kubeconfig, "--nats-tls-key", key})
	if err != nil {
		t.Fatal(err)
	}
	got := flagSecrets(fs)
	for _, want := range []string{"pw%2Fone", "pw/one", "tok-two", jwt, seed, "kube-token-abcdef", "kube-pass-987", "file-token-123456", "oidc-id-token-1", keyLine} {
		if !slices.Contains(got, want) {
			t.Errorf("flagSecrets lacks %q: %q", want, got)
		}
	}
	for _, not := range []string{"alice", "bob", "public-id", "h3:4222", key, "-----BEGIN EC PRIVATE KEY-----"} {
		if slices.Contains(got, not) {
			t.Errorf("flagSecrets holds %q, which is no secret", not)
		}
	}

	// Flags a subcommand lacks and files that do not exist add nothing.
	if got := flagSecrets(flag.NewFlagSet("empty", flag.ContinueOnError)); len(got) != 0 {
		t.Errorf("no flags: %q", got)
	}
	if got := credsSecrets(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("missing creds file: %q", got)
	}
	if got := kubeSecrets(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("missing kubeconfig: %q", got)
	}
}

// TestLoggerRedactsFlagSecrets: the subcommands' logger hides the password
// given in --nats-url (here from the environment) and the JWT and seed of
// the --nats-creds file, and the final error line of a failed subcommand
// hides the URL's user info.
func TestLoggerRedactsFlagSecrets(t *testing.T) {
	const pw = "Env-pa55-8d7c6b"
	const jwt, seed = "eyJhbGciOiJlZDI1NTE5In0.eyJzdWIiOiJVQUJDIn0.c2lnLXh5eg", "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY"
	creds := filepath.Join(t.TempDir(), "u.creds")
	writeFile(t, creds, "-----BEGIN NATS USER JWT-----\n"+jwt+"\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n"+seed+"\n------END USER NKEY SEED------\n")
	fs := newFlagSet("t", "", io.Discard)
	var n natsOpts
	var l logOpts
	n.register(fs)
	l.register(fs)
	env := map[string]string{"MATBUS_NATS_URL": "nats://svc:" + pw + "@nats.example:4222", "MATBUS_LOG_FORMAT": "json", "MATBUS_NATS_CREDS": creds}
	if err := parseWithEnv(fs, nil, mapEnv(env)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log, err := l.logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("using", "url", n.url, "echo", "the password is "+pw, "creds", jwt+" "+seed)
	line := buf.String()
	if strings.Contains(line, pw) || strings.Contains(line, jwt) || strings.Contains(line, seed) ||
		!strings.Contains(line, `"url":"nats://***@nats.example:4222"`) || !strings.Contains(line, `"creds":"[redacted] [redacted]"`) {
		t.Fatalf("log line: %s", line)
	}

	// nats.Connect fails on the port; its error quotes the whole URL.
	code, out, errOut := runArgs(t, nil, "errors", "--nats-url", "nats://svc:"+pw+"@nats.example:bad", "--since", "1h", "--follow=false")
	if code != 1 || strings.Contains(out+errOut, pw) || !strings.Contains(errOut, "nats://***@nats.example:bad") {
		t.Fatalf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
