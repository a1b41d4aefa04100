package worker_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/reload"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
)

// rotatingMAT is a MAT simulator that serves the certificate files of a
// kubelet-style volume (tls.crt, tls.key, as a cert-manager Secret), and a
// dial hook for the worker that reaches it under a DNS name and keeps the
// connections, so that a re-issue can end them as a MAT pod restarted
// with its new certificate would (without the restart's downtime).
type rotatingMAT struct {
	e   *env
	vol *testenv.Volume
	sim *matsim.Server

	mu    sync.Mutex
	conns []net.Conn
}

func (e *env) startRotatingMAT(ca *testenv.CA, host string, fleet *matsim.Fleet) *rotatingMAT {
	e.t.Helper()
	c, k := ca.KeyPairPEM(ca.Issue(host))
	m := &rotatingMAT{e: e, vol: testenv.NewVolume(e.t, map[string][]byte{"tls.crt": c, "tls.key": k})}
	m.sim = e.startSim(matsim.Options{Fleet: fleet, TLSCertFile: m.vol.Path("tls.crt"), TLSKeyFile: m.vol.Path("tls.key")})
	return m
}

// dial connects every address to the simulator.
func (m *rotatingMAT) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, hostOf(m.e.t, m.sim.URL()))
	if err == nil {
		m.mu.Lock()
		m.conns = append(m.conns, c)
		m.mu.Unlock()
	}
	return c, err
}

// reissue swaps the certificate files for one of ca for host and ends the
// connections made so far: the next request is a new handshake.
func (m *rotatingMAT) reissue(ca *testenv.CA, host string) {
	m.e.t.Helper()
	c, k := ca.KeyPairPEM(ca.Issue(host))
	m.vol.Update(map[string][]byte{"tls.crt": c, "tls.key": k})
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conns {
		_ = c.Close()
	}
	m.conns = nil
}

// removeOne removes the fleet's first power shelf and returns
// the Service names the fleet wants then.
func (m *rotatingMAT) removeOne() []string {
	m.e.t.Helper()
	st := m.sim.Fleet().Status("", 1)
	var id string
	st.Walk(func(d, parent *matclient.Device) {
		if id == "" && parent == nil && d.BMC.IP != "" && d.Kind == matclient.KindPowerShelf {
			id = d.MatID
		}
	})
	if err := m.sim.RemoveDevice(id); err != nil {
		m.e.t.Fatal(err)
	}
	return wantServiceNames(m.sim.Fleet())
}

// TestMATCARotationWithoutRestart: a worker's MAT trust follows the CA
// bundle file (--mat-ca-file, here a kubelet-style volume swapped as
// kubelet updates a mounted Secret), with the worker, its cached client and
// discovery running throughout.
//
// CA first (cert-manager's order): the bundle gains a new CA, then MAT's
// certificate is re-issued from it and MAT's connections end: no fetch fails, and a
// device removed afterwards loses its Service.
//
// Certificate first: MAT serves a certificate of a third CA before
// the bundle has it. Fetches fail as an unknown authority (permanent), the
// instance goes out of rotation and no Service changes. Once the bundle
// holds the third CA, the worker asks for an early probe (RetryRefused),
// which succeeds: a resolved event, and the
// device removed meanwhile loses its Service; the other Services keep
// their UIDs. The bundle caught half-written on the way keeps the last
// good CAs, with one warning.
func TestMATCARotationWithoutRestart(t *testing.T) {
	e := newEnv(t)
	ca1, ca2, ca3 := testenv.NewCA(t, "MAT CA 1 "+e.ns), testenv.NewCA(t, "MAT CA 2 "+e.ns), testenv.NewCA(t, "MAT CA 3 "+e.ns)
	const host = "mat-rot-bmc-mock.mat.svc.cluster.local"
	bundle := testenv.NewVolume(t, map[string][]byte{"ca.crt": ca1.PEM})
	roots, err := reload.NewRoots(reload.RootsConfig{Path: bundle.Path("ca.crt"), Name: "--mat-ca-file", System: true, Log: e.log.With("part", "roots")})
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, Switches: 1, PowerShelves: 2, BMCSubnet: "10.96.140.0/24", Seed: 31})
	if err != nil {
		t.Fatal(err)
	}
	mat := e.startRotatingMAT(ca1, host, fleet)
	url := "https://" + host + ":1266"
	src, err := discovery.NewStatic("test", []discovery.StaticEntry{e.entry("mat-rot", url)})
	if err != nil {
		t.Fatal(err)
	}
	e.startPublisherWith(src, discovery.PublisherConfig{SyncInterval: syncInterval,
		Scheduler: discovery.SchedulerConfig{PollInterval: 200 * time.Millisecond, SyncInterval: syncInterval, ProbeMaxInterval: 2 * time.Second}})
	w := e.startWorker(workerOpts{Mat: matclient.Config{VerifyPeer: roots.Verify,
		DialContext: mat.dial}})
	key := e.key("mat-rot")
	first := e.waitServices(wantServiceNames(mat.sim.Fleet())...)
	fetchErrors := func() []events.Error {
		var out []events.Error
		for _, x := range e.errs.Of(errKind("fetch")) {
			if x.Instance == key {
				out = append(out, x)
			}
		}
		return out
	}
	if n := len(fetchErrors()); n != 0 {
		t.Fatalf("%d fetch errors before any rotation: %v", n, fetchErrors())
	}

	// CA first. A poll in flight when reissue ends MAT's connections fails
	// as one cut by a MAT restart would, which is no certificate problem
	// (the next poll succeeds); any other fetch error fails the test.
	bundle.Update(map[string][]byte{"ca.crt": append(append([]byte{}, ca1.PEM...), ca2.PEM...)})
	mat.reissue(ca2, host)
	e.waitServices(mat.removeOne()...)
	var bad []events.Error
	for _, x := range fetchErrors() {
		if !x.Resolved && !connectionEnded(x.Message) {
			bad = append(bad, x)
		}
	}
	if len(bad) != 0 {
		t.Fatalf("CA added before the certificate: fetch errors %v, want none but ended connections", bad)
	}

	// Certificate first.
	mat.reissue(ca3, host)
	var refused events.Error
	waitFor(t, "the instance out of rotation", func() (bool, string) {
		for _, x := range fetchErrors() {
			if strings.Contains(x.Message, "out of rotation") {
				refused = x
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	if !refused.Permanent || !strings.Contains(refused.Message, "certificate signed by unknown authority") {
		t.Errorf("out of rotation: %+v, want a permanent unknown authority", refused)
	}
	want := mat.removeOne() // not seen while out of rotation
	bundle.WriteInPlace("ca.crt", ca3.PEM[:len(ca3.PEM)/2])
	roots.Reload()
	time.Sleep(time.Second)
	if n := len(e.services()); n != len(want)+1 {
		t.Fatalf("%d Services while the certificate is refused, want %d (nothing changed)", n, len(want)+1)
	}
	bundle.Update(map[string][]byte{"ca.crt": append(append(append([]byte{}, ca1.PEM...), ca2.PEM...), ca3.PEM...)})
	if !roots.Reload() {
		t.Fatal("the swapped bundle was not taken")
	}
	// What the worker command does on the change: ask for an early probe
	// of the instances whose certificate it refused.
	if n := w.RetryRefused(e.ctx); n != 1 {
		t.Errorf("RetryRefused asked for %d early probes, want 1 (the refused instance)", n)
	}
	waitFor(t, "a resolved fetch event", func() (bool, string) {
		for _, x := range fetchErrors() {
			if x.Resolved {
				return true, ""
			}
		}
		return false, e.errs.String()
	})
	last := e.waitServices(want...)
	for name, s := range last {
		if first[name] != nil && first[name].UID != s.UID {
			t.Errorf("Service %s re-created across the rotations", name)
		}
	}
	if n := strings.Count(e.logs.String(), "file not usable, keeping its last good contents"); n != 1 {
		t.Errorf("%d warnings about the half-written bundle, want 1", n)
	}
	if c := w.clients.For(url); len(c) != 1 {
		t.Errorf("%d clients for %s, want 1: the cached client verifies with the new bundle", len(c), url)
	}
}

// connectionEnded reports whether a fetch error is a connection ended
// under the request (the test's reissue closes MAT's connections), not a
// refused certificate.
func connectionEnded(msg string) bool {
	if strings.Contains(msg, "certificate") || strings.Contains(msg, "x509") {
		return false
	}
	for _, s := range []string{"use of closed network connection", "connection reset by peer", "broken pipe", "EOF"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
