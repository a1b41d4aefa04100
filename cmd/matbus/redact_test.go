package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matbus/matbus/internal/cliflag"
)

// TestLoggerRedactsFlagSecrets: the subcommands' logger hides the password
// given in --nats-url (here from the environment) and the JWT and seed of
// the --nats-creds file, and the final error line of a failed subcommand
// hides the URL's user info.
func TestLoggerRedactsFlagSecrets(t *testing.T) {
	const pw = "Env-pa55-8d7c6b"
	const jwt, seed = "eyJhbGciOiJlZDI1NTE5In0.eyJzdWIiOiJVQUJDIn0.c2lnLXh5eg", "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY"
	creds := filepath.Join(t.TempDir(), "u.creds")
	writeFile(t, creds, "-----BEGIN NATS USER JWT-----\n"+jwt+"\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n"+seed+"\n------END USER NKEY SEED------\n")
	fs := cliflag.NewFlagSet("t", "")
	var n natsOpts
	var l logOpts
	n.register(fs)
	l.register(fs)
	env := map[string]string{"MATBUS_NATS_URL": "nats://svc:" + pw + "@nats.example:4222", "MATBUS_LOG_FORMAT": "json", "MATBUS_NATS_CREDS": creds}
	if err := cliflag.Parse(fs, nil, mapEnv(env)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log, err := l.logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("using", "url", n.URL, "echo", "the password is "+pw, "creds", jwt+" "+seed)
	line := buf.String()
	if strings.Contains(line, pw) || strings.Contains(line, jwt) || strings.Contains(line, seed) ||
		!strings.Contains(line, `"url":"nats://***@nats.example:4222"`) || !strings.Contains(line, `"creds":"[redacted] [redacted]"`) {
		t.Fatalf("log line: %s", line)
	}

	// The port does not parse: a usage error naming the URL without its user info.
	code, out, errOut := runArgs(t, nil, "errors", "--nats-url", "nats://svc:"+pw+"@nats.example:bad", "--since", "1h", "--follow=false")
	if code != 2 || strings.Contains(out+errOut, pw) || !strings.Contains(errOut, "nats://***@nats.example:bad") {
		t.Fatalf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
