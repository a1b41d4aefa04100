package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/devenv"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
)

func runArgs(t *testing.T, vars map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	// Goroutine-safe: a NATS connection's asynchronous callbacks may still
	// log while run returns.
	var o, e testenv.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	code = run(ctx, args, env{stdout: &o, stderr: &e, lookupEnv: mapEnv(vars)})
	return code, o.String(), e.String()
}

func envT(o, e *bytes.Buffer, m map[string]string) env {
	return env{stdout: o, stderr: e, lookupEnv: mapEnv(m)}
}

func TestEnvNames(t *testing.T) {
	for flag, want := range map[string]string{
		"sync-interval": "SYNC_INTERVAL", "namespace": "NAMESPACE", "kubeconfig": "KUBECONFIG",
		"insecure-skip-verify": "INSECURE_SKIP_VERIFY", "nats-url": "MATBUS_NATS_URL", "bmc-ip-mode": "MATBUS_BMC_IP_MODE",
	} {
		if got := cliflag.EnvName(flag); got != want {
			t.Errorf("cliflag.EnvName(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestParseWithEnv(t *testing.T) {
	fs := cliflag.NewFlagSet("t", "")
	var o discoveryOpts
	var ns string
	o.register(fs)
	fs.StringVar(&ns, "namespace", "default", "")
	env := map[string]string{"SYNC_INTERVAL": "5s", "NAMESPACE": "from-env", "MATBUS_STATIC": "a=https://x:1,b=https://y:1"}
	if err := cliflag.Parse(fs, []string{"--namespace", "from-flag"}, mapEnv(env)); err != nil {
		t.Fatal(err)
	}
	if o.interval != 5*time.Second || ns != "from-flag" || len(o.static.List) != 2 {
		t.Fatalf("interval=%s namespace=%s static=%v", o.interval, ns, o.static)
	}
	fs2 := cliflag.NewFlagSet("t", "")
	var o2 discoveryOpts
	o2.register(fs2)
	err := cliflag.Parse(fs2, nil, mapEnv(map[string]string{"SYNC_INTERVAL": "-1s"}))
	if err == nil || !strings.Contains(err.Error(), "SYNC_INTERVAL") {
		t.Fatalf("negative SYNC_INTERVAL: %v", err)
	}
}

func TestUsageAndBadFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"no args", nil, nil, 2, "Subcommands"},
		{"unknown subcommand", []string{"explode"}, nil, 2, "unknown subcommand"},
		{"help", []string{"worker", "--help"}, nil, 0, "[env TARGET_SELECTOR]"},
		{"bad ip mode", []string{"worker", "--bmc-ip-mode", "nodeport"}, nil, 2, "cluster-ip"},
		{"bad log level", []string{"worker", "--log-level", "loud", "--kubeconfig", "/nonexistent"}, nil, 2, "log-level"},
		{"bad namespace", []string{"worker", "--namespace", "Bad_NS"}, nil, 2, "matbus worker: --namespace \"Bad_NS\" is not a DNS label: "},
		{"bad namespace from the environment", []string{"worker"}, map[string]string{"NAMESPACE": "Bad_NS"}, 2, "matbus worker: --namespace \"Bad_NS\" is not a DNS label: "},
		{"discovery bad namespace", []string{"discovery", "--namespace", "Bad_NS", "--static", "a=https://x:1", "--leader-elect=false", "--health-addr", ""}, nil, 2, "matbus discovery: --namespace \"Bad_NS\" is not a DNS label: "},
		{"stray argument", []string{"worker", "oops"}, nil, 2, "unexpected argument"},
		{"zero jobs", []string{"worker", "--jobs", "0"}, nil, 2, "positive"},
		{"empty target selector", []string{"worker", "--target-selector", ""}, nil, 2, "--target-selector is empty"},
		{"bad cluster domain", []string{"discovery", "--cluster-domain", "bad_domain..", "--static", "a=https://x:1", "--leader-elect=false", "--health-addr", ""}, nil, 2, "--cluster-domain"},
		{"empty cluster domain", []string{"discovery", "--cluster-domain", "", "--static", "a=https://x:1", "--leader-elect=false", "--health-addr", ""}, nil, 2, "--cluster-domain"},
		{"bad prefix", []string{"errors", "--subject-prefix", "a..b", "--since", "1h"}, nil, 2, "prefix"},
		{"unknown error kind", []string{"errors", "--kind", "boom"}, nil, 2, "not an error kind"},
		{"profiling without health addr", []string{"worker", "--profiling", "--health-addr", ""}, nil, 2, "--profiling serves on --health-addr"},
		{"discovery profiling without health addr", []string{"discovery", "--profiling", "--health-addr", "", "--static", "a=https://h:1", "--leader-elect=false"}, nil, 2, "--profiling serves on --health-addr"},
		{"empty static list", []string{"discovery", "--static", ",", "--static-name", "x", "--leader-elect=false", "--health-addr", ""}, nil, 2, "has no instances"},
		{"bad static url", []string{"discovery", "--static", "a=ftp://x", "--leader-elect=false", "--health-addr", ""}, nil, 2, "scheme"},
		{"static with election but no cluster", []string{"discovery", "--static", "a=https://x:1", "--health-addr", ""}, nil, 2, "leader-elect=false"},
		{"static file missing", []string{"discovery", "--static-file", "/nonexistent/instances.yaml", "--leader-elect=false", "--health-addr", ""}, nil, 1, "--static-file /nonexistent/instances.yaml"},
		{"static with election, kubeconfig missing", []string{"discovery", "--static", "a=https://x:1", "--health-addr", "", "--kubeconfig", "/nonexistent/kubeconfig"}, nil, 1, "/nonexistent/kubeconfig"},
		{"bad env value", []string{"matsim"}, map[string]string{"MATBUS_HOSTS": "many"}, 2, "MATBUS_HOSTS"},
		{"bad managed-by", []string{"worker", "--managed-by", "bad value!"}, nil, 2, "managed-by"},
		{"http nats url", []string{"worker", "--nats-url", "http://127.0.0.1:4222"}, nil, 2, "nats://"},
		{"sync interval too short", []string{"discovery", "--sync-interval", "1ns", "--static", "a=https://x:1"}, nil, 2, "at least 1s"},
		{"poll max below poll", []string{"discovery", "--poll-interval", "2s", "--poll-max-interval", "1s", "--static", "a=https://x:1"}, nil, 2, "--poll-max-interval 1s must be at least --poll-interval (2s)"},
		{"poll max above sync", []string{"discovery", "--sync-interval", "10s", "--poll-max-interval", "20s", "--static", "a=https://x:1"}, nil, 2, "at most --sync-interval (10s)"},
		{"poll max from env below poll", []string{"discovery", "--poll-interval", "2s", "--static", "a=https://x:1"}, map[string]string{"MATBUS_POLL_MAX_INTERVAL": "1s"}, 2, "--poll-max-interval"},
		{"dev poll max above sync", []string{"dev", "--sync-interval", "5s", "--poll-max-interval", "6s"}, nil, 2, "--poll-max-interval"},
		{"nats port out of range", []string{"dev", "--nats-port", "70000"}, nil, 2, "0..65535"},
		{"dev refuses --nats-url", []string{"dev", "--nats-url", "nats://127.0.0.1:4222"}, nil, 2, "--nats-url is not a dev flag: dev runs its own embedded NATS server"},
		{"dev refuses --nats-creds", []string{"dev", "--nats-creds=/x.creds"}, nil, 2, "--nats-creds is not a dev flag"},
		{"dev refuses --stream-replicas", []string{"dev", "-stream-replicas", "3"}, nil, 2, "--stream-replicas is not a dev flag"},
		{"dev keeps its prefix flag", []string{"dev", "--subject-prefix", "bad prefix"}, nil, 2, "--subject-prefix"},
		{"version", []string{"version"}, nil, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runArgs(t, c.env, c.args...)
			if code != c.code || !strings.Contains(out+errOut, c.want) {
				t.Fatalf("exit %d (want %d), output:\n%s%s", code, c.code, out, errOut)
			}
		})
	}
}

// TestDevOnce runs `matbus dev --once` end to end on real parts: embedded
// NATS, a local etcd + kube-apiserver, two HTTPS simulators, discovery and
// workers; it must converge and report every BMC's Service and no errors.
func TestDevOnce(t *testing.T) {
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	code, out, errOut := runArgs(t, map[string]string{"KUBECONFIG": ""}, "dev", "--once", "-v", "--nats-port", "0", "--hosts", "3",
		"--dpus-per-host", "2", "--timeout", "2m", "--log-level", "warn")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var s devenv.Summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	// 2 simulators × (3 hosts + 6 DPUs + 1 switch + 1 power shelf) BMCs,
	// and 2 × 1 switch NVOS.
	if code != 0 || !s.Converged || s.Services != 24 || s.Expected != 24 || s.Errors != 0 {
		t.Fatalf("exit %d, summary %+v\nstdout:\n%s\nstderr:\n%s", code, s, out, errOut)
	}
	if !strings.Contains(out, "Sources API              http://127.0.0.1:") {
		t.Errorf("no sources API line:\n%s", out)
	}
	if !strings.Contains(out, "All 24 Services in place after ") {
		t.Errorf("no line saying every Service is in place:\n%s", out)
	}
	if strings.Count(out, "+ service mat-bmc-") != 22 || strings.Count(out, "+ service mat-nvos-") != 2 {
		t.Fatalf("expected 22 BMC and 2 NVOS created-Service lines:\n%s", out)
	}
}

// TestBadStaticListConnectsNothing: a static list that does not parse or
// names no instance is a usage error before discovery connects to NATS.
func TestBadStaticListConnectsNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	for _, static := range []string{",", "a=ftp://x", "=https://x:1"} {
		code, _, stderr := runArgs(t, nil, "discovery", "--static", static, "--leader-elect=false", "--health-addr", "",
			"--source-list-addr", "", "--nats-url", "nats://"+l.Addr().String())
		if code != 2 {
			t.Errorf("--static %q: exit %d, want 2; stderr:\n%s", static, code, stderr)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("discovery with a bad static list opened %d connections to NATS", n)
	}
}
