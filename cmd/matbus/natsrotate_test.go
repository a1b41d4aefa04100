package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/matbus/matbus/internal/natsconn"
	"github.com/matbus/matbus/internal/testenv"
)

// restartableNATS is an embedded NATS server that a test stops and starts
// again on the same port with other options (a new certificate, other
// accounts), so that a client must reconnect with what its files hold.
type restartableNATS struct {
	t    *testing.T
	port int
	srv  *server.Server
}

func newRestartableNATS(t *testing.T) *restartableNATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &restartableNATS{t: t, port: port}
	t.Cleanup(r.stop)
	return r
}

// start (re)starts the server with opts (its address is set here).
func (r *restartableNATS) start(opts *server.Options) {
	r.t.Helper()
	r.stop()
	opts.Host, opts.Port, opts.NoSigs, opts.NoLog = "127.0.0.1", r.port, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		r.t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		r.t.Fatal("NATS not ready")
	}
	r.srv = s
}

func (r *restartableNATS) stop() {
	if r.srv != nil {
		r.srv.Shutdown()
		r.srv.WaitForShutdown()
		r.srv = nil
	}
}

// waitReconnected waits until nc has reconnected more than before times
// and is connected.
func waitReconnected(t *testing.T, nc *nats.Conn, before uint64, logs *testenv.Buffer) {
	t.Helper()
	testenv.Wait(t, 30*time.Second, "the client to reconnect", func() (bool, string) {
		return nc.Stats().Reconnects > before && nc.IsConnected(), nc.Status().String() + "; log:\n" + logs.Tail(10)
	})
}

// TestNATSTLSFilesRotate: --nats-tls-ca, --nats-tls-cert and --nats-tls-key
// in a kubelet-style volume under a running connection. At a reconnect
// while the CA file is missing and the certificate half-written, the last
// good files are used (one warning each, no contents logged). After the
// volume swaps to a new CA and a client certificate from it, the next
// connection (to a server that serves a certificate of the new CA and
// takes client certificates of the new CA only) uses the new files: no
// restart.
func TestNATSTLSFilesRotate(t *testing.T) {
	ca1, ca2 := testenv.NewCA(t, "nats CA 1"), testenv.NewCA(t, "nats CA 2")
	c1, k1 := ca1.KeyPairPEM(ca1.IssueClient("matbus-1"))
	c2, k2 := ca2.KeyPairPEM(ca2.IssueClient("matbus-2"))
	vol := testenv.NewVolume(t, map[string][]byte{"ca.crt": ca1.PEM, "tls.crt": c1, "tls.key": k1})
	opts := func(ca *testenv.CA) *server.Options {
		cert := ca.IssueIP("127.0.0.1", "localhost")
		return &server.Options{TLS: true, TLSVerify: true, TLSTimeout: 5, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}}
	}
	ns := newRestartableNATS(t)
	ns.start(opts(ca1))

	n := natsOpts{Config: natsconn.Config{URL: "tls://127.0.0.1:" + strconv.Itoa(ns.port), TLSCA: vol.Path("ca.crt"), TLSCert: vol.Path("tls.crt"), TLSKey: vol.Path("tls.key")}}
	var logs testenv.Buffer
	nc, err := n.connect("rotate-test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testenv.Wait(t, 10*time.Second, "connected", func() (bool, string) { return nc.IsConnected(), logs.Tail(5) })

	// Bad files at a reconnect: the last good ones are used.
	vol.Unlink("ca.crt")
	vol.WriteInPlace("tls.crt", c1[:len(c1)/2])
	before := nc.Stats().Reconnects
	ns.start(opts(ca1))
	waitReconnected(t, nc, before, &logs)
	for _, flag := range []string{"--nats-tls-ca", "--nats-tls-cert"} {
		if n := strings.Count(logs.String(), "level=WARN msg=\"file not usable, keeping its last good contents (logged once until it changes)\" file=\""+flag); n != 1 {
			t.Errorf("%s: %d warnings, want 1; log:\n%s", flag, n, logs.String())
		}
	}
	if strings.Contains(logs.String(), "PRIVATE KEY") || strings.Contains(logs.String(), string(k1[40:60])) {
		t.Errorf("a key's contents are in the log:\n%s", logs.String())
	}

	// Rotation: a new CA and a client certificate from it.
	vol.Update(map[string][]byte{"ca.crt": ca2.PEM, "tls.crt": c2, "tls.key": k2})
	before = nc.Stats().Reconnects
	ns.start(opts(ca2))
	waitReconnected(t, nc, before, &logs)
	st, err := nc.TLSConnectionState()
	if err != nil {
		t.Fatal(err)
	}
	if got := st.PeerCertificates[0].Issuer.CommonName; got != "nats CA 2" {
		t.Errorf("server certificate issued by %q, want nats CA 2", got)
	}
	cz, err := ns.srv.Connz(&server.ConnzOptions{Username: true})
	if err != nil || len(cz.Conns) != 1 {
		t.Fatalf("connz: %v %+v", err, cz)
	}
	if c := cz.Conns[0]; len(c.TLSPeerCerts) == 0 || !strings.Contains(c.TLSPeerCerts[0].Subject, "matbus-2") {
		t.Errorf("the client presented %+v, want the certificate of matbus-2", c.TLSPeerCerts)
	}
}

// credsUser makes a user of the account (signed by akp) and returns its
// .creds file.
func credsUser(t *testing.T, akp nkeys.KeyPair) []byte {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// TestNATSCredsRotate: a --nats-creds file in a kubelet-style volume under a
// running connection to a server in operator (JWT) mode. A reconnect while
// the file is half-written uses the last good credentials (one warning, no
// contents logged). After the volume swaps to a user of another account,
// the next connection, to a server that knows only that account, uses the
// new credentials: no restart.
func TestNATSCredsRotate(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	if oc, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		t.Fatal(err)
	}
	account := func(name string) (nkeys.KeyPair, string, string) {
		akp, _ := nkeys.CreateAccount()
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		ajwt, err := ac.Encode(okp)
		if err != nil {
			t.Fatal(err)
		}
		return akp, apub, ajwt
	}
	akpA, pubA, jwtA := account("A")
	akpB, pubB, jwtB := account("B")
	credsA, credsB := credsUser(t, akpA), credsUser(t, akpB)
	opts := func(pub, ajwt string) *server.Options {
		r := &server.MemAccResolver{}
		if err := r.Store(pub, ajwt); err != nil {
			t.Fatal(err)
		}
		return &server.Options{TrustedOperators: []*jwt.OperatorClaims{oc}, AccountResolver: r}
	}
	vol := testenv.NewVolume(t, map[string][]byte{"nats.creds": credsA})
	ns := newRestartableNATS(t)
	ns.start(opts(pubA, jwtA))

	n := natsOpts{Config: natsconn.Config{URL: "nats://127.0.0.1:" + strconv.Itoa(ns.port), Creds: vol.Path("nats.creds")}}
	var logs testenv.Buffer
	nc, err := n.connect("rotate-test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testenv.Wait(t, 10*time.Second, "connected", func() (bool, string) { return nc.IsConnected(), fmt.Sprint(nc.LastError()) + logs.Tail(5) })

	vol.WriteInPlace("nats.creds", credsA[:len(credsA)*3/4])
	before := nc.Stats().Reconnects
	ns.start(opts(pubA, jwtA))
	waitReconnected(t, nc, before, &logs)
	if n := strings.Count(logs.String(), "level=WARN msg=\"file not usable"); n != 1 || !strings.Contains(logs.String(), "--nats-creds") {
		t.Errorf("%d warnings, want 1 naming --nats-creds; log:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "SU") && strings.Contains(logs.String(), string(credsA[len(credsA)-80:len(credsA)-60])) {
		t.Errorf("the credentials are in the log:\n%s", logs.String())
	}

	vol.Update(map[string][]byte{"nats.creds": credsB})
	before = nc.Stats().Reconnects
	ns.start(opts(pubB, jwtB))
	waitReconnected(t, nc, before, &logs)
	cz, err := ns.srv.Connz(&server.ConnzOptions{Username: true})
	if err != nil || len(cz.Conns) != 1 {
		t.Fatalf("connz: %v %+v, want one connection", err, cz)
	}
	if got := cz.Conns[0].Account; got != pubB {
		t.Errorf("connected in account %s, want B (%s)", got, pubB)
	}
}
