package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
)

// TestDevOnceStopsOnPermanentProblems: with BMC IPs outside the service
// range (cluster-ip mode), every create is refused permanently; `dev
// --once` stops with exit 1 and "stopped":"permanent" instead of waiting
// for --timeout, and prints each error event once.
func TestDevOnceStopsOnPermanentProblems(t *testing.T) {
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	code, out, errOut := runArgs(t, map[string]string{"KUBECONFIG": ""}, "dev", "--once", "-v", "--nats-port", "0", "--simulators", "1",
		"--hosts", "2", "--bmc-subnet", "10.200.0.0/20", "--sync-interval", "2s", "--timeout", "2m30s", "--log-level", "error",
		"--namespace", "matbus-dev-permanent")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var s devSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if code != 1 || s.Stopped != "permanent" || s.Converged || s.Services >= s.Expected || s.Errors == 0 {
		t.Fatalf("exit %d, summary %+v\nstdout:\n%s", code, s, out)
	}
	if !strings.Contains(out, "every remaining problem is permanent") {
		t.Errorf("no line saying why it stopped:\n%s", out)
	}
	errLines := map[string]int{}
	for _, l := range lines {
		if strings.HasPrefix(l, "ERROR ") {
			errLines[l]++
			if errLines[l] == 2 {
				t.Errorf("error printed twice: %s", l)
			}
		}
	}
}

// TestIPTakenHint: the error events of a BMC IP that another Service holds,
// as the worker words them and as the API server does, get dev's hint to
// move the fleet to other subnets; other errors do not.
func TestIPTakenHint(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{`cluster IP 10.96.64.6 is allocated to another Service: Service "mat-bmc-host-x" is invalid`, true},
		{`Service "mat-bmc-host-x" is invalid: spec.clusterIPs: Invalid value: ["10.96.64.6"]: failed to allocate IP 10.96.64.6: provided IP is already allocated`, true},
		{`status fetch failed, no Service changed: connection refused`, false},
		{`Service "mat-bmc-host-x" is invalid: spec.clusterIPs: Invalid value: ["10.200.0.1"]: failed to allocate IP 10.200.0.1: the provided IP (10.200.0.1) is not in the valid range`, false},
	} {
		data, err := json.Marshal(map[string]string{"message": tt.msg})
		if err != nil {
			t.Fatal(err)
		}
		if got := ipTaken(data); got != tt.want {
			t.Errorf("ipTaken(%q) = %v, want %v", tt.msg, got, tt.want)
		}
	}
	if !strings.Contains(ipTakenHint, "--bmc-subnet") || !strings.Contains(ipTakenHint, "--nvos-subnet") {
		t.Errorf("the hint names no flag to change: %s", ipTakenHint)
	}
}

// TestDevNextSteps: the next-step block names this run's addresses in
// every command, passes the flags that change what status, plan and check
// must look at, and quotes what a shell would split.
func TestDevNextSteps(t *testing.T) {
	fs := newFlagSet("dev", "", nil)
	var w workerOpts
	w.register(fs)
	if err := fs.Parse([]string{"--managed-by", "me", "--bmc-ip-mode", "external-ip"}); err != nil {
		t.Fatal(err)
	}
	got := devNextSteps(devRun{
		natsURL: "nats://127.0.0.1:4333", namespace: "ns1", kubeconfig: "/tmp/a b/kubeconfig", sourcesURL: "http://127.0.0.1:8099",
		entries: []discovery.StaticEntry{{Name: "mat-0", URL: "https://127.0.0.1:1"}, {Name: "mat-1", URL: "https://127.0.0.1:2"}},
		flags:   devPassedFlags(fs, "lab"),
	})
	var cmds []string
	for _, l := range strings.Split(got, "\n") {
		if strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "  #") {
			cmds = append(cmds, strings.TrimPrefix(l, "  "))
		}
	}
	want := []string{
		"bin/matbus status --nats-url nats://127.0.0.1:4333 --namespace ns1 --kubeconfig '/tmp/a b/kubeconfig' --subject-prefix=lab --managed-by=me --bmc-ip-mode=external-ip --sources-url http://127.0.0.1:8099",
		"bin/matbus errors --nats-url nats://127.0.0.1:4333 --since 1h --subject-prefix=lab",
		"bin/matbus plan --kubeconfig '/tmp/a b/kubeconfig' --namespace ns1 --static mat-0=https://127.0.0.1:1,mat-1=https://127.0.0.1:2 --insecure-skip-verify --subject-prefix=lab --managed-by=me --bmc-ip-mode=external-ip",
		"bin/matbus check --nats-url nats://127.0.0.1:4333 --kubeconfig '/tmp/a b/kubeconfig' --namespace ns1 --static mat-0=https://127.0.0.1:1,mat-1=https://127.0.0.1:2 --insecure-skip-verify --subject-prefix=lab --managed-by=me --bmc-ip-mode=external-ip",
		"KUBECONFIG='/tmp/a b/kubeconfig' kubectl get svc -n ns1 -l app.kubernetes.io/managed-by=me",
		"curl -sSk -X PUT --data 500 https://127.0.0.1:2/matsim/fault",
	}
	if strings.Join(cmds, "\n") != strings.Join(want, "\n") {
		t.Errorf("next steps:\n%s\nwant the commands:\n%s", got, strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(got, "Next steps") {
		t.Errorf("block does not start with its title:\n%s", got)
	}
	for in, want := range map[string]string{"plain-1.2/x:y=z,w@v": "plain-1.2/x:y=z,w@v", "": "''", "a'b": `'a'\''b'`, "$HOME": "'$HOME'"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestDevNextStepsWhenNotInPlace: a run without --once whose Services
// cannot all be created (BMC IPs outside the service range) still prints
// how far it got and the next steps, once, after devNextStepsAfter, and
// stops cleanly on its context.
func TestDevNextStepsWhenNotInPlace(t *testing.T) {
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	defer func(d time.Duration) { devNextStepsAfter = d }(devNextStepsAfter)
	devNextStepsAfter = 2 * time.Second
	var o, e testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "-v", "--nats-port", "0", "--simulators", "1", "--hosts", "2", "--bmc-subnet", "10.200.0.0/20",
			"--log-level", "error", "--namespace", "matbus-dev-late"}, env{stdout: &o, stderr: &e, lookupEnv: mapEnv(map[string]string{"KUBECONFIG": ""})})
	}()
	testenv.Wait(t, 2*time.Minute, "the next steps of a run that is not in place", func() (bool, string) {
		return strings.Contains(o.String(), "matsim/fault"), o.String() + e.String()
	})
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d after Ctrl-C\n%s%s", code, o.String(), e.String())
	}
	out := o.String()
	if !regexp.MustCompile(`(?m)^[0-9]+ of [0-9]+ Services in place after [0-9]+s \(the ERROR lines say why\)\nNext steps \(`).MatchString(out) {
		t.Errorf("no line saying how far it got before the next steps:\n%s", out)
	}
	if n := strings.Count(out, "Next steps ("); n != 1 {
		t.Errorf("next steps printed %d times:\n%s", n, out)
	}
	if !strings.Contains(out, "bin/matbus status --nats-url nats://127.0.0.1:") || !strings.Contains(out, "--namespace matbus-dev-late") {
		t.Errorf("next steps without this run's address and namespace:\n%s", out)
	}
}
