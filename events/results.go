package events

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// PublishResult sends r on Subjects.Result(r.Key) over core NATS, encoded
// as an event of TypeSyncResult with envelope id id. Results are not
// stored: a result lost while the scheduler is away only delays the
// instance's next job until the scheduler's in-flight deadline.
func (b *Bus) PublishResult(id string, r SyncResult) error {
	body, err := Encode(TypeSyncResult, id, b.cfg.Source, time.Now(), r)
	if err != nil {
		return err
	}
	if err := b.js.Conn().Publish(b.subjects.Result(r.Key), body); err != nil {
		b.count(TypeSyncResult, err)
		return fmt.Errorf("events: publish result of %s: %w", r.Key, err)
	}
	b.count(TypeSyncResult, nil)
	return nil
}

// SubscribeResults calls fn for every sync result published under this
// bus's prefix for its namespace (every namespace when Config.Namespace is
// empty), from the connection's dispatch goroutine (fn must not
// block for long). A message that does not decode, or whose key does not
// match its subject, is passed to bad with the reason. Unsubscribe the
// returned subscription to stop.
func (b *Bus) SubscribeResults(fn func(SyncResult), bad func(subject string, err error)) (*nats.Subscription, error) {
	subject := b.subjects.ResultsIn(b.cfg.Namespace)
	sub, err := b.js.Conn().Subscribe(subject, func(m *nats.Msg) {
		env, err := Decode(m.Data)
		var r SyncResult
		if err == nil {
			r, err = Into[SyncResult](env, TypeSyncResult)
		}
		if err == nil {
			if k, ok := KeyFromSubject(m.Subject); !ok || k != r.Key {
				err = fmt.Errorf("%w: result for %q on %s", ErrMalformed, r.Key, m.Subject)
			}
		}
		if err != nil {
			if bad != nil {
				bad(m.Subject, err)
			}
			return
		}
		fn(r)
	})
	if err != nil {
		return nil, fmt.Errorf("events: subscribe %s: %w", subject, err)
	}
	return sub, nil
}
