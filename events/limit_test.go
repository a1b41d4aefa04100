package events

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

func TestTruncate(t *testing.T) {
	long := strings.Repeat("a", 5000)
	euro := strings.Repeat("€", 2000) // 3 bytes each
	cases := []struct {
		name, in   string
		limit      int
		want       string // exact result, when not empty
		wantPrefix string
	}{
		{name: "short", in: "abc", limit: 10, want: "abc"},
		{name: "exactly the limit", in: "abcdefghij", limit: 10, want: "abcdefghij"},
		{name: "empty", in: "", limit: 0, want: ""},
		{name: "long ascii", in: long, limit: 100, wantPrefix: "aaaa"},
		{name: "multibyte cut", in: euro, limit: 101, wantPrefix: "€€"},
		{name: "limit below the marker", in: long, limit: 5, want: TruncatedMarker(5000)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Truncate(c.in, c.limit)
			if c.want != "" || c.in == "" {
				if got != c.want {
					t.Fatalf("Truncate = %q, want %q", got, c.want)
				}
				return
			}
			if len(got) > c.limit || !strings.HasPrefix(got, c.wantPrefix) ||
				!strings.HasSuffix(got, "…[truncated, "+strconv.Itoa(len(c.in))+" bytes]") || !utf8.ValidString(got) {
				t.Fatalf("Truncate(%d bytes, %d) = %q (%d bytes)", len(c.in), c.limit, got, len(got))
			}
			if !strings.HasPrefix(c.in, strings.TrimSuffix(got, TruncatedMarker(len(c.in)))) {
				t.Fatalf("kept part is not a prefix of the input: %q", got)
			}
		})
	}
}

// startNATS starts an embedded JetStream server with max_payload maxPayload
// (0: the server default) and returns a connection to it.
func startNATS(t *testing.T, maxPayload int32) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), MaxPayload: maxPayload, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func busOn(t *testing.T, nc *nats.Conn) *Bus {
	t.Helper()
	b, err := New(nc, Config{Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// lastError reads the last error event of kind back from the errors stream
// and returns it with the size of the stored message.
func lastError(t *testing.T, b *Bus, kind ErrorKind) (Error, int) {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, b.StreamName(StreamErrors))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, b.Subjects().Error(kind))
	if err != nil {
		t.Fatalf("no %s error event stored: %v", kind, err)
	}
	env, err := Decode(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Into[Error](env, TypeError)
	if err != nil {
		t.Fatal(err)
	}
	return e, len(m.Data)
}

func checkTruncated(t *testing.T, field, got string, orig, limit int) {
	t.Helper()
	if len(got) > limit || !strings.HasSuffix(got, TruncatedMarker(orig)) || !utf8.ValidString(got) {
		t.Errorf("%s: %d bytes ending %q; want at most %d bytes ending %q", field, len(got), got[max(len(got)-40, 0):], limit, TruncatedMarker(orig))
	}
}

// TestReporterDeliversHugeFields reports a 2 MiB message and a 2 MiB id
// (MatID, Instance) to a server with the default 1 MiB max_payload: the
// event is stored, each field cut to its cap and marked with the original
// length.
func TestReporterDeliversHugeFields(t *testing.T) {
	b := busOn(t, testenv.NATS(t))
	r := NewReporter(b, nil, "w1", -1)
	const size = 2 << 20
	start := time.Now()
	ok := r.Report(context.Background(), Error{Kind: ErrorFetch, Instance: "ns." + strings.Repeat("i", size-3),
		MatID: strings.Repeat("m", size), Message: strings.Repeat("é", size/2)})
	if !ok {
		t.Fatal("event with 2 MiB fields not published")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("publishing took %s", d)
	}
	e, _ := lastError(t, b, ErrorFetch)
	checkTruncated(t, "message", e.Message, size, MaxErrorMessage)
	checkTruncated(t, "mat_id", e.MatID, size, MaxErrorField)
	checkTruncated(t, "instance", e.Instance, size, MaxErrorField)
	if !strings.HasPrefix(e.Message, "éé") || !strings.HasPrefix(e.Instance, "ns.ii") || e.Worker != "w1" {
		t.Errorf("fields lost their beginning: %.20q %.20q %q", e.Message, e.Instance, e.Worker)
	}
}

// TestReporterFitsSmallMaxPayload uses a server with a 16 KiB max_payload
// and fields whose JSON escaping is six times their size ('<' → \u003c):
// the per-field caps alone do not fit, the event is cut further and stored.
func TestReporterFitsSmallMaxPayload(t *testing.T) {
	const maxPayload = 16 << 10
	b := busOn(t, startNATS(t, maxPayload))
	if got := b.MaxEventBytes(); got != maxPayload-PayloadHeadroom {
		t.Fatalf("MaxEventBytes = %d, want %d", got, maxPayload-PayloadHeadroom)
	}
	r := NewReporter(b, nil, "w1", -1)
	const size = 2 << 20
	huge := strings.Repeat("<", size)
	if !r.Report(context.Background(), Error{Kind: ErrorCreate, Service: huge, URL: "https://h:1/" + huge, Subject: huge, Message: huge}) {
		t.Fatal("event not published")
	}
	e, n := lastError(t, b, ErrorCreate)
	if n > maxPayload-PayloadHeadroom {
		t.Errorf("stored event has %d bytes, more than %d", n, maxPayload-PayloadHeadroom)
	}
	checkTruncated(t, "message", e.Message, size, MaxErrorMessage)
	checkTruncated(t, "service", e.Service, size, MaxErrorField)
	checkTruncated(t, "url", e.URL, size+len("https://h:1/"), MaxErrorField)
	if !strings.HasPrefix(e.Message, "<<<") {
		t.Errorf("message lost its beginning: %.20q", e.Message)
	}
}

// TestPublishRawTooBigFailsAtOnce: a body over max_payload is a permanent
// failure, returned after one attempt, naming the cause.
func TestPublishRawTooBigFailsAtOnce(t *testing.T) {
	for _, c := range []struct {
		name       string
		maxPayload int32
		size       int
	}{
		{"16 KiB server", 16 << 10, 32 << 10},
		{"default server, 2 MiB body", 0, 2 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := busOn(t, startNATS(t, c.maxPayload))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			err := b.PublishRaw(ctx, b.Subjects().Error(ErrorEvent), "big-1", bytes.Repeat([]byte("x"), c.size))
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("a too-big publish took %s", d)
			}
			if !errors.Is(err, nats.ErrMaxPayload) || !strings.Contains(err.Error(), "maximum payload") ||
				!strings.Contains(err.Error(), "(1 attempts)") || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("PublishRaw of %d bytes: %v", c.size, err)
			}
		})
	}
}

// TestPublishRawNamesTheCause: a publish that keeps failing until its
// context ends returns the failure seen, not only "context deadline exceeded".
func TestPublishRawNamesTheCause(t *testing.T) {
	b := busOn(t, startNATS(t, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	// No stream holds this subject: every attempt has no responders.
	err := b.PublishRaw(ctx, "nowhere.x", "", []byte("{}"))
	if err == nil {
		t.Fatal("publish to a subject of no stream succeeded")
	}
	if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("error does not name the cause: %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error does not say the context ended: %v", err)
	}
}

// redactingHandler is a slog handler that also is a Redactor, as the
// binary's is.
type redactingHandler struct {
	slog.Handler
	secret string
}

func (h redactingHandler) Redact(s string) string {
	return strings.ReplaceAll(s, h.secret, "[redacted]")
}

// TestReporterRedacts: the user info of URLs is stripped from every field of
// the event and the log line, and the logger's Redactor is applied to them.
func TestReporterRedacts(t *testing.T) {
	b := busOn(t, testenv.NATS(t))
	const secret, token = "Pa55w0rd-9f8e7d", "T0ken-a1b2c3"
	var logBuf bytes.Buffer
	log := slog.New(redactingHandler{Handler: slog.NewJSONHandler(&logBuf, nil), secret: secret})
	r := NewReporter(b, log, "w1", -1)
	r.Report(context.Background(), Error{Kind: ErrorFetch, Instance: "ns.a", URL: "https://admin:" + secret + "@10.0.0.9:1266",
		Message: `Get "https://` + token + `@10.0.0.9:1266/machines/status": EOF; password was ` + secret})
	e, _ := lastError(t, b, ErrorFetch)
	all := e.URL + " " + e.Message + " " + logBuf.String()
	if strings.Contains(all, secret) || strings.Contains(all, token) || strings.Contains(all, "admin") {
		t.Fatalf("a secret was published or logged:\nevent %+v\nlog %s", e, logBuf.String())
	}
	if e.URL != "https://***@10.0.0.9:1266" || !strings.Contains(e.Message, "https://***@10.0.0.9:1266/machines/status") ||
		!strings.Contains(e.Message, "[redacted]") || !strings.Contains(logBuf.String(), "***@10.0.0.9:1266") {
		t.Fatalf("event %+v\nlog %s", e, logBuf.String())
	}

	// Without a Redactor, user info is still stripped.
	r2 := NewReporter(b, nil, "w1", -1)
	r2.Report(context.Background(), Error{Kind: ErrorClose, URL: "https://u:" + secret + "@h:1", Message: "close nats://" + token + "@h:4222"})
	e2, _ := lastError(t, b, ErrorClose)
	if e2.URL != "https://***@h:1" || e2.Message != "close nats://***@h:4222" {
		t.Fatalf("event %+v", e2)
	}
}

// TestPublishRawClosedConnectionFailsAtOnce: a closed connection never
// comes back, so a publish on it is not retried.
func TestPublishRawClosedConnectionFailsAtOnce(t *testing.T) {
	nc := startNATS(t, 0)
	b := busOn(t, nc)
	nc.Close()
	start := time.Now()
	err := b.PublishRaw(context.Background(), b.Subjects().Error(ErrorEvent), "", []byte("{}"))
	if !errors.Is(err, nats.ErrConnectionClosed) || !strings.Contains(err.Error(), "(1 attempts)") || time.Since(start) > time.Second {
		t.Fatalf("PublishRaw on a closed connection after %s: %v", time.Since(start), err)
	}
}

// TestReporterLogLevels: a failure is logged at error level (a close error
// at warn), the end of a failure state (Resolved) at info as "recovered",
// and the Resolved flag reaches the subscriber.
func TestReporterLogLevels(t *testing.T) {
	b := busOn(t, testenv.NATS(t))
	var logBuf bytes.Buffer
	r := NewReporter(b, slog.New(slog.NewJSONHandler(&logBuf, nil)), "w1", -1)
	ctx := context.Background()
	for _, c := range []struct {
		e          Error
		level, msg string
	}{
		{Error{Kind: ErrorWatch, Message: "watch services: forbidden"}, "ERROR", "failure"},
		{Error{Kind: ErrorClose, Message: "close: broken pipe"}, "WARN", "failure"},
		{Error{Kind: ErrorWatch, Message: "list and watch services work again after 3s", Resolved: true}, "INFO", "recovered"},
	} {
		logBuf.Reset()
		r.Report(ctx, c.e)
		got, _ := lastError(t, b, c.e.Kind)
		if got.Message != c.e.Message || got.Resolved != c.e.Resolved {
			t.Errorf("published %+v, want message %q resolved %v", got, c.e.Message, c.e.Resolved)
		}
		line := logBuf.String()
		if !strings.Contains(line, `"level":"`+c.level+`"`) || !strings.Contains(line, `"msg":"`+c.msg+`"`) {
			t.Errorf("%s logged %s, want level %s msg %q", c.e.Message, line, c.level, c.msg)
		}
	}
}
