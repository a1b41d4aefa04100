package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

// lockedBuf is a log sink safe for concurrent writes.
type lockedBuf = testenv.Buffer

// startCluster starts n embedded JetStream servers routed into one
// cluster on loopback and returns a connection to all of them once the
// cluster has a meta leader.
func startCluster(t *testing.T, n int) *nats.Conn {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var urls []string
	for i := range n {
		s, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "events-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("server n%d not ready", i+1)
		}
		urls = append(urls, s.ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return nc
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream cluster has no meta leader: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replicasOf returns the replica count of every stream and consumer of b
// as the servers report it (leader plus followers).
func replicasOf(t *testing.T, b *Bus) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]int{}
	for _, cfg := range b.StreamConfigs() {
		s, err := b.js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out[cfg.Name] = info.Config.Replicas
		for name := range s.ConsumerNames(ctx).Name() {
			c, err := s.Consumer(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			ci, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			if ci.Cluster != nil {
				n = 1 + len(ci.Cluster.Replicas)
			}
			out[cfg.Name+"/"+name] = n
		}
	}
	return out
}

func ensure(b *Bus) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.EnsureStreams(ctx)
}

// TestStreamReplicasOnACluster: on a three-server JetStream cluster the
// streams start with one replica, are scaled to three (their job
// consumers with them) and back to one by EnsureStreams; a change to five
// replicas is refused, logged once per stream with the cause, and the
// streams keep three.
func TestStreamReplicasOnACluster(t *testing.T) {
	nc := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r1, err := New(nc, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensure(r1); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{SyncConsumer, DeleteConsumer} {
		if _, err := r1.EnsureConsumer(ctx, role); err != nil {
			t.Fatal(err)
		}
	}
	for name, n := range replicasOf(t, r1) {
		if n != 1 {
			t.Errorf("%s: %d replicas, want 1", name, n)
		}
	}

	r3, err := New(nc, Config{Replicas: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensure(r3); err != nil {
		t.Fatalf("scale to 3 replicas: %v", err)
	}
	// The servers report the consumers' new peers once they have them.
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := replicasOf(t, r3)
		bad := ""
		for name, n := range got {
			if n != 3 {
				bad += fmt.Sprintf(" %s=%d", name, n)
			}
		}
		if bad == "" {
			if len(got) != 6 {
				t.Errorf("want 4 streams and 2 consumers, got %v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every stream and consumer has 3 replicas:%s", bad)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := ensure(r3); err != nil {
		t.Fatalf("second EnsureStreams at 3 replicas: %v", err)
	}

	// Five replicas on three servers: refused; the streams keep three and
	// work on, the refusal is logged once per stream.
	var logged lockedBuf
	r5, err := New(nc, Config{Replicas: 5, ErrorMaxAge: time.Hour}, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := ensure(r5); err != nil {
			t.Fatalf("5 replicas on 3 servers: %v, want the streams kept as they are", err)
		}
	}
	if n := strings.Count(logged.String(), "level=ERROR"); n != 4 ||
		!strings.Contains(logged.String(), "a change from 3 to 5 replicas") || !strings.Contains(logged.String(), "fewer JetStream servers") {
		t.Errorf("want one error line per stream naming the cause, got %d:\n%s", n, logged.String())
	}
	for name, n := range replicasOf(t, r5) {
		if n != 3 {
			t.Errorf("%s: %d replicas after a refused change, want 3", name, n)
		}
	}
	if s, err := r5.js.Stream(ctx, r5.StreamName(StreamErrors)); err != nil || s.CachedInfo().Config.MaxAge != time.Hour {
		t.Errorf("the error stream's other settings were not updated: %v", err)
	}

	if err := ensure(r1); err != nil {
		t.Fatalf("scale back to 1 replica: %v", err)
	}
	for _, cfg := range r1.StreamConfigs() {
		if n := replicasOf(t, r1)[cfg.Name]; n != 1 {
			t.Errorf("%s: %d replicas after scaling down, want 1", cfg.Name, n)
		}
	}
}

// TestStreamReplicasOnOneServer: a single server takes no replicated
// stream; the error says so and wraps ErrReplicas. Streams that exist
// keep their one replica.
func TestStreamReplicasOnOneServer(t *testing.T) {
	nc := testenv.NATS(t)
	b, err := New(nc, Config{Replicas: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = ensure(b)
	if !errors.Is(err, ErrReplicas) || !strings.Contains(err.Error(), "not part of a JetStream cluster") {
		t.Fatalf("got %v, want ErrReplicas saying the server is not clustered", err)
	}
	r1, err := New(nc, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensure(r1); err != nil {
		t.Fatal(err)
	}
	var logged lockedBuf
	b, err = New(nc, Config{Replicas: 3}, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := ensure(b); err != nil {
		t.Fatalf("existing streams: %v, want them kept at 1 replica", err)
	}
	if !strings.Contains(logged.String(), "use --stream-replicas 1") {
		t.Errorf("the refusal is not logged:\n%s", logged.String())
	}
	for _, n := range []int{-1, 6} {
		if _, err := New(nc, Config{Replicas: n}, nil); err == nil || !strings.Contains(err.Error(), "want 1 to 5") {
			t.Errorf("Replicas %d: got %v, want an error", n, err)
		}
	}
}
