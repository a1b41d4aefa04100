package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/matbus/matbus/internal/testenv"
)

// TestCLIHelpAndErrors: help goes to stdout and exits 0 in every form; a
// bad flag gives one line naming the flag and the value plus one hint line
// on stderr, exit 2, never the whole flag list, a bare "parse error" or a
// doubled "usage:".
func TestCLIHelpAndErrors(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}, {"worker", "--help"}, {"help", "worker"}, {"discovery", "-h"}, {"help", "errors"}} {
		code, out, errOut := runArgs(t, nil, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "Usage: matbus") {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q", args, code, len(out), errOut)
		}
	}
	if _, out, _ := runArgs(t, nil, "help", "worker"); !strings.Contains(out, "--target-selector  [env TARGET_SELECTOR]") {
		t.Errorf("help worker does not list the worker's flags:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"worker", "--jobs", "abc"}, nil, `matbus worker: --jobs "abc": want an integer`},
		{[]string{"worker", "--bogus"}, nil, "matbus worker: unknown flag --bogus"},
		{[]string{"worker", "--ack-wait", "5x"}, nil, `matbus worker: --ack-wait "5x": want a positive duration`},
		{[]string{"worker", "--ack-wait", "-1s"}, nil, `--ack-wait "-1s": want a positive duration`},
		{[]string{"worker", "--mat-body-max-age", "-1s"}, nil, `--mat-body-max-age "-1s": want a duration such as 5m, or 0 for off (must not be negative`},
		{[]string{"discovery", "--leader-elect=maybe"}, nil, `matbus discovery: --leader-elect "maybe": want true or false`},
		{[]string{"worker", "--kube-qps", "fast"}, nil, `--kube-qps "fast": want a number`},
		{[]string{"worker", "--kube-qps", "NaN"}, nil, "--kube-qps and --kube-burst must be positive numbers"},
		{[]string{"worker", "--kube-qps", "+Inf"}, nil, "--kube-qps and --kube-burst must be positive numbers"},
		{[]string{"worker", "--kube-qps-max", "NaN"}, nil, "--kube-qps-max and --kube-max-inflight must be positive numbers"},
		{[]string{"worker", "--jobs"}, nil, "flag --jobs needs a value"},
		{[]string{"worker", "--stream-replicas", "7"}, nil, "--stream-replicas 7: want 1 to 5"},
		{[]string{"discovery"}, map[string]string{"MATBUS_STREAM_REPLICAS": "0"}, "--stream-replicas 0: want 1 to 5"},
		{[]string{"worker", "--nats-tls-cert", "client.pem"}, nil, "--nats-tls-cert and --nats-tls-key go together"},
		{[]string{"worker"}, map[string]string{"MATBUS_JOBS": "many"}, `environment variable MATBUS_JOBS: --jobs "many": want an integer`},
		{[]string{"worker"}, map[string]string{"MATBUS_MAT_BODY_MAX_AGE": "abc"}, `environment variable MATBUS_MAT_BODY_MAX_AGE: --mat-body-max-age "abc": want a duration such as 5m, or 0 for off`},
		{[]string{"discovery", "--poll-max-interval", "3x"}, nil, `--poll-max-interval "3x": want a positive duration such as 30s or 1m`},
		{[]string{"dev", "--hosts", "-3"}, nil, "-3 hosts: a device count must be 0 or more"},
		{[]string{"discovery", "--namespace", "Bad_NS", "--static", "a=https://x:1", "--leader-elect=false", "--health-addr", ""}, nil, "--namespace"},
	} {
		code, out, errOut := runArgs(t, c.env, c.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.Contains(lines[0], c.want) ||
			!strings.HasPrefix(lines[1], "Run `matbus help ") || strings.Contains(errOut, "parse error") || strings.Contains(errOut, "usage:") ||
			strings.Contains(errOut, "time: ") || strings.Contains(errOut, "{") {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s\nwant 2 lines, the first containing %q", c.args, code, out, errOut, c.want)
		}
	}
	// plan keeps exit 2 for "something would change": its usage errors exit 1.
	for _, args := range [][]string{{"plan", "--bogus"}, {"plan", "-o", "yaml"}} {
		code, out, errOut := runArgs(t, nil, args...)
		if code != 1 || out != "" || !strings.Contains(errOut, "matbus plan: ") || !strings.Contains(errOut, "Run `matbus help plan`") {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and the usage hint", args, code, out, errOut)
		}
	}
	code, _, errOut := runArgs(t, nil, "frob")
	if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 1 || !strings.Contains(errOut, `unknown subcommand "frob"`) {
		t.Errorf("unknown subcommand: exit %d, stderr:\n%s", code, errOut)
	}
}

// TestVersionNamesCommitAndGo: `matbus version` prints the version, the
// commit and the Go version.
func TestVersionNamesCommitAndGo(t *testing.T) {
	code, out, _ := runArgs(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "matbus "+version+" (commit ") || !strings.Contains(out, runtime.Version()) {
		t.Fatalf("exit %d: %q", code, out)
	}
}

// TestErrorsNoFollowWithoutStream: `errors --follow=false` on a server
// where no matbus component created the error stream exits 1 at once and
// says so, instead of waiting.
func TestErrorsNoFollowWithoutStream(t *testing.T) {
	nc := testenv.NATS(t)
	code, out, errOut := runArgs(t, nil, "errors", "--follow=false", "--since", "1h", "--nats-url", nc.ConnectedUrl(), "--subject-prefix", "nobody")
	if code != 1 || out != "" || !strings.Contains(errOut, "stream NOBODY_ERRORS does not exist") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestUnreadableKubeconfig: a kubeconfig that cannot be read is named as
// such, exit 1.
func TestUnreadableKubeconfig(t *testing.T) {
	bad := t.TempDir() + "/missing-kubeconfig"
	for _, args := range [][]string{{"worker", "--kubeconfig", bad, "--health-addr", ""}, {"discovery", "--kubeconfig", bad, "--health-addr", ""}} {
		code, _, errOut := runArgs(t, nil, args...)
		if code != 1 || !strings.Contains(errOut, "kubeconfig "+bad+" (--kubeconfig, KUBECONFIG) is not usable: ") || !strings.Contains(errOut, "no such file") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}
