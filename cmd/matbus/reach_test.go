package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestOneShotCommandsNameWhatTheyCannotReach: status and errors, run by
// hand against a NATS address nothing listens on, and status and plan
// against an API server nothing listens on, end with an error that names
// the address and the cause, instead of waiting for --timeout and saying
// "context deadline exceeded". No password of the URL is shown.
func TestOneShotCommandsNameWhatTheyCannotReach(t *testing.T) {
	natsAddr := closedPort(t)
	natsURL := "nats://matbus:s3cret@" + natsAddr
	for _, args := range [][]string{
		{"status", "--nats-url", natsURL, "--kubeconfig", "", "--timeout", "2m"},
		{"errors", "--nats-url", natsURL},
	} {
		code, out, errOut := runArgs(t, map[string]string{"KUBECONFIG": ""}, args...)
		if code == 0 || !strings.Contains(errOut, "NATS at nats://***@"+natsAddr+" is not reachable") ||
			!strings.Contains(errOut, "connection refused") {
			t.Errorf("%s: exit %d, want an error naming %s and the cause\n%s%s", args[0], code, natsAddr, out, errOut)
		}
		if strings.Contains(out+errOut, "s3cret") {
			t.Errorf("%s shows the password:\n%s%s", args[0], out, errOut)
		}
	}

	apiAddr := closedPort(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+apiAddr+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runArgs(t, nil, "plan", "--kubeconfig", kc, "--namespace", "default", "--static", "mat-a=http://127.0.0.1:1",
		"--leader-elect=false", "--timeout", "2m", "--log-level", "error")
	if code != 1 || !strings.Contains(errOut, "the Kubernetes API server at https://"+apiAddr+" is not reachable") ||
		!strings.Contains(errOut, "connection refused") {
		t.Errorf("plan: exit %d, want 1 and an error naming %s and the cause\n%s%s", code, apiAddr, out, errOut)
	}

}
