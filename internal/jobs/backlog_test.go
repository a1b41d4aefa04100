package jobs

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

// TestPullPausesWhileBacklogged runs pull on a real JetStream consumer: while
// backlogged reports true (a sync job waits for an apply slot) no message is
// taken, so they stay available to other consumers; once it reports false
// the waiting messages are delivered, none lost.
func TestPullPausesWhileBacklogged(t *testing.T) {
	js := testenv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"b.a", "b.b", "b.c"} {
		if _, err := js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}

	log := slog.New(slog.DiscardHandler)
	var backlogged atomic.Bool
	backlogged.Store(true)
	got := make(chan string, 3)
	const slots = 4
	sl := newSlots(slots)
	pctx, pcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pull(pctx, log, cons, sl, 1, backlogged.Load, nil, func(m jetstream.Msg) {
			_ = m.Ack()
			sl.free()
			got <- m.Subject()
		})
	}()
	defer func() { pcancel(); <-done }()

	select {
	case subj := <-got:
		t.Fatalf("a backlogged worker took job %s", subj)
	case <-time.After(500 * time.Millisecond):
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 3 || info.NumAckPending != 0 {
		t.Fatalf("while backlogged: %d pending, %d delivered; want all 3 left in the stream", info.NumPending, info.NumAckPending)
	}

	backlogged.Store(false)
	seen := map[string]bool{}
	for len(seen) < 3 {
		select {
		case subj := <-got:
			seen[subj] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("after the backlog cleared only %v were delivered, want b.a, b.b and b.c", seen)
		}
	}
}
