package jobs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Pull timing: a pull request waits at most pullWait for messages, and the
// server sends heartbeats every pullHeartbeat (a missing one means the
// server or consumer is gone).
const (
	pullWait      = 10 * time.Second
	pullHeartbeat = 2 * time.Second
	// backlogPoll is how often a backlogged consumer checks whether it
	// may pull again.
	backlogPoll = 50 * time.Millisecond
	// windowPoll is how often a consumer whose window (Options.Window) is
	// full reads it again; a job that ends is seen at once.
	windowPoll = 20 * time.Millisecond
)

// slots are a consumer's job slots: one is taken for each message
// requested and freed when its job ends, or when it did not come.
type slots struct {
	sem   chan struct{}
	freed chan struct{} // signalled whenever a slot frees
}

func newSlots(n int) *slots {
	return &slots{sem: make(chan struct{}, n), freed: make(chan struct{}, 1)}
}

// free gives one slot back.
func (s *slots) free() {
	<-s.sem
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// inUse is how many slots are taken.
func (s *slots) inUse() int { return len(s.sem) }

// pull sends pull requests on cons for free slots of sl until ctx ends or
// a request fails (the consumer is then re-attached by the caller).
//
// With batch 1 (the sync consumer) it keeps one pull request for one
// message open at a time, sending the next as soon as a message arrives:
// the server serves waiting pull requests in arrival order, so jobs are
// spread over the workers in turn instead of filling the first worker's
// large request (a few big instances on one worker while others idle).
// Larger batches (delete jobs, which are many and small) may overlap.
//
// Overlapping requests that a burst split into one per freed slot are
// merged again when the queue runs dry: once a request ends short of its
// batch (it expired: nothing was left to deliver), no new request is sent
// until every open one has ended, and then one asks for all free slots.
// Otherwise each expiring fragment asked again for its own slot, and an
// idle worker kept one request (and two goroutines) per slot open.
//
// It keeps at most window() slots in use (window may be nil: all of
// them): while the window is full no request is sent, until a job ends
// or the window grows (read every windowPoll).
//
// While backlogged (may be nil) reports true — a sync job here waits for
// an apply slot — no new request is sent (checked every backlogPoll):
// the jobs stay in the stream for workers that can start them, instead
// of queueing behind this worker's applies (at 40 instances and more,
// one worker had taken half of them and held some for minutes, until
// discovery gave up on their results and sent them to another worker).
func pull(ctx context.Context, log *slog.Logger, cons jetstream.Consumer, sl *slots, batchMax int,
	backlogged func() bool, window func() int, dispatch func(jetstream.Msg)) {
	actx, cancel := context.WithCancel(ctx)
	r := &requests{slots: sl, broken: make(chan error, 1), ended: make(chan struct{}, 1)}
	defer func() {
		cancel() // ends the open pull requests
		r.batches.Wait()
	}()
	for {
		acquire := r.acquirable()
		limit := cap(sl.sem)
		if window != nil {
			limit = max(1, min(limit, window()))
		}
		var resume <-chan time.Time
		switch {
		case backlogged != nil && backlogged():
			// Saturated: leave the next jobs to workers with a free apply slot.
			acquire, resume = nil, time.After(backlogPoll)
		case acquire != nil && sl.inUse() >= limit:
			// The window is full: wait for a job to end or the window to grow.
			acquire, resume = nil, time.After(windowPoll)
		}
		select {
		case acquire <- struct{}{}:
		case <-sl.freed:
			continue
		case <-resume:
			continue
		case <-r.ended:
			continue
		case err := <-r.broken:
			log.Warn("consumer interrupted, re-attaching", "error", err)
			return
		case <-actx.Done():
			return
		}
		n := 1
	take:
		for n < batchMax && sl.inUse() < limit {
			select {
			case sl.sem <- struct{}{}:
				n++
			default:
				break take
			}
		}
		fctx, fcancel := context.WithTimeout(actx, pullWait)
		batch, err := cons.Fetch(n, jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(pullHeartbeat))
		if err != nil {
			fcancel()
			for range n {
				sl.free()
			}
			if ctx.Err() == nil {
				log.Warn("pull failed, re-attaching", "error", err)
				Sleep(ctx, 100*time.Millisecond)
			}
			return
		}
		r.opened()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer r.batches.Done()
			defer fcancel()
			r.drain(actx, batch, n, dispatch)
		}()
		if batchMax == 1 {
			select {
			case <-done:
			case <-actx.Done():
			}
		}
	}
}

// requests tracks the open pull requests of one pull.
type requests struct {
	slots   *slots
	batches sync.WaitGroup
	broken  chan error    // a request failed: the consumer is to be re-attached
	ended   chan struct{} // a request ended

	mu   sync.Mutex
	open int  // pull requests not ended
	dry  bool // a request expired short of its batch
}

// acquirable returns the slots to acquire for the next request, or nil
// while requests are to be merged: a request expired short of its batch
// and others are still open.
func (r *requests) acquirable() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dry && r.open > 0 {
		return nil // merge: wait for the open requests to end
	}
	r.dry = false
	return r.slots.sem
}

func (r *requests) opened() {
	r.batches.Add(1)
	r.mu.Lock()
	r.open++
	r.mu.Unlock()
}

// drain dispatches the messages of batch, a request for n, frees the
// slots of those that did not come, and reports its end (and its error,
// unless actx ended or it merely expired).
func (r *requests) drain(actx context.Context, batch jetstream.MessageBatch, n int, dispatch func(jetstream.Msg)) {
	got := 0
	for msg := range batch.Messages() {
		got++
		dispatch(msg)
	}
	for range n - got {
		r.slots.free()
	}
	r.mu.Lock()
	r.open--
	r.dry = r.dry || got < n
	r.mu.Unlock()
	select {
	case r.ended <- struct{}{}:
	default:
	}
	if err := batch.Error(); err != nil && actx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		select {
		case r.broken <- err:
		default:
		}
	}
}
