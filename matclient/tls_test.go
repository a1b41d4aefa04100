package matclient_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/reload"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
)

// The production shape of MAT TLS: a certificate with the Service's DNS
// name only, issued by a cluster CA, served by matsim; the client dials
// the name to the simulator's loopback address and verifies the name.

const (
	goodName  = "mat-0-bmc-mock.golden.svc.cluster.local"
	otherName = "mat-1-bmc-mock.golden.svc.cluster.local"
)

// dnsSim starts matsim serving a certificate for goodName from ca and
// returns its loopback address.
func dnsSim(t *testing.T, ca *testenv.CA) string {
	t.Helper()
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, DPUsPerHost: 1, BMCSubnet: "10.96.64.0/24", Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	cert := ca.Issue(goodName)
	sim, err := matsim.New(matsim.Options{Fleet: fleet, TLSCertificate: &cert})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sim.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	if !strings.HasPrefix(raw, "https://") {
		t.Fatalf("sim URL %s: want https", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func status(t *testing.T, rawURL string, cfg matclient.Config) error {
	t.Helper()
	cfg.Timeout = 5 * time.Second
	c, err := matclient.New(rawURL, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(context.Background())
	if err == nil && len(st.Machines) == 0 {
		t.Fatalf("%s: a status without machines", rawURL)
	}
	return err
}

func TestTLSVerifiesDNSNameWithCAFile(t *testing.T) {
	ca := testenv.NewCA(t, "golden test CA")
	addr := dnsSim(t, ca)
	_, port, _ := net.SplitHostPort(addr)
	good := "https://" + net.JoinHostPort(goodName, port)
	other := "https://" + net.JoinHostPort(otherName, port)
	// Both names lead to the simulator; only goodName is in its certificate.
	dial := testenv.DialRoutes(map[string]string{
		net.JoinHostPort(goodName, port):  addr,
		net.JoinHostPort(otherName, port): addr,
	})
	roots, err := matclient.LoadRootCAs(ca.WriteFile())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("verified with the CA file", func(t *testing.T) {
		if err := status(t, good, matclient.Config{RootCAs: roots, DialContext: dial}); err != nil {
			t.Fatalf("Status: %v", err)
		}
	})

	t.Run("refused without it", func(t *testing.T) {
		err := status(t, good, matclient.Config{DialContext: dial}) // system roots only
		if err == nil {
			t.Fatal("Status verified a certificate of an unknown CA")
		}
		msg := err.Error()
		for _, want := range []string{"GET " + good + "/machines/status", "certificate signed by unknown authority", `issuer "CN=golden test CA"`} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q does not contain %q", msg, want)
			}
		}
		if matclient.IsTransient(err) || !matclient.IsVerificationError(err) {
			t.Errorf("IsTransient(%v) = %v, IsVerificationError = %v: want a permanent verification error", err,
				matclient.IsTransient(err), matclient.IsVerificationError(err))
		}
	})

	t.Run("wrong name refused naming both names", func(t *testing.T) {
		err := status(t, other, matclient.Config{RootCAs: roots, DialContext: dial})
		if err == nil {
			t.Fatal("Status accepted a certificate for another name")
		}
		want := "x509: certificate is valid for " + goodName + ", not " + otherName
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
		if matclient.IsTransient(err) || !matclient.IsVerificationError(err) {
			t.Errorf("IsTransient(%v) = %v, IsVerificationError = %v: want a permanent verification error", err,
				matclient.IsTransient(err), matclient.IsVerificationError(err))
		}
	})

	t.Run("IP URL refused naming the certificate's names", func(t *testing.T) {
		// What the old default (--mat-host-mode cluster-ip) meets.
		err := status(t, "https://"+addr, matclient.Config{RootCAs: roots})
		if err == nil {
			t.Fatal("Status accepted a DNS-only certificate for an IP address")
		}
		for _, want := range []string{"127.0.0.1", "doesn't contain any IP SANs", "(the certificate names " + goodName + ")"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not contain %q", err, want)
			}
		}
	})

	t.Run("plain HTTP is no verification error", func(t *testing.T) {
		err := status(t, "http://"+addr, matclient.Config{})
		if err == nil || matclient.IsVerificationError(err) {
			t.Errorf("plain HTTP to a TLS server: %v, IsVerificationError = %v", err, matclient.IsVerificationError(err))
		}
	})

	t.Run("insecure skips verification", func(t *testing.T) {
		if err := status(t, other, matclient.Config{InsecureSkipVerify: true, DialContext: dial}); err != nil {
			t.Fatalf("Status: %v", err)
		}
	})
}

func TestLoadRootCAsErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, "test CA")
	cert := ca.Issue("x.example")
	_, keyFile := ca.WriteKeyPair(cert)
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "nope.crt"), "no such file"},
		{"empty", write("empty.crt", ""), "no PEM CERTIFICATE block"},
		{"key only", write("key.pem", string(keyPEM)), "no PEM CERTIFICATE block"},
		{"not PEM", write("garbage.crt", "this is not a certificate\n"), "no PEM CERTIFICATE block"},
		{"bad certificate", write("bad.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), "certificate 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := matclient.LoadRootCAs(tc.path)
			if err == nil {
				t.Fatalf("LoadRootCAs(%s) = %v, want an error", tc.path, pool)
			}
			if !errors.Is(err, matclient.ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want the file %s and %q", err, tc.path, tc.want)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), "not a certificate") {
				t.Errorf("error %q quotes the file's contents", err)
			}
		})
	}

	// A bundle: a key block is skipped, every certificate is taken.
	other := testenv.NewCA(t, "other CA")
	bundle := write("bundle.crt", string(keyPEM)+string(ca.PEM)+string(other.PEM))
	pool, err := matclient.LoadRootCAs(bundle)
	if err != nil {
		t.Fatalf("bundle: %v", err)
	}
	for _, c := range []*testenv.CA{ca, other} {
		leaf := c.Issue("y.example").Leaf
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "y.example"}); err != nil {
			t.Errorf("a certificate of a CA in the bundle: %v", err)
		}
	}
}

// TestVerifyPeerTrustsRotatedCA: one Client, kept across a CA rotation
// (as the worker's client cache keeps it). MAT restarts with a certificate
// from a new CA: refused as an unknown authority, permanent. Once the CA
// bundle (a kubelet-style volume, swapped atomically) holds the new CA,
// the same Client's next Status verifies, although the bundle's
// MinInterval is an hour: an unknown authority looks at the file at once.
// Host names are still checked, and InsecureSkipVerify still skips.
func TestVerifyPeerTrustsRotatedCA(t *testing.T) {
	oldCA, newCA := testenv.NewCA(t, "old MAT CA"), testenv.NewCA(t, "new MAT CA")
	bundle := testenv.NewVolume(t, map[string][]byte{"ca.crt": oldCA.PEM})
	roots, err := reload.NewRoots(reload.RootsConfig{Path: bundle.Path("ca.crt"), System: true, MinInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, BMCSubnet: "10.96.65.0/24", Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var sim *matsim.Server
	start := func(ca *testenv.CA) {
		t.Helper()
		if sim != nil {
			if err := sim.Close(); err != nil {
				t.Fatal(err)
			}
		}
		cert := ca.Issue(goodName)
		if sim, err = matsim.New(matsim.Options{Fleet: fleet, TLSCertificate: &cert}); err != nil {
			t.Fatal(err)
		}
		if _, err := sim.Start(context.Background(), addr); err != nil {
			t.Fatal(err)
		}
	}
	start(oldCA)
	t.Cleanup(func() { _ = sim.Close() })
	_, port, _ := net.SplitHostPort(addr)
	dial := testenv.DialRoutes(map[string]string{net.JoinHostPort(goodName, port): addr, net.JoinHostPort(otherName, port): addr})
	c, err := matclient.New("https://"+net.JoinHostPort(goodName, port), matclient.Config{VerifyPeer: roots.Verify, DialContext: dial, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatalf("old CA: %v", err)
	}

	start(newCA) // MAT restarts with a certificate of the new CA
	_, err = c.Status(context.Background())
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") || !strings.Contains(err.Error(), `issuer "CN=new MAT CA"`) {
		t.Fatalf("new CA not in the bundle yet: %v, want an unknown authority naming the issuer", err)
	}
	if matclient.IsTransient(err) || !matclient.IsVerificationError(err) {
		t.Errorf("%v: want a permanent verification error", err)
	}

	bundle.Update(map[string][]byte{"ca.crt": append(append([]byte{}, oldCA.PEM...), newCA.PEM...)})
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatalf("the same client after the bundle swap: %v", err)
	}

	other, err := matclient.New("https://"+net.JoinHostPort(otherName, port), matclient.Config{VerifyPeer: roots.Verify, DialContext: dial, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Status(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate is valid for "+goodName+", not "+otherName) {
		t.Errorf("another host name: %v, want refused naming both names", err)
	}
	insecure, err := matclient.New("https://"+net.JoinHostPort(otherName, port), matclient.Config{VerifyPeer: roots.Verify, InsecureSkipVerify: true, DialContext: dial, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer insecure.Close()
	if _, err := insecure.Status(context.Background()); err != nil {
		t.Errorf("InsecureSkipVerify with VerifyPeer: %v", err)
	}
}
