// Publishing: Publish and PublishRaw with retries across server restarts,
// the fencing options (WithGuard, WithExpectedLastSubjectSeq, WithEpoch),
// and the counts behind PublishStats.

package events

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PublishStats returns how many events of each type this Bus published
// (Publish and PublishResult; error events are counted by the Reporter)
// and how many publishes gave up, since New.
func (b *Bus) PublishStats() (published, failed map[Type]int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.published), maps.Clone(b.failed)
}

func (b *Bus) count(typ Type, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.failed[typ]++
		return
	}
	b.published[typ]++
}

// ErrWrongLastSequence is wrapped by the error of a publish with
// WithExpectedLastSubjectSeq when the subject's last stored message has
// another sequence: someone wrote the subject after the caller read it
// (for the discovery publisher: a newer leader). It is not retried.
var ErrWrongLastSequence = errors.New("events: the subject's last sequence is not the expected one")

// ErrFenced is wrapped by the error of a publish whose WithGuard check
// failed: nothing was sent by that attempt.
var ErrFenced = errors.New("events: publish fenced")

// PublishOption tunes one Publish or PublishRaw call.
type PublishOption func(*publishOpts)

type publishOpts struct {
	epoch   *Epoch
	guard   func() error
	lastSeq *uint64
}

// WithEpoch puts the leader's epoch into the envelope (Publish only: a
// body given to PublishRaw carries its own envelope).
func WithEpoch(e *Epoch) PublishOption { return func(o *publishOpts) { o.epoch = e } }

// WithGuard has check called before every attempt, retries included; when
// it returns an error nothing more is sent and the publish ends at once
// with an error wrapping ErrFenced and it. The discovery leader passes its
// lease check, so a publish that is retried across a pause is not sent
// once the lease may have passed to another process.
func WithGuard(check func() error) PublishOption { return func(o *publishOpts) { o.guard = check } }

// WithExpectedLastSubjectSeq has the stream store the message only while
// the last message on its subject has sequence seq (0: the subject has
// none), JetStream's Nats-Expected-Last-Subject-Sequence. Otherwise the
// publish fails at once with an error wrapping ErrWrongLastSequence —
// unless the subject's last message is this very message (same
// Nats-Msg-Id: an earlier attempt was stored and its ack lost), which is
// success. The server checks the sequence before the Msg-Id.
func WithExpectedLastSubjectSeq(seq uint64) PublishOption {
	return func(o *publishOpts) { o.lastSeq = &seq }
}

func publishOptions(opts []PublishOption) publishOpts {
	var o publishOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Publish encodes data as an event of typ and publishes it on subject with
// Nats-Msg-Id id, so a re-published event within DuplicateWindow is stored
// once. Transient failures (no responders while the server restarts,
// timeouts, a missing stream which it then re-creates) are retried with
// exponential backoff until ctx ends or 30 s have passed. It returns the
// last error, wrapped. opts add the leader's epoch, a guard checked before
// every attempt and an expected last sequence of the subject.
func (b *Bus) Publish(ctx context.Context, subject string, typ Type, id string, data any, opts ...PublishOption) error {
	o := publishOptions(opts)
	body, err := EncodeEpoch(typ, id, b.cfg.Source, time.Now(), o.epoch, data)
	if err != nil {
		b.count(typ, err)
		return err
	}
	err = b.PublishRaw(ctx, subject, id, body, opts...)
	b.count(typ, err)
	return err
}

// PublishRaw publishes an already encoded body; see Publish. A body larger
// than the server's max_payload (or the stream's maximum message size) is
// not retried: the error wraps nats.ErrMaxPayload or the server's answer;
// neither is a publish on a closed connection (nats.ErrConnectionClosed),
// a refused guard (ErrFenced) or a wrong last sequence
// (ErrWrongLastSequence). When retries end because ctx ended, the error
// names the last cause seen before (wrapped too), not only the context's
// error.
func (b *Bus) PublishRaw(ctx context.Context, subject, id string, body []byte, opts ...PublishOption) error {
	o := publishOptions(opts)
	bo := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(3*time.Second), backoff.WithMaxElapsedTime(30*time.Second))
	attempt := 0
	var cause error // the last failure that is not the context's
	op := func() error {
		if o.guard != nil {
			if err := o.guard(); err != nil {
				return backoff.Permanent(fmt.Errorf("%w: %w", ErrFenced, err))
			}
		}
		attempt++
		jopts := []jetstream.PublishOpt{}
		if id != "" {
			jopts = append(jopts, jetstream.WithMsgID(id))
		}
		if o.lastSeq != nil {
			jopts = append(jopts, jetstream.WithExpectLastSequencePerSubject(*o.lastSeq))
		}
		_, err := b.js.Publish(ctx, subject, body, jopts...)
		if err == nil {
			return nil
		}
		if isWrongLastSeq(err) {
			if id != "" && b.lastMsgIs(ctx, subject, id) {
				return nil // stored by an earlier attempt
			}
			return backoff.Permanent(fmt.Errorf("%w: %w", ErrWrongLastSequence, err))
		}
		if isTooBig(err) {
			return backoff.Permanent(fmt.Errorf("%w (%d bytes)", err, len(body)))
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return backoff.Permanent(err) // closed for good: retrying cannot help
		}
		if ctx.Err() != nil {
			return backoff.Permanent(err)
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			cause = err
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			// The stream may be gone (server lost its store): put it back.
			if serr := b.EnsureStreams(ctx); serr != nil {
				b.log.Debug("ensure streams after publish failure", "error", serr)
			}
		}
		b.log.Debug("publish retry", "subject", subject, "attempt", attempt, "error", err)
		return err
	}
	err := backoff.Retry(op, backoff.WithContext(bo, ctx))
	if err == nil {
		return nil
	}
	if cause != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return fmt.Errorf("events: publish %s (%d attempts): %w (gave up: %w)", subject, attempt, cause, err)
	}
	return fmt.Errorf("events: publish %s (%d attempts): %w", subject, attempt, err)
}

// isWrongLastSeq reports whether err is JetStream's answer to a failed
// expected-last-sequence check.
func isWrongLastSeq(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// lastMsgIs reports whether the last message stored on subject has
// Nats-Msg-Id id.
func (b *Bus) lastMsgIs(ctx context.Context, subject, id string) bool {
	name, err := b.js.StreamNameBySubject(ctx, subject)
	if err != nil {
		return false
	}
	s, err := b.js.Stream(ctx, name)
	if err != nil {
		return false
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	return err == nil && m.Header.Get(jetstream.MsgIDHeader) == id
}
