package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

// TestSubjectGate runs the gate on real JetStream messages: one job per
// subject runs, a second waits (kept alive), a third supersedes the second
// (which is acknowledged), done hands the waiting one back, and release
// naks what still waits.
func TestSubjectGate(t *testing.T) {
	js := testenv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "G", Subjects: []string{"g.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(subj string) {
		if _, err := js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	fetch := func(n int, wait time.Duration) []jetstream.Msg {
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatal(err)
		}
		var out []jetstream.Msg
		for m := range batch.Messages() {
			out = append(out, m)
		}
		return out
	}
	seq := func(m jetstream.Msg) uint64 { md, _ := m.Metadata(); return md.Sequence.Stream }
	publish("g.a")
	publish("g.a")
	publish("g.b")
	msgs := fetch(3, 5*time.Second)
	if len(msgs) != 3 {
		t.Fatalf("fetched %d messages, want 3", len(msgs))
	}

	g := newSubjectGate(200 * time.Millisecond)
	if !g.admit(msgs[0]) {
		t.Fatal("the first job of g.a did not run")
	}
	if g.admit(msgs[1]) {
		t.Fatal("a second job of g.a ran while the first runs")
	}
	if !g.admit(msgs[2]) {
		t.Fatal("a job of another subject waited")
	}
	// The running jobs are the runner's to keep alive; here they end at once.
	_ = msgs[0].Ack()
	_ = msgs[2].Ack()
	// Waiting longer than AckWait: kept alive with InProgress, not redelivered.
	time.Sleep(1500 * time.Millisecond)
	for _, m := range fetch(1, 300*time.Millisecond) {
		t.Errorf("message %d was redelivered while the gate held it", seq(m))
	}
	// A newer job of g.a supersedes the waiting one, which is acknowledged.
	publish("g.a")
	newer := fetch(1, 5*time.Second)
	if len(newer) != 1 {
		t.Fatalf("fetched %d, want the newer job", len(newer))
	}
	if g.admit(newer[0]) {
		t.Fatal("a third job of g.a ran")
	}
	// Ack is asynchronous: give the server a moment to remove it.
	stored := true
	for deadline := time.Now().Add(5 * time.Second); stored && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, err := s.GetMsg(ctx, seq(msgs[1]))
		stored = err == nil
	}
	if stored {
		t.Error("the superseded job is still stored")
	}
	next := g.done("g.a")
	if next == nil || seq(next) != seq(newer[0]) {
		t.Fatalf("done handed back %v, want the newest waiting job", next)
	}
	if g.done("g.a") != nil {
		t.Fatal("done handed back a job twice")
	}
	if !g.admit(msgs[0]) { // the subject is free again
		t.Fatal("g.a still busy after done")
	}
	// release naks waiting jobs: they come back.
	if g.admit(newer[0]) {
		t.Fatal("admitted while busy")
	}
	g.release()
	// A nak'ed job comes back at once; without the nak it would come back
	// only AckWait (1 s) after its last progress report.
	back, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range back.Messages() {
		got++
		if seq(m) != seq(newer[0]) {
			t.Errorf("redelivered %d, want %d", seq(m), seq(newer[0]))
		}
	}
	if got != 1 {
		t.Errorf("%d messages redelivered after release, want 1", got)
	}
}
