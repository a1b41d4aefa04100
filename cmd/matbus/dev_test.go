package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/devenv"
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
	var s devenv.Summary
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

// TestDevPassedFlags: the flags that change what status, plan and check
// must look at are passed on when they differ from their defaults, the
// subject prefix first.
func TestDevPassedFlags(t *testing.T) {
	fs := cliflag.NewFlagSet("dev", "")
	var w workerOpts
	w.register(fs)
	if err := fs.Parse([]string{"--managed-by", "me", "--bmc-ip-mode", "external-ip"}); err != nil {
		t.Fatal(err)
	}
	got := devPassedFlags(fs, "lab")
	want := []string{"--subject-prefix=lab", "--managed-by=me", "--bmc-ip-mode=external-ip"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("devPassedFlags = %q, want %q", got, want)
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

// TestDevPublisherConfig: dev converts discovery's scheduling flags with
// discovery's own conversion, so none is dropped: the probe interval and
// the scheduler's sync interval reach the publisher as `matbus discovery`
// passes them (dev's source is static: no Kubernetes Events, as for
// `discovery --static`).
func TestDevPublisherConfig(t *testing.T) {
	args := []string{"--sync-interval", "5s", "--poll-interval", "2s", "--poll-max-interval", "3s", "--probe-max-interval", "90s"}
	o, err := parseDev(args, env{stderr: io.Discard, lookupEnv: mapEnv(nil)})
	if err != nil {
		t.Fatal(err)
	}
	got := o.config(nil, env{}, nil).Publisher
	s := got.Scheduler
	if got.SyncInterval != 5*time.Second || s.SyncInterval != 5*time.Second || s.PollInterval != 2*time.Second ||
		s.PollMaxInterval != 3*time.Second || s.ProbeMaxInterval != 90*time.Second || s.Events != nil {
		t.Errorf("dev's publisher configuration %+v", got)
	}
	fs := cliflag.NewFlagSet("discovery", "")
	var d discoveryOpts
	d.register(fs)
	if err := parseAndValidate(fs, append(args, "--static", "a=http://x:1"), mapEnv(nil), d.validate); err != nil {
		t.Fatal(err)
	}
	if want := d.publisherConfig(nil); got != want {
		t.Errorf("dev's publisher configuration %+v, discovery's %+v", got, want)
	}
}

// TestDevNamespaceDefault: dev's namespace matbus-dev is a default, which
// NAMESPACE and --namespace override (the command line first), and a bad
// value from the environment is refused as the same value on the command
// line is.
func TestDevNamespaceDefault(t *testing.T) {
	parse := func(args []string, vars map[string]string) (string, error) {
		t.Helper()
		o, err := parseDev(args, env{stderr: io.Discard, lookupEnv: mapEnv(vars)})
		if err != nil {
			return "", err
		}
		return o.w.namespace, nil
	}
	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"default", nil, nil, "matbus-dev"},
		{"environment", nil, map[string]string{"NAMESPACE": "lab"}, "lab"},
		{"flag", []string{"--namespace", "mine"}, nil, "mine"},
		{"flag over environment", []string{"--namespace", "mine"}, map[string]string{"NAMESPACE": "lab"}, "mine"},
	} {
		if got, err := parse(tc.args, tc.vars); err != nil || got != tc.want {
			t.Errorf("%s: namespace %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	_, flagErr := parse([]string{"--namespace", "Bad_NS"}, nil)
	_, envErr := parse(nil, map[string]string{"NAMESPACE": "Bad_NS"})
	if flagErr == nil || envErr == nil || flagErr.Error() != envErr.Error() || !errors.Is(envErr, errUsage) {
		t.Errorf("NAMESPACE=Bad_NS: %v; want the error of --namespace Bad_NS: %v", envErr, flagErr)
	}
	fs := cliflag.NewFlagSet("dev", "")
	(&devOpts{}).register(fs)
	if f := fs.Lookup("namespace"); f.DefValue != "matbus-dev" {
		t.Errorf("--namespace default shown as %q, want matbus-dev", f.DefValue)
	}
}
