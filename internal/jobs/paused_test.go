package jobs

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// TestRunPaused: while Paused reports true no job runs; a message that a
// pull request sent before the pause still delivers is handed back unrun
// (a nak: it stays in the stream and comes again at once, not after
// AckWait); once Paused reports
// false every job runs and is acked.
func TestRunPaused(t *testing.T) {
	// AckWait is a minute: a message held rather than handed back would
	// come again only after it, past the test's waits.
	r := newRig(t, time.Minute, 5, 4)
	r.opts.OneAtATime = true
	var paused atomic.Bool
	r.opts.Paused = paused.Load
	var runs atomic.Int32
	h := func(ctx context.Context, env events.Envelope, subject string) error {
		runs.Add(1)
		return nil
	}
	ctx, cancel := context.WithCancel(r.ctx)
	wait := r.run(ctx, ctx, h)
	defer wait()
	defer cancel()

	// A pull request is open on the empty stream; pause, then publish:
	// the open request delivers the first job, which is handed back.
	time.Sleep(200 * time.Millisecond)
	paused.Store(true)
	const total = 5
	for i := range total {
		r.publish("j.ns.s"+strconv.Itoa(i), events.TypeSyncJob, events.SyncJob{Key: "ns.x"})
	}
	waitFor(t, 10*time.Second, "the open request's job delivered", func() bool {
		info, err := r.cons.Info(r.ctx)
		return runs.Load() > 0 || (err == nil && info.Delivered.Consumer >= 1)
	})
	time.Sleep(300 * time.Millisecond) // six pause checks: nothing more is taken
	if n := runs.Load(); n != 0 {
		t.Fatalf("%d jobs ran while paused", n)
	}
	info, err := r.cons.Info(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 || info.NumPending+uint64(info.NumAckPending) != total {
		t.Fatalf("jobs acknowledged while paused: %+v", info)
	}

	paused.Store(false)
	waitFor(t, 10*time.Second, "every job acked after the pause", func() bool { return r.count(OK) == total })
	if n := runs.Load(); n != total {
		t.Errorf("%d runs of %d jobs", n, total)
	}
}
