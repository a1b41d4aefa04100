package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key := newKey(t)
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key signed by ca: for the server on
// 127.0.0.1 when server is true, else for a client.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// tlsNATS starts an embedded JetStream server that speaks TLS only and
// requires a client certificate signed by ca; it returns its tls:// URL.
func tlsNATS(t *testing.T, ca *testCA) string {
	t.Helper()
	certPEM, keyPEM := ca.issue(t, "nats-server", true)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true, ServerName: "matbus-tls",
		TLS: true, TLSVerify: true, TLSTimeout: 5,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { stopNATS(s) })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("TLS NATS not ready")
	}
	return "tls://127.0.0.1:" + strconv.Itoa(s.Addr().(*net.TCPAddr).Port)
}

// TestNATSTLS runs matbus against a nats-server that takes TLS only and
// verifies client certificates, with certificates made here: discovery
// (a process of the built binary) creates the streams and publishes its
// instance over TLS, and `matbus errors` reads over TLS; without the
// client certificate, with the wrong CA or with a plain nats:// URL the
// connection is refused and `matbus check` says why; the key's contents
// never reach a log.
func TestNATSTLS(t *testing.T) {
	ca := newCA(t, "matbus-test-ca")
	url := tlsNATS(t, ca)
	dir := t.TempDir()
	file := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM, keyPEM := ca.issue(t, "matbus", false)
	caFile, certFile, keyFile := file("ca.pem", ca.pem), file("client.pem", certPEM), file("client-key.pem", keyPEM)
	otherCA := file("other-ca.pem", newCA(t, "someone-else").pem)
	tlsArgs := []string{"--nats-url", url, "--nats-tls-ca", caFile, "--nats-tls-cert", certFile, "--nats-tls-key", keyFile}

	// The test's own client, with the same files.
	nc, err := nats.Connect(url, nats.RootCAs(caFile), nats.ClientCert(certFile, keyFile))
	if err != nil {
		t.Fatalf("test client over TLS: %v", err)
	}
	defer nc.Close()
	bus, err := events.New(nc, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}

	disc := startProc(t, buildMatbus(t), "discovery", nil, append([]string{"discovery",
		"--static", "tls-ns/mat-a=http://127.0.0.1:1", "--leader-elect=false", "--health-addr", "",
		"--namespace", "tls-ns", "--source-list-addr", "", "--stream-replicas", "1", "--log-level", "debug"}, tlsArgs...)...)
	waitFor(t, time.Minute, "instance published over TLS", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rec, found, err := bus.LastInstance(ctx, "tls-ns.mat-a")
		return err == nil && found && rec.Present()
	}, disc)
	if !strings.Contains(disc.out.String(), "NATS connected") {
		t.Errorf("discovery did not log its connection:\n%s", tail(disc.out.String(), 20))
	}

	code, _, errOut := runArgs(t, nil, append([]string{"errors", "--follow=false", "--since", "1h"}, tlsArgs...)...)
	if code != 0 {
		t.Errorf("matbus errors over TLS: exit %d, stderr:\n%s", code, errOut)
	}

	// `matbus check` connects once and reports the NATS row.
	natsRow := func(args ...string) string {
		t.Helper()
		_, out, _ := runArgs(t, nil, append([]string{"check", "--kubeconfig", filepath.Join(dir, "none"), "--timeout", "10s"}, args...)...)
		_, line := checkRowResult(out, "NATS")
		return line
	}
	if line := natsRow(tlsArgs...); !strings.Contains(line, "JetStream enabled") {
		t.Errorf("check with the right files: %q, want JetStream enabled", line)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no client certificate", []string{"--nats-url", url, "--nats-tls-ca", caFile}, "FAIL"},
		{"wrong CA", []string{"--nats-url", url, "--nats-tls-ca", otherCA, "--nats-tls-cert", certFile, "--nats-tls-key", keyFile}, "certificate signed by unknown authority"},
		{"plain URL and no TLS", []string{"--nats-url", strings.Replace(url, "tls://", "nats://", 1)}, "FAIL"},
	} {
		if line := natsRow(c.args...); !strings.Contains(line, c.want) || strings.Contains(line, "JetStream enabled") {
			t.Errorf("%s: NATS row %q, want a failure containing %q", c.name, line, c.want)
		}
	}

	// Bad files: one clear error naming the flag and the file.
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--nats-tls-cert", certFile}, 2, "--nats-tls-cert and --nats-tls-key go together"},
		{[]string{"--nats-tls-key", keyFile}, 2, "--nats-tls-cert and --nats-tls-key go together"},
		{[]string{"--nats-tls-ca", missing}, 1, "--nats-tls-ca: CA file is not readable: open " + missing},
		{[]string{"--nats-tls-ca", keyFile}, 1, "--nats-tls-ca " + keyFile + ": no PEM certificate in the file"},
		{[]string{"--nats-tls-cert", certFile, "--nats-tls-key", caFile}, 1, "--nats-tls-cert " + certFile + " and --nats-tls-key " + caFile + " are not a usable certificate and key"},
	} {
		args := append([]string{"discovery", "--static", "tls-ns/mat-a=http://127.0.0.1:1", "--namespace", "tls-ns", "--leader-elect=false",
			"--health-addr", "", "--source-list-addr", "", "--nats-url", url}, c.args...)
		code, _, errOut := runArgs(t, nil, args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}

	disc.halt(t)
	body := strings.Join(strings.Split(strings.TrimSpace(string(keyPEM)), "\n")[1:3], "\n")
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(disc.out.String(), line) {
			t.Errorf("the client key's contents are in discovery's log")
		}
	}
	// The streams were made over TLS with the replicas asked for.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, bus.StreamName(events.StreamInstances))
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 1 {
		t.Errorf("instances stream: %d replicas, want 1", r)
	}
}
