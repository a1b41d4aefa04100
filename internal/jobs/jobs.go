package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// Handler handles one decoded job message of subject. It returns nil when
// the job is done (the message is acknowledged), or an error: see Retry,
// Terminate and Reported for what becomes of the message; any other error
// terminates it with an error event. A Handler returns context.Canceled
// (or any error once ctx ended) for a job cut short by shutdown, which is
// left for redelivery.
type Handler func(ctx context.Context, env events.Envelope, subject string) error

// Error is a job failure that says what becomes of the message: Retry asks
// for redelivery (a nak with a delay of 2 s per delivery so far, until
// MaxDeliver deliveries; then an error event and a term), otherwise the
// message is terminated. Reported is true when the handler already
// published the failure as an error event, so the runtime publishes none
// for a term.
type Error struct {
	Retry    bool
	Reported bool
	Err      error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Retry is a transient failure: the job is delivered again.
func Retry(err error) *Error { return &Error{Retry: true, Err: err} }

// Terminate is a permanent failure: the job is terminated with an error event.
func Terminate(err error) *Error { return &Error{Err: err} }

// Reported is a permanent failure the handler already published as an
// error event: the job is terminated without another one.
func Reported(err error) *Error { return &Error{Reported: true, Err: err} }

// Outcome is what became of one job message.
type Outcome int

const (
	// OK: acknowledged, the job's effect is done.
	OK Outcome = iota
	// Retried: nak'ed for redelivery (a transient failure, or shutdown cut it short).
	Retried
	// Failed: its last allowed delivery failed (error event, terminated).
	Failed
	// Terminated: refused at once, a permanent failure (error event, terminated).
	Terminated
	// Undecodable: not an event at all (error event, terminated); no handler ran.
	Undecodable
)

// Options configure Run. Attach, Report and Log are required.
type Options struct {
	// Name names the consumer in logs.
	Name string
	// Slots is how many messages are running or requested at once, at
	// most.
	Slots int
	// Window, when set, is how many of the Slots may be in use now: the
	// runtime holds the messages running or requested to min(Slots,
	// Window()), read whenever a job ends and every windowPoll while the
	// window is full. A window that shrinks below what is in use takes no
	// message away; no new one is requested until use falls below it.
	Window func() int
	// OneAtATime keeps one pull request for one message open at a time
	// (see pull); otherwise a request asks for every free slot.
	OneAtATime bool
	// PerSubject lets at most one job per subject run at a time here
	// (see subjectGate).
	PerSubject bool
	// Superseded, with PerSubject, is told of each waiting job that was
	// acknowledged unrun because a newer job of its subject arrived.
	Superseded func(jetstream.Msg)
	// Backlogged, when set and true, holds back new pull requests
	// (checked every backlogPoll).
	Backlogged func() bool
	// Paused, when set and true, holds back new pull requests (checked
	// every backlogPoll) and hands every message that still arrives (from
	// a request sent before) back at once, unrun: a nak without delay, so
	// another worker takes it.
	Paused func() bool
	// AckWait is the consumer's ack wait: running and waiting jobs report
	// progress every AckWait/3.
	AckWait time.Duration
	// MaxDeliver is the consumer's delivery bound: a retried job on its
	// MaxDeliver-th delivery gives up.
	MaxDeliver int
	// Attach returns the consumer, creating it (and its stream) when
	// missing; it is called again whenever the consumer is lost.
	Attach func(ctx context.Context) (jetstream.Consumer, error)
	// Report publishes an error event.
	Report func(ctx context.Context, e events.Error)
	// Ended, when set, is told of every message's outcome, the job's
	// type ("" when undecodable) and how long its handler ran (-1 when
	// none ran).
	Ended func(t events.Type, o Outcome, took time.Duration)
	// Cause describes the error of a job that gave up in its error event;
	// default err.Error().
	Cause func(error) string
	Log   *slog.Logger
}

// Run consumes the durable pull consumer of o.Attach with h until ctx
// ends, re-attaching (with backoff from 100 ms to 5 s) whenever the
// consumer is lost: deleted, stream re-created, or heartbeats missing
// after a server restart. Jobs run under hard, which should end some
// grace after ctx (see Grace): when ctx ends no new message is taken,
// messages received but not started are nak'ed, and Run returns once
// every running job returned.
//
// It keeps exactly o.Slots messages either running or requested:
// whenever slots free up it sends a new pull request for just that many,
// without waiting for earlier requests to fill or expire, so a job that
// ends frees its slot for the next message at once (pull requests
// overlap). A message is never held in a client-side buffer behind slow
// jobs, where AckWait would run out without progress and JetStream would
// redeliver it.
func Run(ctx, hard context.Context, h Handler, o Options) {
	if o.Cause == nil {
		o.Cause = func(err error) string { return err.Error() }
	}
	log := o.Log.With("consumer", o.Name)
	sl := newSlots(o.Slots)
	var gate *subjectGate
	if o.PerSubject {
		gate = newSubjectGate(o.AckWait / 3)
		gate.superseded = o.Superseded
		defer gate.release() // jobs still waiting are left for redelivery
	}
	var inflight sync.WaitGroup
	defer inflight.Wait()
	paused := func() bool { return o.Paused != nil && o.Paused() }
	dispatch := func(msg jetstream.Msg) {
		if ctx.Err() != nil || paused() {
			_ = msg.Nak()
			sl.free()
			return
		}
		if gate != nil && !gate.admit(msg) {
			sl.free() // held until its subject's running job ends
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer sl.free()
			o.runJob(hard, msg, h)
			if gate == nil {
				return
			}
			// Then the jobs of this subject that arrived meanwhile (at
			// most one waits); at shutdown they are left for redelivery.
			for next := gate.done(msg.Subject()); next != nil; next = gate.done(msg.Subject()) {
				if ctx.Err() != nil || paused() {
					_ = next.Nak()
					continue
				}
				o.runJob(hard, next, h)
			}
		}()
	}
	batch := o.Slots
	if o.OneAtATime {
		batch = 1
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		cons, err := o.Attach(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("consumer not available, retrying", "error", err, "retry_in", delay)
			if !Sleep(ctx, delay) {
				return
			}
			delay = min(delay*2, 5*time.Second)
			continue
		}
		delay = 100 * time.Millisecond
		hold := o.Backlogged
		if o.Paused != nil {
			hold = func() bool { return paused() || (o.Backlogged != nil && o.Backlogged()) }
		}
		pull(ctx, log, cons, sl, batch, hold, o.Window, dispatch)
	}
}

// runJob decodes msg, runs h with progress reports every AckWait/3, and
// acks, naks or terminates it.
func (o *Options) runJob(ctx context.Context, msg jetstream.Msg, h Handler) {
	subject := msg.Subject()
	env, err := events.Decode(msg.Data())
	if err != nil {
		o.Report(ctx, Rejected(subject, err))
		_ = msg.TermWithReason("undecodable event")
		o.ended("", Undecodable, -1)
		return
	}
	delivered := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		delivered = md.NumDelivered
	}
	started := time.Now()
	stop := keepAlive(msg, o.AckWait/3)
	err = h(ctx, env, subject)
	took := time.Since(started)
	stop()
	o.settle(ctx, msg, env.Type, delivered, took, err)
}

// settle acks, naks or terminates msg after its handler returned err.
func (o *Options) settle(ctx context.Context, msg jetstream.Msg, typ events.Type, delivered uint64, took time.Duration, err error) {
	subject := msg.Subject()
	key, _ := events.KeyFromSubject(subject)
	var je *Error
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			o.Log.Debug("ack failed; the job will be redelivered and is idempotent", "subject", subject, "error", aerr)
		}
		o.ended(typ, OK, took)
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		// Shutdown: leave it for another worker, report nothing.
		_ = msg.Nak()
		o.ended(typ, Retried, took)
	case errors.As(err, &je) && je.Retry:
		if delivered >= uint64(o.MaxDeliver) {
			o.ended(typ, Failed, took)
			// The event names the cause, not the Service (that is in the log), so
			// the jobs one fault exhausts share one event per rate-limit window.
			o.Log.Warn("job gave up", "subject", subject, "deliveries", delivered, "error", err)
			o.Report(ctx, events.Error{Kind: kindOf(typ), Instance: key, Subject: subject,
				Message: fmt.Sprintf("job gave up after %d deliveries: %s", delivered, o.Cause(err)), Attempts: int(delivered)})
			_ = msg.TermWithReason("deliveries exhausted")
			return
		}
		_ = msg.NakWithDelay(time.Duration(delivered) * 2 * time.Second)
		o.ended(typ, Retried, took)
	default:
		o.ended(typ, Terminated, took)
		if !(errors.As(err, &je) && je.Reported) {
			o.Report(ctx, events.Error{Kind: kindOf(typ), Instance: key, Subject: subject,
				Message: err.Error(), Permanent: true, Attempts: int(delivered)})
		}
		_ = msg.TermWithReason("permanent failure")
	}
}

func (o *Options) ended(t events.Type, oc Outcome, took time.Duration) {
	if o.Ended != nil {
		o.Ended(t, oc, took)
	}
}

// keepAlive tells JetStream every `every` that msg is in progress, until
// the returned stop is called (stop waits for the last report).
func keepAlive(msg jetstream.Msg, every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// Rejected is the error event of a message that is refused as it is
// (undecodable, of a wrong type, of another instance than its subject's):
// kind event, permanent.
func Rejected(subject string, err error) events.Error {
	key, _ := events.KeyFromSubject(subject)
	return events.Error{Kind: events.ErrorEvent, Subject: subject, Instance: key,
		Message: fmt.Sprintf("rejected message: %v", err), Permanent: true}
}

// kindOf is the error kind of a failed job of type t: delete for delete
// and clean-up jobs, update for the rest.
func kindOf(t events.Type) events.ErrorKind {
	switch t {
	case events.TypeDeleteJob, events.TypeCleanupJob:
		return events.ErrorDelete
	default:
		return events.ErrorUpdate
	}
}
