package reload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/testenv"
)

func logTo(buf *testenv.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func warnings(buf *testenv.Buffer) int { return strings.Count(buf.String(), "level=WARN") }

func text(data ...[]byte) (string, error) {
	s := strings.TrimSpace(string(data[0]))
	if !strings.HasSuffix(s, ".") {
		return "", errors.New("incomplete: no final dot")
	}
	return s, nil
}

// TestFileSymlinkSwap: a file in a kubelet-style volume is re-read after
// the atomic swap of ..data, by the first Get after its MinInterval and at
// once by Reload; the change is logged, its contents are not.
func TestFileSymlinkSwap(t *testing.T) {
	v := testenv.NewVolume(t, map[string][]byte{"v.txt": []byte("first.")})
	var buf testenv.Buffer
	changes := 0
	f, err := Open(Config[string]{Paths: []string{v.Path("v.txt")}, Name: "--test-file", Parse: text,
		MinInterval: time.Hour, Log: logTo(&buf), OnChange: func() { changes++ }})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Get(); got != "first." || f.Version() != 1 {
		t.Fatalf("Get %q version %d, want first. and 1", got, f.Version())
	}
	v.Update(map[string][]byte{"v.txt": []byte("second secret.")})
	if got := f.Get(); got != "first." {
		t.Fatalf("Get within MinInterval: %q, want the value of the last look", got)
	}
	if !f.Reload() {
		t.Fatal("Reload after the swap reported no change")
	}
	if got := f.Get(); got != "second secret." || f.Version() != 2 || changes != 1 {
		t.Fatalf("after the swap: %q version %d changes %d, want the new contents, 2 and 1", got, f.Version(), changes)
	}
	if f.Reload() {
		t.Error("a second Reload without a change reported one")
	}
	if !strings.Contains(buf.String(), "file=--test-file") || strings.Contains(buf.String(), "secret") {
		t.Errorf("log names the file and never its contents:\n%s", buf.String())
	}

	// Get looks at the files again once MinInterval has passed.
	g, err := Open(Config[string]{Paths: []string{v.Path("v.txt")}, Parse: text, MinInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	v.Update(map[string][]byte{"v.txt": []byte("third.")})
	testenv.Wait(t, 5*time.Second, "Get to see the swap", func() (bool, string) { s := g.Get(); return s == "third.", s })
}

// TestFileBadStatesKeepLastGood: a file that goes missing, then is caught
// half-written, keeps the last good value through any number of looks,
// with one warning per bad state and none per look; it is taken as soon
// as it is whole again, and nothing panics.
func TestFileBadStatesKeepLastGood(t *testing.T) {
	v := testenv.NewVolume(t, map[string][]byte{"v.txt": []byte("good.")})
	var buf testenv.Buffer
	f, err := Open(Config[string]{Paths: []string{v.Path("v.txt")}, Name: "v.txt", Parse: text, MinInterval: -1, Log: logTo(&buf)})
	if err != nil {
		t.Fatal(err)
	}

	v.Unlink("v.txt") // briefly missing
	for range 5 {
		if got := f.Get(); got != "good." {
			t.Fatalf("missing file: Get %q, want the last good value", got)
		}
	}
	if n := warnings(&buf); n != 1 || f.Err() == nil || !strings.Contains(buf.String(), "no such file") {
		t.Fatalf("missing file: %d warnings (want 1), Err %v; log:\n%s", n, f.Err(), buf.String())
	}

	v.Update(map[string][]byte{"v.txt": []byte("half writ")}) // half-written
	for range 5 {
		if got := f.Get(); got != "good." {
			t.Fatalf("half-written file: Get %q, want the last good value", got)
		}
	}
	if n := warnings(&buf); n != 2 || !strings.Contains(buf.String(), "incomplete") {
		t.Fatalf("half-written file: %d warnings (want 2: one per bad state); log:\n%s", n, buf.String())
	}

	v.WriteInPlace("v.txt", []byte("half written and done.")) // the same inode, finished
	if got := f.Get(); got != "half written and done." || f.Err() != nil {
		t.Fatalf("finished file: Get %q Err %v, want the new contents", got, f.Err())
	}
	if n := warnings(&buf); n != 2 {
		t.Errorf("%d warnings after recovery, want still 2", n)
	}

	// Back to the same bad state later: warned again (a new episode).
	v.Unlink("v.txt")
	f.Get()
	f.Get()
	if n := warnings(&buf); n != 3 {
		t.Errorf("a second missing spell: %d warnings, want 3", n)
	}
}

// TestFileOpenErrors: Open refuses a missing or unparsable file with an
// error naming it.
func TestFileOpenErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("no dot"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing"), "--f " + filepath.Join(dir, "missing") + ": stat " + filepath.Join(dir, "missing") + ": no such file"},
		{bad, "--f " + bad + ": incomplete"},
		{dir, "is a directory"},
	} {
		_, err := Open(Config[string]{Paths: []string{c.path}, Name: "--f " + c.path, Parse: text})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%s): %v, want %q", c.path, err, c.want)
		}
	}
}

// TestFileConcurrentUse: Get, Reload and swaps at once (run with -race).
func TestFileConcurrentUse(t *testing.T) {
	v := testenv.NewVolume(t, map[string][]byte{"v.txt": []byte("0.")})
	f, err := Open(Config[string]{Paths: []string{v.Path("v.txt")}, Parse: text, MinInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					if s := f.Get(); !strings.HasSuffix(s, ".") {
						t.Errorf("Get %q: not a good value", s)
					}
				}
			}
		})
	}
	for i := range 50 {
		v.Update(map[string][]byte{"v.txt": []byte(strings.Repeat("x", i) + ".")})
	}
	close(stop)
	wg.Wait()
	f.Reload()
	if got := f.Get(); got != strings.Repeat("x", 49)+"." {
		t.Errorf("after the last swap: %q", got)
	}
}

// TestRootsVerifyAfterCASwap: a server certificate from a CA that is not
// in the bundle yet fails as unknown authority; once the bundle (a
// kubelet-style volume) holds the new CA, the first verification after the
// swap succeeds, with no wait for MinInterval, because an unknown
// authority makes Roots look at the file at once. A wrong host name still
// fails, and a bundle that goes bad keeps the last good CAs.
func TestRootsVerifyAfterCASwap(t *testing.T) {
	oldCA, newCA := testenv.NewCA(t, "old CA"), testenv.NewCA(t, "new CA")
	v := testenv.NewVolume(t, map[string][]byte{"ca.crt": oldCA.PEM})
	var buf testenv.Buffer
	r, err := NewRoots(RootsConfig{Path: v.Path("ca.crt"), Name: "--ca", System: true, MinInterval: time.Hour, Log: logTo(&buf)})
	if err != nil {
		t.Fatal(err)
	}
	chain := func(c tls.Certificate) []*x509.Certificate { return []*x509.Certificate{c.Leaf} }
	oldCert, newCert := oldCA.Issue("mat.example"), newCA.Issue("mat.example")
	if err := r.Verify("mat.example", chain(oldCert)); err != nil {
		t.Fatalf("old CA's certificate: %v", err)
	}
	err = r.Verify("mat.example", chain(newCert))
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	if !errors.As(err, &cve) || !errors.As(err, &uae) {
		t.Fatalf("new CA's certificate before the swap: %v, want an unknown authority", err)
	}

	v.Update(map[string][]byte{"ca.crt": append(append([]byte{}, oldCA.PEM...), newCA.PEM...)})
	if err := r.Verify("mat.example", chain(newCert)); err != nil {
		t.Fatalf("new CA's certificate after the swap: %v", err)
	}
	if err := r.Verify("mat.example", chain(oldCert)); err != nil {
		t.Errorf("old CA's certificate with both CAs: %v", err)
	}
	var hne x509.HostnameError
	if err := r.Verify("other.example", chain(newCert)); !errors.As(err, &hne) {
		t.Errorf("wrong host: %v, want a host name error", err)
	}
	if err := r.Verify("", chain(newCert)); err == nil {
		t.Error("an empty server name verified")
	}

	// A bundle caught half-written (no whole certificate) keeps both CAs.
	v.WriteInPlace("ca.crt", newCA.PEM[:len(newCA.PEM)/2])
	if r.Reload() {
		t.Error("a half-written bundle was taken")
	}
	if err := r.Verify("mat.example", chain(oldCert)); err != nil {
		t.Errorf("old CA after a half-written bundle: %v", err)
	}
	if n := warnings(&buf); n != 1 || !strings.Contains(buf.String(), ErrNoCertificate.Error()) {
		t.Errorf("%d warnings, want 1 saying %q:\n%s", n, ErrNoCertificate, buf.String())
	}

	// Trust adds certificates to every pool.
	other := testenv.NewCA(t, "other CA")
	if err := r.Verify("mat.example", chain(other.Issue("mat.example"))); err == nil {
		t.Fatal("a certificate of a CA not trusted verified")
	}
	certs, err := ParseCertificates(other.PEM)
	if err != nil {
		t.Fatal(err)
	}
	r.Trust(certs...)
	if err := r.Verify("mat.example", chain(other.Issue("mat.example"))); err != nil {
		t.Errorf("after Trust: %v", err)
	}
}

// TestKeyPairOneFileAtATime: a certificate renewed one file after the
// other keeps the last good pair (one warning) until the key matches.
func TestKeyPairOneFileAtATime(t *testing.T) {
	ca := testenv.NewCA(t, "client CA")
	certFile, keyFile := ca.WriteKeyPair(ca.Issue("first"))
	var buf testenv.Buffer
	k, err := NewKeyPair(KeyPairConfig{CertFile: certFile, KeyFile: keyFile, Log: logTo(&buf)})
	if err != nil {
		t.Fatal(err)
	}
	name := func() string { return k.Current().Leaf.DNSNames[0] }
	if name() != "first" {
		t.Fatalf("pair %q, want first", name())
	}
	c2, k2 := ca.WriteKeyPair(ca.Issue("second"))
	copyFile := func(from, to string) {
		t.Helper()
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(c2, certFile)
	for range 3 {
		if name() != "first" {
			t.Fatalf("certificate renewed, key not yet: pair %q, want the last good (first)", name())
		}
	}
	if n := warnings(&buf); n != 1 || strings.Contains(buf.String(), "PRIVATE") {
		t.Errorf("%d warnings (want 1), no contents:\n%s", n, buf.String())
	}
	copyFile(k2, keyFile)
	if name() != "second" {
		t.Fatalf("both files renewed: pair %q, want second", name())
	}
	c, err := k.GetClientCertificate(nil)
	if err != nil || c.Leaf.DNSNames[0] != "second" {
		t.Errorf("GetClientCertificate: %v %v", c, err)
	}
}
