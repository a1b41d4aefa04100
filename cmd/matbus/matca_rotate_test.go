package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/internal/natsserver"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
)

// connProxy forwards TCP connections to a backend and can end them all at
// once: what a MAT pod restarted with a re-issued certificate does to its
// clients' connections, without the restart's downtime.
type connProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	conns   []net.Conn
}

func newConnProxy(t *testing.T, backend string) *connProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connProxy{ln: ln, backend: backend}
	t.Cleanup(func() { ln.Close(); p.closeAll() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

func (p *connProxy) port() string {
	_, port, _ := net.SplitHostPort(p.ln.Addr().String())
	return port
}

func (p *connProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// TestMATCARotationProcesses runs `matbus discovery` and `matbus worker`
// processes with default flags and --mat-ca-file in a kubelet-style volume,
// against a real API server, NATS and a MAT simulator that serves the
// certificate files of another volume. Nothing is restarted.
//
// CA first (cert-manager's order: the issuer's new CA reaches the bundle,
// then MAT's certificate is re-issued from it and MAT's connections end):
// the next fetch succeeds. Certificate first, the bundle ten seconds later
// (a mount that kubelet updates late): fetches are refused, the instance
// goes out of rotation, and once the bundle swaps the worker sees the
// change within a second and asks discovery for an early probe, which
// succeeds without waiting for the probe backoff. The test logs both
// times (the closing numbers of the rotation work):
//
//	go test ./cmd/matbus -run TestMATCARotationProcesses -v -count=1
func TestMATCARotationProcesses(t *testing.T) {
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := buildMatbus(t)
	cl, err := kubelocal.Start(ctx, kubelocal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	kube, err := kubernetes.NewForConfig(cl.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.Namespace("rot", t.Name())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nats, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nats.Shutdown()

	ca1, ca2, ca3 := testenv.NewCA(t, "MAT CA 1"), testenv.NewCA(t, "MAT CA 2"), testenv.NewCA(t, "MAT CA 3")
	c1, k1 := ca1.KeyPairPEM(ca1.Issue("localhost"))
	matFiles := testenv.NewVolume(t, map[string][]byte{"tls.crt": c1, "tls.key": k1})
	bundle := testenv.NewVolume(t, map[string][]byte{"ca.crt": ca1.PEM})
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 3, DPUsPerHost: 1, Seed: 41})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := matsim.New(matsim.Options{Fleet: fleet, TLSCertFile: matFiles.Path("tls.crt"), TLSKeyFile: matFiles.Path("tls.key")})
	if err != nil {
		t.Fatal(err)
	}
	simURL, err := sim.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	proxy := newConnProxy(t, strings.TrimPrefix(simURL, "https://"))

	vars := map[string]string{"MATBUS_NATS_URL": nats.ClientURL(), "KUBECONFIG": cl.Kubeconfig, "NAMESPACE": ns}
	disc := startProc(t, bin, "discovery", vars, "discovery", "--static", ns+"/mat-rot=https://localhost:"+proxy.port(),
		"--leader-elect=false", "--health-addr", "", "--source-list-addr", "")
	wk := startProc(t, bin, "worker", vars, "worker", "--health-addr", "", "--mat-ca-file", bundle.Path("ca.crt"))
	procs := []*proc{disc, wk}
	services := func() int {
		l, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return -1
		}
		return len(l.Items)
	}
	waitFor(t, 2*time.Minute, "every BMC Service", func() bool { return services() == sim.BMCs() }, procs...)

	// firstFetchAfter waits for the first status request that reaches MAT
	// (a verified TLS connection) after the requests counted so far, and
	// returns when it came.
	firstFetchAfter := func(what string) time.Time {
		t.Helper()
		n := sim.Requests()
		deadline := time.Now().Add(3 * time.Minute)
		for sim.Requests() == n {
			if time.Now().After(deadline) {
				t.Fatalf("no fetch reached MAT %s\n--- worker:\n%s\n--- discovery:\n%s", what, tail(wk.out.String(), 30), tail(disc.out.String(), 30))
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Now()
	}

	// CA first.
	bundle.Update(map[string][]byte{"ca.crt": append(append([]byte{}, ca1.PEM...), ca2.PEM...)})
	time.Sleep(2 * time.Second) // the bundle reaches the pod before the certificate is re-issued
	c2, k2 := ca2.KeyPairPEM(ca2.Issue("localhost"))
	matFiles.Update(map[string][]byte{"tls.crt": c2, "tls.key": k2})
	reissued := time.Now()
	proxy.closeAll()
	caFirst := firstFetchAfter("after the re-issue (CA first)").Sub(reissued)
	if lines := linesWith(wk.out.String(), "unknown authority"); len(lines) != 0 {
		t.Errorf("CA first: refused fetches %q, want none", lines)
	}

	// Certificate first; the bundle ten seconds later.
	c3, k3 := ca3.KeyPairPEM(ca3.Issue("localhost"))
	matFiles.Update(map[string][]byte{"tls.crt": c3, "tls.key": k3})
	reissued = time.Now()
	proxy.closeAll()
	waitFor(t, time.Minute, "the instance out of rotation", func() bool {
		return len(linesWith(disc.out.String(), "instance taken out of rotation", "unknown authority")) > 0
	}, procs...)
	time.Sleep(time.Until(reissued.Add(10 * time.Second)))
	bundle.Update(map[string][]byte{"ca.crt": append(append(append([]byte{}, ca1.PEM...), ca2.PEM...), ca3.PEM...)})
	swapped := time.Now()
	certFirst := firstFetchAfter("after the bundle swap (certificate first)").Sub(swapped)
	waitFor(t, time.Minute, "back in rotation", func() bool {
		return len(linesWith(disc.out.String(), "instance back in rotation")) > 0
	}, procs...)
	if len(linesWith(disc.out.String(), "probing a failing instance at once")) == 0 {
		t.Errorf("discovery did not probe early on the worker's hint:\n%s", tail(disc.out.String(), 30))
	}
	if n := services(); n != sim.BMCs() {
		t.Errorf("%d Services after the rotations, want %d (none deleted)", n, sim.BMCs())
	}
	t.Logf("CA first: first successful fetch %v after MAT's certificate was re-issued", caFirst.Round(time.Millisecond))
	t.Logf("certificate first: first successful fetch %v after the bundle swap (%v after the re-issue)", certFirst.Round(time.Millisecond), swapped.Add(certFirst).Sub(reissued).Round(time.Millisecond))
}
