package main

import (
	"context"
	"encoding/json"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/operator"
)

// TestStatus runs discovery and a worker in this process on a real NATS
// and kube-apiserver against three simulated MAT instances: healthy
// (always answers), failing (always 500) and recovering (500 until it is
// out of rotation, then answers). `matbus status -o json` then shows the
// healthy and the recovered instance in rotation with all their Services,
// synced by the worker, the failing one out of rotation with its probe
// interval, no Services and a fetch error; all three published by the
// sources API; the summary counts them, names the consumers and the
// leader. The text form has one row per instance and the summary line.
func TestStatus(t *testing.T) {
	c := checkCluster(t)
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sims := map[string]*matsim.Server{}
	var static []string
	for i, name := range []string{"healthy", "failing", "recovering"} {
		fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 1, PowerShelves: 1,
			BMCSubnet: []string{"192.168.50.0/24", "192.168.51.0/24", "192.168.52.0/24"}[i], Seed: int64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		sim, err := matsim.New(matsim.Options{Fleet: fleet})
		if err != nil {
			t.Fatal(err)
		}
		url, err := sim.Start(ctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sim.Close() })
		if name != "healthy" {
			sim.SetFault(matsim.Fault500)
		}
		sims[name] = sim
		static = append(static, name+"="+url)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sourcesAddr := ln.Addr().String()
	ln.Close()

	// Discovery and the worker run as processes (in this one they would
	// share client-go's global klog logger with status).
	bin := buildMatbus(t)
	disc := startProc(t, bin, "discovery", nil, "discovery", "--nats-url", ns.ClientURL(), "--namespace", "default", "--identity", "disc-1",
		"--static", strings.Join(static, ","), "--leader-elect=false", "--poll-interval", "200ms", "--poll-max-interval", "600ms", "--sync-interval", "2s",
		"--probe-max-interval", "1s", "--health-addr", "", "--source-list-addr", sourcesAddr, "--source-list-debounce", "0s",
		"--log-level", "warn")
	work := startProc(t, bin, "worker", nil, "worker", "--nats-url", ns.ClientURL(), "--namespace", "default", "--kubeconfig", c.Kubeconfig,
		"--worker-name", "w1", "--bmc-ip-mode", "external-ip", "--health-addr", "", "--mat-timeout", "2s", "--log-level", "warn")

	// status is the answer of `status -o json`, nil (and the output) on
	// exit 1 (before discovery made the streams).
	status := func() (*operator.Status, string) {
		t.Helper()
		code, out, errOut := runArgs(t, nil, "status", "-o", "json", "--nats-url", ns.ClientURL(), "--namespace", "default",
			"--kubeconfig", c.Kubeconfig, "--sources-url", "http://"+sourcesAddr, "--log-level", "error", "--timeout", "20s")
		if code == 1 {
			return nil, errOut
		}
		var st operator.Status
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
			t.Fatalf("status -o json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		return &st, out
	}
	row := func(st *operator.Status, name string) *operator.StatusRow {
		for i := range st.Rows {
			if st.Rows[i].Instance == "default."+name {
				return &st.Rows[i]
			}
		}
		return nil
	}
	// until polls status until ok holds.
	until := func(what string, ok func(*operator.Status) bool) *operator.Status {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			st, out := status()
			if st != nil && ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached; last status:\n%s\ndiscovery:\n%s\nworker:\n%s", what, out, tail(disc.out.String(), 30), tail(work.out.String(), 30))
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	out := func(st *operator.Status, name string) bool {
		r := row(st, name)
		return r != nil && r.State != nil && !r.State.InRotation
	}
	until("failing and recovering out of rotation", func(st *operator.Status) bool {
		return out(st, "failing") && out(st, "recovering")
	})
	sims["recovering"].SetFault(matsim.FaultNone)
	full := func(st *operator.Status, name string) bool {
		r := row(st, name)
		return r != nil && r.State != nil && r.State.InRotation && r.Services != nil && *r.Services == operator.ServiceCount{BMC: 6, NVOS: 1}
	}
	st := until("healthy and recovering in rotation with their Services", func(st *operator.Status) bool {
		return full(st, "healthy") && full(st, "recovering") && out(st, "failing") && st.Summary.Services == 14
	})

	if len(st.Rows) != 3 || st.Summary.Instances != 3 || st.Namespace != "default" {
		t.Errorf("rows %d, summary %+v, namespace %q; want 3 instances of default", len(st.Rows), st.Summary, st.Namespace)
	}
	for _, name := range []string{"healthy", "recovering"} {
		r := row(st, name)
		s := r.State
		// matsim answers polls 304: the interval lies between
		// --poll-interval and --poll-max-interval.
		if s.PollIntervalMS < 200 || s.PollIntervalMS > 600 || s.ProbeIntervalMS != 0 || s.FailedFetches != 0 || s.Worker != "w1" ||
			s.LastGoodSync.IsZero() || st.Time.Sub(s.LastGoodSync) > 30*time.Second {
			t.Errorf("%s: state %+v; want in rotation, poll 200–600ms, synced by w1 within the last refresh", name, *s)
		}
		if r.Published == nil || !*r.Published || !strings.HasPrefix(r.URL, "http://127.0.0.1:") {
			t.Errorf("%s: published %v, URL %q", name, r.Published, r.URL)
		}
	}
	if r := row(st, "healthy"); r.LastError != nil {
		t.Errorf("healthy: last error %+v, want none", *r.LastError)
	}
	if r := row(st, "recovering"); r.LastError == nil || r.LastError.Kind != "fetch" {
		t.Errorf("recovering: last error %+v, want a fetch error (its recovery)", r.LastError)
	}
	f := row(st, "failing")
	if s := f.State; s.ProbeIntervalMS <= 0 || s.ProbeIntervalMS > 1000 || s.FailedFetches < 3 || !s.LastGoodSync.IsZero() ||
		s.LastOutcome != "fetch-failed" || !strings.Contains(s.LastError, "500") {
		t.Errorf("failing: state %+v; want out of rotation, probed at most every 1s, >= 3 failed fetches, never synced, a 500", *s)
	}
	if f.Services == nil || *f.Services != (operator.ServiceCount{}) || f.LastError == nil || f.LastError.Kind != "fetch" ||
		f.Published == nil || !*f.Published {
		t.Errorf("failing: services %v, last error %+v, published %v; want 0/0, a fetch error, published", f.Services, f.LastError, f.Published)
	}
	if l := st.Summary.Leader; l == nil || l.Identity != "discovery/disc-1" || st.Summary.LeaderStale {
		t.Errorf("leader %+v (stale %v), want discovery/disc-1", l, st.Summary.LeaderStale)
	}
	if cs := st.Summary.Consumers; len(cs) != 2 || cs[0].Name != "matbus-sync-default" || cs[1].Name != "matbus-delete-default" {
		t.Errorf("consumers %+v, want the sync and delete consumers of default", cs)
	}
	if len(st.Summary.Unknown) != 0 {
		t.Errorf("unknown parts: %q", st.Summary.Unknown)
	}

	// The healthy instance's poll interval is stretched while matsim
	// answers 304: anywhere from --poll-interval to --poll-max-interval.
	pollText := regexp.MustCompile(`in \(poll ([2-5][0-9]{2}|600)ms\)`)
	// The text form at the default log level: the report alone, no log
	// line of its connections above it.
	code, text, errOut := runArgs(t, nil, "status", "--nats-url", ns.ClientURL(), "--namespace", "default",
		"--kubeconfig", c.Kubeconfig, "--sources-url", "http://"+sourcesAddr)
	if errOut != "" {
		t.Errorf("status at the default log level wrote to stderr:\n%s", errOut)
	}
	t.Logf("status:\n%s", text)
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if code != 0 || len(lines) != 7 || !strings.HasPrefix(lines[0], "INSTANCE ") ||
		!strings.Contains(lines[1], "default.failing") || !strings.Contains(lines[1], "OUT (probe ") || !strings.Contains(lines[1], "0/0") ||
		!pollText.MatchString(lines[2]) || !strings.Contains(lines[2], "6/1") || !strings.Contains(lines[2], " w1 ") ||
		!strings.HasPrefix(lines[5], "3 instances, 14 Services; matbus-sync-default ") || !strings.Contains(lines[5], "discovery leader discovery/disc-1") ||
		!regexp.MustCompile(`^workers: w1 \(config [0-9a-f]{12}\)$`).MatchString(lines[6]) {
		t.Errorf("status text: exit %d\n%s%s", code, text, errOut)
	}
}
