// Readers past the publish and instance helpers: ordered consumers of a
// stream (instance events for workers, error events for tools) and the
// number of messages a stream stores on a subject.

package events

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// OrderedConsumer returns an ordered consumer (ephemeral, in order,
// re-created by the client after a gap) on the stream of role, for readers
// that need no durable state: a worker following instance events, or
// `matbus errors` and `matbus status` reading error events. Its error is
// JetStream's, unwrapped (jetstream.ErrStreamNotFound while the stream
// does not exist). A reader that is done calls DropConsumer.
func (b *Bus) OrderedConsumer(ctx context.Context, role Role, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	return b.js.OrderedConsumer(ctx, b.StreamName(role), cfg)
}

// DropConsumer deletes the current server-side consumer of cons (an
// ordered consumer of OrderedConsumer) on the stream of role, waiting at
// most 2 s, also when ctx has ended. Errors are ignored: a consumer with an
// InactiveThreshold is removed by the server anyway.
func (b *Bus) DropConsumer(ctx context.Context, role Role, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = b.js.DeleteConsumer(ctx, b.StreamName(role), info.Name)
}

// StoredMessages returns how many messages the stream of role stores on
// subject (wildcards allowed), from one STREAM.INFO request. Errors: the
// stream or its info cannot be read, wrapped.
func (b *Bus) StoredMessages(ctx context.Context, role Role, subject string) (int64, error) {
	s, err := b.js.Stream(ctx, b.StreamName(role))
	if err != nil {
		return 0, fmt.Errorf("events: stream %s: %w", b.StreamName(role), err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("events: stream %s info: %w", b.StreamName(role), err)
	}
	var n int64
	for _, c := range info.State.Subjects {
		n += int64(c)
	}
	return n, nil
}
