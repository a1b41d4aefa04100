package events

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The leader's epoch travels in the envelope and in the stored record; an
// envelope without one (an older publisher) decodes with a nil epoch, a
// malformed one is rejected.
func TestEpochInEnvelope(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx := context.Background()
	e := &Epoch{Lease: "ns/l", Term: 7, Leader: "disc-2"}
	inst := Instance{Key: "ns.a", URL: "https://a:1", Scope: "t"}
	if err := b.Publish(ctx, b.Subjects().Instance("ns.a"), TypeInstanceAppeared, "x1", inst, WithEpoch(e)); err != nil {
		t.Fatal(err)
	}
	rec, _, err := b.LastInstance(ctx, "ns.a")
	if err != nil || rec.Epoch == nil || *rec.Epoch != *e {
		t.Fatalf("stored epoch %v (%v), want %v", rec.Epoch, err, e)
	}
	old, err := Encode(TypeInstanceAppeared, "x2", "old", time.Now(), inst)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(old), "epoch") {
		t.Fatalf("an event without an epoch names one: %s", old)
	}
	env, err := Decode(old)
	if err != nil || env.Epoch != nil {
		t.Fatalf("event without epoch: %v, epoch %v", err, env.Epoch)
	}
	for _, bad := range []string{`{"lease":"","term":1,"leader":"a"}`, `{"lease":"ns/l","term":-1,"leader":"a"}`, `{"lease":"ns/l","term":1}`} {
		body := strings.Replace(string(old), `"data":`, `"epoch":`+bad+`,"data":`, 1)
		if _, err := Decode([]byte(body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("epoch %s: %v, want ErrMalformed", bad, err)
		}
	}
	newer := &Epoch{Lease: "ns/l", Term: 8, Leader: "disc-1"}
	other := &Epoch{Lease: "ns/other", Term: 9, Leader: "x"}
	for _, c := range []struct {
		a, b *Epoch
		want bool
	}{{e, newer, true}, {newer, e, false}, {e, e, false}, {nil, newer, false}, {e, nil, false}, {e, other, false}} {
		if got := c.a.Before(c.b); got != c.want {
			t.Errorf("%v.Before(%v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// WithExpectedLastSubjectSeq: the stream refuses a writer whose read of
// the subject is out of date (ErrWrongLastSequence, not retried) and takes
// one that is current; a retry of a message that was stored (its ack lost)
// is success, not a refusal, though the server checks the sequence first.
func TestPublishExpectedLastSubjectSeq(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx := context.Background()
	subj := b.Subjects().Instance("ns.a")
	inst := Instance{Key: "ns.a", URL: "https://a:1", Scope: "t"}
	if err := b.Publish(ctx, subj, TypeInstanceAppeared, "first", inst, WithExpectedLastSubjectSeq(0)); err != nil {
		t.Fatalf("first record with expected sequence 0: %v", err)
	}
	first, _, _ := b.LastInstance(ctx, "ns.a")
	// A newer writer puts gone on the subject; the deposed writer's
	// appeared, based on its read of "first", is refused.
	if err := b.Publish(ctx, subj, TypeInstanceGone, "gone", inst, WithExpectedLastSubjectSeq(first.Seq)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := b.Publish(ctx, subj, TypeInstanceAppeared, "stale", inst, WithExpectedLastSubjectSeq(first.Seq))
	if !errors.Is(err, ErrWrongLastSequence) {
		t.Fatalf("write based on an old read: %v, want ErrWrongLastSequence", err)
	}
	if !strings.Contains(err.Error(), "1 attempts") {
		t.Errorf("a refused sequence was retried: %v (%v)", err, time.Since(start))
	}
	if rec, _, _ := b.LastInstance(ctx, "ns.a"); rec.Present() {
		t.Fatal("the refused appeared event was stored")
	}
	if err := b.Publish(ctx, subj, TypeInstanceAppeared, "zero", inst, WithExpectedLastSubjectSeq(0)); !errors.Is(err, ErrWrongLastSequence) {
		t.Fatalf("expected sequence 0 on a subject with records: %v, want ErrWrongLastSequence", err)
	}
	// The same message again (a retry after a lost ack): success.
	gone, _, _ := b.LastInstance(ctx, "ns.a")
	if err := b.Publish(ctx, subj, TypeInstanceGone, "gone", inst, WithExpectedLastSubjectSeq(first.Seq)); err != nil {
		t.Fatalf("re-publish of the stored message: %v", err)
	}
	if rec, _, _ := b.LastInstance(ctx, "ns.a"); rec.Seq != gone.Seq {
		t.Fatalf("re-publish stored again: seq %d, was %d", rec.Seq, gone.Seq)
	}
}

// WithGuard is checked before every attempt: a failing guard sends
// nothing and ends the publish at once with ErrFenced.
func TestPublishGuard(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx := context.Background()
	subj := b.Subjects().Sync("ns.a")
	deposed := errors.New("deposed")
	calls := 0
	guard := func() error {
		calls++
		return deposed
	}
	err := b.Publish(ctx, subj, TypeSyncJob, "j1", SyncJob{Key: "ns.a", Reason: ReasonPoll}, WithGuard(guard))
	if !errors.Is(err, ErrFenced) || !errors.Is(err, deposed) {
		t.Fatalf("publish with a failing guard: %v, want ErrFenced and the guard's error", err)
	}
	if calls != 1 {
		t.Errorf("guard called %d times, want 1 (not retried)", calls)
	}
	s, err := b.js.Stream(ctx, b.StreamName(StreamSync))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("a fenced publish was stored: %d messages (%v)", info.State.Msgs, err)
	}
	if err := b.Publish(ctx, subj, TypeSyncJob, "j2", SyncJob{Key: "ns.a", Reason: ReasonPoll}, WithGuard(func() error { return nil })); err != nil {
		t.Fatalf("publish with a passing guard: %v", err)
	}
}
