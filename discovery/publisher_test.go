package discovery

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

func newBus(t *testing.T) *events.Bus {
	t.Helper()
	b, _ := newBusJS(t)
	return b
}

// newBusJS returns a bus on a fresh embedded NATS server and a JetStream
// handle on the same connection, for tests that reach past the bus.
func newBusJS(t *testing.T) (*events.Bus, jetstream.JetStream) {
	t.Helper()
	nc := testenv.NATS(t)
	b, err := events.New(nc, events.Config{Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return b, js
}

func runPublisher(t *testing.T, b *events.Bus, src Source, interval time.Duration) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = NewPublisher(b, src, PublisherConfig{SyncInterval: interval}, nil, nil).Run(ctx)
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func present(b *events.Bus, key string) func() bool {
	return func() bool {
		rec, found, err := b.LastInstance(context.Background(), key)
		return err == nil && found && rec.Present()
	}
}

func gone(b *events.Bus, key string) func() bool {
	return func() bool {
		rec, found, err := b.LastInstance(context.Background(), key)
		return err == nil && found && !rec.Present()
	}
}

// jobs counts the messages waiting on a subject filter of a stream.
func jobs(t *testing.T, b *events.Bus, stream events.Role, filter string) uint64 {
	t.Helper()
	n, err := b.StoredMessages(context.Background(), stream, filter)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(n)
}

func TestPublisherAppearedGoneAndJobs(t *testing.T) {
	b := newBus(t)
	src, err := NewStatic("t", []StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a:1266"}, {Namespace: "ns", Name: "mat-1", URL: "https://b:1266"}})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, b, src, time.Hour)
	eventually(t, "both instances present", func() bool { return present(b, "ns.mat-0")() && present(b, "ns.mat-1")() })
	eventually(t, "a sync job per instance", func() bool { return jobs(t, b, events.StreamSync, b.Subjects().SyncJobs()) == 2 })

	// A URL change is a new appeared event with the new URL.
	if err := src.Set([]StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a2:1266"}, {Namespace: "ns", Name: "mat-1", URL: "https://b:1266"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new URL published", func() bool {
		rec, _, _ := b.LastInstance(context.Background(), "ns.mat-0")
		return rec.Instance.URL == "https://a2:1266"
	})
	// Removing mat-1 publishes gone and a clean-up job.
	if err := src.Set([]StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a2:1266"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "mat-1 gone", gone(b, "ns.mat-1"))
	eventually(t, "clean-up job", func() bool { return jobs(t, b, events.StreamSync, b.Subjects().Cleanup("ns.mat-1")) == 1 })
	if !present(b, "ns.mat-0")() {
		t.Fatal("mat-0 must stay present")
	}
}

// appeared → gone → appeared within the duplicate window must end present:
// the event ids differ because they carry the previous record's sequence.
func TestPublisherReappearWithinDuplicateWindow(t *testing.T) {
	b := newBus(t)
	e := []StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a:1266"}}
	src, err := NewStatic("t", e)
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, b, src, time.Hour)
	for i := 0; i < 3; i++ {
		eventually(t, "present", present(b, "ns.mat-0"))
		if err := src.Set(nil); err != nil {
			t.Fatal(err)
		}
		eventually(t, "gone", gone(b, "ns.mat-0"))
		if err := src.Set(e); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "present at the end", present(b, "ns.mat-0"))
}

// A publisher that restarts after an instance vanished while it was down
// reports it gone; a publisher of another scope never does.
func TestPublisherScopes(t *testing.T) {
	b := newBus(t)
	a, _ := NewStatic("a", []StaticEntry{{Namespace: "ns", Name: "mat-a", URL: "https://a:1"}})
	stopA := runPublisher(t, b, a, time.Hour)
	eventually(t, "mat-a present", present(b, "ns.mat-a"))
	stopA()

	other, _ := NewStatic("b", []StaticEntry{{Namespace: "ns", Name: "mat-b", URL: "https://b:1"}})
	runPublisher(t, b, other, time.Hour)
	eventually(t, "mat-b present", present(b, "ns.mat-b"))
	time.Sleep(300 * time.Millisecond)
	if !present(b, "ns.mat-a")() {
		t.Fatal("a publisher of scope b reported scope a's instance gone")
	}

	// Scope a restarts without mat-a: it reports it gone.
	a2, _ := NewStatic("a", []StaticEntry{{Namespace: "ns", Name: "mat-a2", URL: "https://a:2"}})
	runPublisher(t, b, a2, time.Hour)
	eventually(t, "mat-a gone after restart", gone(b, "ns.mat-a"))
	if !present(b, "ns.mat-b")() {
		t.Fatal("scope b's instance touched")
	}
}

func TestPublisherTicksAndRepairsLostStream(t *testing.T) {
	b, js := newBusJS(t)
	src, _ := NewStatic("t", []StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a:1266"}})
	runPublisher(t, b, src, 300*time.Millisecond)
	eventually(t, "present", present(b, "ns.mat-0"))
	// The server lost the instances stream: the next tick re-announces.
	if err := js.DeleteStream(context.Background(), b.StreamName(events.StreamInstances)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "present again after the stream was lost", present(b, "ns.mat-0"))
	// The scheduler keeps one sync job out per instance: without a
	// worker's result, no second one follows, however many intervals pass.
	eventually(t, "a sync job", func() bool { return jobs(t, b, events.StreamSync, b.Subjects().Sync("ns.mat-0")) == 1 })
	time.Sleep(time.Second)
	if n := jobs(t, b, events.StreamSync, b.Subjects().Sync("ns.mat-0")); n != 1 {
		t.Fatalf("%d sync jobs waiting for one instance without results, want 1", n)
	}
}

func TestStaticParsing(t *testing.T) {
	es, err := ParseStatic([]string{"mat-0=https://a:1266, prod/mat-1=http://b:80"})
	if err != nil || len(es) != 2 || es[1].Namespace != "prod" || es[1].Name != "mat-1" {
		t.Fatalf("ParseStatic = %+v, %v", es, err)
	}
	for _, bad := range [][]StaticEntry{
		{},
		{{Name: "Bad_Name", URL: "https://a:1"}},
		{{Name: "a", URL: "ftp://a"}},
		{{Name: "a", URL: "https://user:pw@a:1"}},
		{{Name: "a", URL: "https://a:1"}, {Name: "a", URL: "https://b:1"}},
	} {
		if _, err := NewStatic("t", bad); err == nil {
			t.Errorf("NewStatic(%+v) accepted", bad)
		}
	}
	if _, err := ParseStatic([]string{"noequals"}); err == nil {
		t.Error("ParseStatic accepted an item without '='")
	}
}

// Garbage stored on an instance subject that no source reports is purged,
// so workers stop reporting it; garbage where the source has an instance is
// overwritten by a good record.
func TestPublisherPurgesUnreadableRecords(t *testing.T) {
	b, js := newBusJS(t)
	ctx := context.Background()
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{b.Subjects().Instance("ns.junk"), b.Subjects().Instance("ns.mat-0")} {
		if _, err := js.Publish(ctx, subj, []byte("garbage")); err != nil {
			t.Fatal(err)
		}
	}
	src, _ := NewStatic("t", []StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a:1266"}})
	runPublisher(t, b, src, time.Hour)
	eventually(t, "mat-0 republished", present(b, "ns.mat-0"))
	eventually(t, "junk purged", func() bool {
		_, found, err := b.LastInstance(ctx, "ns.junk")
		return err == nil && !found
	})
}
