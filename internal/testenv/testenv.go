// Package testenv holds helpers that several packages' tests share: an
// embedded NATS connection per test, fresh namespace names, and the
// goroutines goleak must ignore. It is imported only by tests.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/matbus/matbus/internal/natsserver"
)

// NATS starts an embedded NATS server with JetStream for t and returns a
// connection to it; both are closed by t.Cleanup.
func NATS(t testing.TB) *nats.Conn {
	t.Helper()
	s, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Namespace returns a fresh DNS-label namespace name for a test:
// prefix, the test name reduced to [a-z0-9-] (at most 40 characters) and 6
// random hex digits.
func Namespace(prefix, test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-")
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	return prefix + "-" + name + "-" + hex.EncodeToString(rnd[:])
}

// LeakOptions are the goroutines of libraries that outlive any one test by
// design: klog's flush daemon and pooled HTTP connections (to a shared API
// server).
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
	}
}
