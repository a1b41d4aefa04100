package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/testenv"
)

// TestMatCAFileStartupErrors: a --mat-ca-file (or its variable) that
// cannot be read or holds no certificate stops worker, check and dev at
// start with exit 1 and a message naming the flag and the file, never its
// contents.
func TestMatCAFileStartupErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.crt")
	noCert := filepath.Join(dir, "key-only.pem")
	if err := os.WriteFile(noCert, []byte("-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sub := range [][]string{
		{"worker", "--health-addr", ""},
		{"check", "--timeout", "5s"},
		{"dev", "--nats-port", "0"},
	} {
		for _, tc := range []struct {
			name string
			path string
			want string
			env  bool
		}{
			{"missing", missing, "no such file", false},
			{"no certificate", noCert, "no PEM CERTIFICATE block", false},
			{"no certificate from the environment", noCert, "no PEM CERTIFICATE block", true},
		} {
			t.Run(sub[0]+"/"+tc.name, func(t *testing.T) {
				args := append([]string(nil), sub...)
				env := map[string]string{"KUBECONFIG": filepath.Join(dir, "no-kubeconfig")}
				if tc.env {
					env[cliflag.EnvName("mat-ca-file")] = tc.path
				} else {
					args = append(args, "--mat-ca-file", tc.path)
				}
				code, out, errOut := runArgs(t, env, args...)
				msg := out + errOut
				if code != 1 || !strings.Contains(msg, "--mat-ca-file "+tc.path+" ("+cliflag.EnvName("mat-ca-file")+")") || !strings.Contains(msg, tc.want) {
					t.Fatalf("exit %d (want 1), want the flag, the file and %q in:\n%s", code, tc.want, msg)
				}
				if strings.Contains(msg, "c2VjcmV0") || strings.Contains(msg, "PRIVATE KEY") {
					t.Errorf("the file's contents are in the output:\n%s", msg)
				}
				if strings.Contains(msg, "CHECK ") {
					t.Errorf("check ran its checks before refusing the CA file:\n%s", msg)
				}
			})
		}
	}
}

// TestMatsimCertFilesAndCheckCAFile: `matbus matsim --tls-cert-file
// --tls-key-file` serves a CA-issued certificate with a DNS name only;
// `matbus check` verifies it with --mat-ca-file and fails the MAT status
// row without it, naming the cause.
func TestMatsimCertFilesAndCheckCAFile(t *testing.T) {
	ca := testenv.NewCA(t, "matbus check test CA")
	certFile, keyFile := ca.WriteKeyPair(ca.Issue("localhost")) // resolves to loopback without a hook
	caFile := ca.WriteFile()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	// A process of its own: two subcommands in one process share klog's
	// global logger.
	sim := startProc(t, buildMatbus(t), "matsim", nil, "matsim", "--listen", "127.0.0.1:"+strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--hosts", "1", "--switches", "0", "--power-shelves", "0")
	defer func() {
		if t.Failed() {
			t.Logf("matsim output:\n%s", sim.out.Bytes())
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("matsim not listening: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	url := "https://localhost:" + strconv.Itoa(port)
	const row = "MAT status default.mat-a"
	check := func(extra ...string) string {
		t.Helper()
		args := append([]string{"check", "--static", "mat-a=" + url, "--leader-elect=false", "--nats-url", "nats://127.0.0.1:1",
			"--kubeconfig", filepath.Join(t.TempDir(), "none"), "--log-level", "error", "--timeout", "20s"}, extra...)
		_, out, errOut := runArgs(t, nil, args...)
		return out + errOut
	}
	out := check("--mat-ca-file", caFile)
	if got, line := checkRowResult(out, row); got != "ok" || !strings.Contains(line, "BMC") {
		t.Errorf("with --mat-ca-file: row %q, want ok:\n%s", line, out)
	}
	out = check()
	if got, line := checkRowResult(out, row); got != "FAIL" || !strings.Contains(line, "certificate signed by unknown authority") ||
		!strings.Contains(line, `issuer "CN=matbus check test CA"`) || !strings.Contains(line, "--mat-ca-file") {
		t.Errorf("without --mat-ca-file: row %q, want FAIL naming the unknown authority and --mat-ca-file:\n%s", line, out)
	}
	out = check("--insecure-skip-verify")
	if got, line := checkRowResult(out, row); got != "ok" {
		t.Errorf("with --insecure-skip-verify: row %q, want ok:\n%s", line, out)
	}
}

// TestCertificateErrorsSurviveRedaction: the log handler and error reporter
// of a production process (secrets of the flags redacted, URL user info
// stripped) keep Go's certificate messages as they are, both names and the
// issuer included.
func TestCertificateErrorsSurviveRedaction(t *testing.T) {
	fs := cliflag.NewFlagSet("worker", "")
	var n natsOpts
	l := logOpts{}
	n.register(fs)
	l.register(fs)
	if err := fs.Parse([]string{"--nats-url", "nats://matbus:s3cret-pass@127.0.0.1:4222", "--log-format", "json"}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log, err := l.logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	rep := events.NewReporter(nil, log, "worker-0", 0)
	const u = "https://mat-1-bmc-mock.golden.svc.cluster.local:1266"
	for _, msg := range []string{
		"status fetch failed, no Service changed: matclient: GET " + u + "/machines/status: tls: failed to verify certificate: " +
			"x509: certificate is valid for mat-0-bmc-mock.golden.svc.cluster.local, not mat-1-bmc-mock.golden.svc.cluster.local",
		"status fetch failed, no Service changed: matclient: GET " + u + "/machines/status: tls: failed to verify certificate: " +
			`x509: certificate signed by unknown authority (issuer "CN=golden CA,O=matbus")`,
	} {
		buf.Reset()
		rep.Report(context.Background(), events.Error{Kind: events.ErrorFetch, Instance: "golden.mat-1-bmc-mock", URL: u, Message: msg, Permanent: true})
		var line struct{ Error, URL string }
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", buf.String(), err)
		}
		if line.Error != msg || line.URL != u {
			t.Errorf("logged error %q, url %q\nwant          %q, url %q", line.Error, line.URL, msg, u)
		}
	}
}
