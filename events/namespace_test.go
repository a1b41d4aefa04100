package events

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

// TestNamespacesDoNotCross: two buses of different namespaces on one NATS
// and prefix get their own job consumers, each taking exactly its own
// namespace's sync, clean-up and delete jobs, and read only their own
// instances and results.
func TestNamespacesDoNotCross(t *testing.T) {
	nc := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	buses := map[string]*Bus{}
	for _, ns := range []string{"team-a", "team-b"} {
		b, err := New(nc, Config{Memory: true, Namespace: ns}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.EnsureStreams(ctx); err != nil {
			t.Fatal(err)
		}
		buses[ns] = b
	}
	// A result subscription per namespace, before anything is published.
	results := map[string]chan SyncResult{}
	for ns, b := range buses {
		ch := make(chan SyncResult, 8)
		results[ns] = ch
		sub, err := b.SubscribeResults(func(r SyncResult) { ch <- r }, func(s string, err error) { t.Errorf("bad result on %s: %v", s, err) })
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	for ns, b := range buses {
		key := ns + ".mat-0"
		pub := []struct {
			subject string
			typ     Type
			data    any
		}{
			{b.Subjects().Instance(key), TypeInstanceAppeared, Instance{Key: key, URL: "https://h:1266", Scope: "s"}},
			{b.Subjects().Sync(key), TypeSyncJob, SyncJob{Key: key, Reason: ReasonPoll}},
			{b.Subjects().Cleanup(key), TypeCleanupJob, CleanupJob{Key: key, Scope: "s"}},
			{b.Subjects().Delete(key), TypeDeleteJob, DeleteJob{Key: key, Namespace: ns, Name: "svc", UID: "u"}},
		}
		for i, p := range pub {
			if err := b.Publish(ctx, p.subject, p.typ, fmt.Sprintf("%s-%d", ns, i), p.data); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.PublishResult(ns+"-r", SyncResult{Key: key, JobID: "j", Outcome: OutcomeSynced}); err != nil {
			t.Fatal(err)
		}
	}
	for ns, b := range buses {
		for role, want := range map[string][]string{
			SyncConsumer:   {b.Subjects().Cleanup(ns + ".mat-0"), b.Subjects().Sync(ns + ".mat-0")},
			DeleteConsumer: {b.Subjects().Delete(ns + ".mat-0")},
		} {
			c, err := b.EnsureConsumer(ctx, role)
			if err != nil {
				t.Fatalf("%s %s: %v", ns, role, err)
			}
			if name := c.CachedInfo().Name; name != role+"-"+ns {
				t.Errorf("consumer of %s %s is named %q", ns, role, name)
			}
			batch, err := c.Fetch(10, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for m := range batch.Messages() {
				got = append(got, m.Subject())
				_ = m.Ack()
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s %s took %v, want %v", ns, role, got, want)
			}
		}
		recs, bad, err := b.Instances(ctx)
		if err != nil || len(bad) > 0 {
			t.Fatal(err, bad)
		}
		if len(recs) != 1 || !recs[ns+".mat-0"].Present() {
			t.Errorf("%s reads instances %v, want only its own", ns, recs)
		}
		select {
		case r := <-results[ns]:
			if r.Key != ns+".mat-0" {
				t.Errorf("%s received the result of %s", ns, r.Key)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no result", ns)
		}
	}
	// Nothing else arrives: a result of the other namespace would be here by now
	// (core NATS delivers in order per connection, and both were published
	// before the ones received above).
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for ns, ch := range results {
		select {
		case r := <-ch:
			t.Errorf("%s received another result: %+v", ns, r)
		default:
		}
	}
}

// TestNamespacedConsumerReplacesUnfiltered: the unfiltered consumer of a
// bus without namespace (which would take every namespace's jobs, and
// which a work-queue stream refuses beside filtered ones) is removed when a
// namespace's consumer is created, and the job it held is not lost.
func TestNamespacedConsumerReplacesUnfiltered(t *testing.T) {
	nc := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := New(nc, Config{Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := old.EnsureConsumer(ctx, SyncConsumer); err != nil {
		t.Fatal(err)
	}
	if err := old.Publish(ctx, old.Subjects().Sync("team-a.mat-0"), TypeSyncJob, "j1", SyncJob{Key: "team-a.mat-0", Reason: ReasonPoll}); err != nil {
		t.Fatal(err)
	}
	nb, err := New(nc, Config{Memory: true, Namespace: "team-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nb.EnsureConsumer(ctx, SyncConsumer)
	if err != nil {
		t.Fatalf("namespaced consumer beside the unfiltered one: %v", err)
	}
	if _, err := nb.js.Consumer(ctx, nb.StreamName(StreamSync), SyncConsumer); err == nil {
		t.Error("the unfiltered consumer is still there")
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		_ = m.Ack()
	}
	if n != 1 {
		t.Errorf("the waiting job reached the namespace's consumer %d times, want 1", n)
	}
}

func TestNamespaceMustBeADNSLabel(t *testing.T) {
	nc := testenv.NATS(t)
	for _, ns := range []string{"Team_A", "a.b", "-a"} {
		if _, err := New(nc, Config{Namespace: ns}, nil); err == nil {
			t.Errorf("namespace %q accepted", ns)
		}
	}
}
