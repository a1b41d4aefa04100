// The layout of the bus: streams and durable job consumers, created when
// missing and updated when their settings differ (EnsureStreams,
// EnsureConsumer). The discovery leader's state bucket is in state.go.

package events

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrReplicas is wrapped by the error of EnsureStreams (and so of
// whatever calls it) when NATS refuses the replica count of a stream it
// creates, and by the error it logs when NATS refuses to change an
// existing stream's count: a single server takes only 1, a cluster no more
// than it has JetStream servers up ("insufficient resources"). It is a
// configuration error: retrying helps only once servers join.
var ErrReplicas = errors.New("stream replicas refused by NATS")

// The two job consumer roles. With Config.Namespace set, the durable
// consumer of a role is named ConsumerName(role, namespace), e.g.
// "matbus-sync-team-a"; without it, the role itself.
const (
	SyncConsumer   = "matbus-sync"
	DeleteConsumer = "matbus-delete"
)

// ConsumerName returns the durable name of the job consumer of role
// (SyncConsumer or DeleteConsumer) shared by the workers of namespace ns:
// "<role>-<ns>", or role when ns is empty.
func ConsumerName(role, ns string) string {
	if ns == "" {
		return role
	}
	return role + "-" + ns
}

// StreamConfigs returns the four stream configurations:
// instances (last message per subject), sync and clean-up jobs (work queue,
// SyncJobsPerInstance per subject), delete jobs (work queue) and errors
// (limits: ErrorMaxAge, ErrorMaxBytes).
func (b *Bus) StreamConfigs() []jetstream.StreamConfig {
	st := jetstream.FileStorage
	if b.cfg.Memory {
		st = jetstream.MemoryStorage
	}
	s := b.subjects
	return []jetstream.StreamConfig{
		{
			Name: b.StreamName(StreamInstances), Description: "matbus: current MAT instances, last event per instance",
			Subjects: []string{s.Instances()}, Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1,
			Discard: jetstream.DiscardOld, Storage: st, Replicas: b.cfg.Replicas, Duplicates: b.cfg.DuplicateWindow,
		},
		{
			Name: b.StreamName(StreamSync), Description: "matbus: sync and clean-up jobs, each to one worker",
			Subjects: []string{s.SyncJobs(), s.CleanupJobs()}, Retention: jetstream.WorkQueuePolicy,
			MaxMsgsPerSubject: b.cfg.SyncJobsPerInstance, Discard: jetstream.DiscardOld,
			Storage: st, Replicas: b.cfg.Replicas, Duplicates: b.cfg.DuplicateWindow,
		},
		{
			Name: b.StreamName(StreamDelete), Description: "matbus: Service delete jobs, each to one worker",
			Subjects: []string{s.DeleteJobs()}, Retention: jetstream.WorkQueuePolicy,
			Discard: jetstream.DiscardOld, Storage: st, Replicas: b.cfg.Replicas, Duplicates: b.cfg.DuplicateWindow,
		},
		{
			Name: b.StreamName(StreamErrors), Description: "matbus: error events for operators",
			Subjects: []string{s.Errors()}, Retention: jetstream.LimitsPolicy, MaxAge: b.cfg.ErrorMaxAge,
			MaxBytes: b.cfg.ErrorMaxBytes, Discard: jetstream.DiscardOld, Storage: st,
			Replicas: b.cfg.Replicas, Duplicates: b.cfg.DuplicateWindow,
		},
	}
}

// EnsureStreams creates every stream that is missing and updates those
// whose settings differ from StreamConfigs, including their replica count
// (JetStream adds or removes replicas, and the consumers' with them);
// with Config.KeepStreams it only creates the missing ones. A stream
// already as wanted is left untouched, so many processes may call it at
// once. When NATS refuses the replica count of a new stream the
// error wraps ErrReplicas and says why in words; when it refuses to change
// an existing stream's count, the stream keeps the count it has (its other
// settings are still updated), the refusal is logged at error level once
// per stream and cause, and the next call tries again.
func (b *Bus) EnsureStreams(ctx context.Context) error {
	for _, want := range b.StreamConfigs() {
		if err := b.ensureStream(ctx, want); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bus) ensureStream(ctx context.Context, want jetstream.StreamConfig) error {
	s, err := b.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = b.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil // another process won the race
		}
		if err != nil {
			return fmt.Errorf("events: create stream %s: %w", want.Name, replicasErr(err, want.Replicas, 0))
		}
		b.log.Info("stream created", "stream", want.Name, "replicas", want.Replicas)
		return nil
	}
	if err != nil {
		return fmt.Errorf("events: look up stream %s: %w", want.Name, err)
	}
	if b.cfg.KeepStreams {
		return nil // the discovery publisher updates it
	}
	have := s.CachedInfo().Config
	if have.Storage != want.Storage {
		// JetStream cannot change a stream's storage: the stream works as
		// it is (another process, e.g. `matbus dev`, created it), so keep
		// its storage, say so once, and update the rest.
		b.storageOnce(want.Name, have.Storage, want.Storage)
		want.Storage = have.Storage
	}
	if streamSame(have, want) {
		return nil
	}
	if _, err := b.js.UpdateStream(ctx, want); err != nil {
		err = replicasErr(err, want.Replicas, have.Replicas)
		if !errors.Is(err, ErrReplicas) || have.Replicas == want.Replicas {
			return fmt.Errorf("events: update stream %s: %w", want.Name, err)
		}
		// The stream works with the replicas it has: keep them, say so
		// once, and try again at the next call (servers may join).
		b.refusedOnce(want.Name, err)
		keep := want
		keep.Replicas = have.Replicas
		if streamSame(have, keep) {
			return nil
		}
		if _, err := b.js.UpdateStream(ctx, keep); err != nil {
			return fmt.Errorf("events: update stream %s: %w", want.Name, err)
		}
		b.log.Info("stream updated", "stream", want.Name, "replicas", have.Replicas)
		return nil
	}
	b.refusedOnce(want.Name, nil)
	if have.Replicas != want.Replicas {
		b.log.Info("stream updated", "stream", want.Name, "replicas_from", have.Replicas, "replicas", want.Replicas)
	} else {
		b.log.Info("stream updated", "stream", want.Name)
	}
	return nil
}

// refusedOnce logs err (a refused replica change of stream) at error level
// when it differs from the last one logged for that stream; nil forgets
// it (the change went through).
func (b *Bus) refusedOnce(stream string, err error) {
	b.mu.Lock()
	last, had := b.refused[stream]
	if err == nil {
		delete(b.refused, stream)
	} else {
		b.refused[stream] = err.Error()
	}
	b.mu.Unlock()
	if err != nil && last != err.Error() {
		b.log.Error("stream keeps its replicas: NATS refused the change (retried at the next stream check)", "stream", stream, "error", err)
	}
	if err == nil && had {
		b.log.Info("stream replicas changed after an earlier refusal", "stream", stream)
	}
}

// storageOnce logs at error level, once per stream, that stream keeps its
// have storage although this process is configured for want.
func (b *Bus) storageOnce(stream string, have, want jetstream.StorageType) {
	key := stream + "/storage"
	b.mu.Lock()
	_, had := b.refused[key]
	b.refused[key] = have.String()
	b.mu.Unlock()
	if !had {
		b.log.Error("stream keeps its storage: JetStream cannot change a stream's storage type (delete the stream to change it)",
			"stream", stream, "storage", have.String(), "configured", want.String())
	}
}

// JetStream API error codes of a replica count the servers cannot place.
const (
	jsErrNoPeers               = 10005 // "no suitable peers for placement"
	jsErrInsufficientResources = 10023
	jsErrReplicasNotUpdatable  = 10061
	jsErrReplicasNotSupported  = 10074 // "replicas > 1 not supported in non-clustered mode"
)

// replicasErr returns err as is unless NATS refused a stream of want
// replicas (had: the stream's current count, 0 when creating), in which
// case it wraps ErrReplicas and err with an explanation.
func replicasErr(err error, want, had int) error {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return err
	}
	change := fmt.Sprintf("%d replicas", want)
	if had != 0 && had != want {
		change = fmt.Sprintf("a change from %d to %d replicas", had, want)
	}
	switch api.ErrorCode {
	case jsErrNoPeers, jsErrInsufficientResources:
		return fmt.Errorf("%w: NATS cannot place %s (%q): the cluster has fewer JetStream servers up than --stream-replicas asks, or they lack storage; lower it or add servers: %w",
			ErrReplicas, change, api.Description, err)
	case jsErrReplicasNotSupported:
		return fmt.Errorf("%w: NATS refuses %s (%q): the server is not part of a JetStream cluster; use --stream-replicas 1: %w",
			ErrReplicas, change, api.Description, err)
	case jsErrReplicasNotUpdatable:
		return fmt.Errorf("%w: NATS refuses %s (%q): re-create the stream or keep its replica count: %w",
			ErrReplicas, change, api.Description, err)
	}
	return err
}

// streamSame compares the settings matbus sets; the server reports unset
// limits as -1 where the request had 0.
func streamSame(a, b jetstream.StreamConfig) bool {
	lim := func(v int64) int64 { return max(v, 0) }
	return slices.Equal(a.Subjects, b.Subjects) && a.Retention == b.Retention &&
		lim(a.MaxMsgsPerSubject) == lim(b.MaxMsgsPerSubject) && a.MaxAge == b.MaxAge && lim(a.MaxBytes) == lim(b.MaxBytes) &&
		a.Discard == b.Discard && a.Storage == b.Storage && a.Replicas == b.Replicas &&
		a.Duplicates == b.Duplicates && a.Description == b.Description
}

// ConsumerConfig returns the durable pull consumer configuration of role
// (SyncConsumer or DeleteConsumer): named ConsumerName(role, Namespace),
// and with a namespace filtered to that namespace's job subjects.
func (b *Bus) ConsumerConfig(role string) jetstream.ConsumerConfig {
	ns := b.cfg.Namespace
	cfg := jetstream.ConsumerConfig{
		Durable:       ConsumerName(role, ns),
		Description:   "matbus workers share these jobs",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       b.cfg.AckWait,
		MaxDeliver:    b.cfg.MaxDeliver,
		MaxAckPending: b.cfg.MaxAckPending,
	}
	if ns != "" {
		cfg.Description = "matbus workers of namespace " + ns + " share these jobs"
		if role == DeleteConsumer {
			cfg.FilterSubjects = []string{b.subjects.DeleteJobsIn(ns)}
		} else {
			cfg.FilterSubjects = []string{b.subjects.SyncJobsIn(ns), b.subjects.CleanupJobsIn(ns)}
		}
	}
	return cfg
}

// consumerStream is the stream of role's jobs.
func (b *Bus) consumerStream(role string) string {
	if role == DeleteConsumer {
		return b.StreamName(StreamDelete)
	}
	return b.StreamName(StreamSync)
}

// EnsureConsumer returns the durable pull consumer of role (SyncConsumer
// or DeleteConsumer) for this bus's namespace, creating or updating it
// when missing or different (see ConsumerConfig). A work-queue stream
// takes no two consumers that could receive the same message, so creating
// a namespace's consumer first removes the unfiltered consumer named role
// that releases without namespaces used; its unacknowledged jobs stay in
// the stream for the new consumers. It returns an error wrapping
// jetstream.ErrStreamNotFound when the stream is gone.
func (b *Bus) EnsureConsumer(ctx context.Context, role string) (jetstream.Consumer, error) {
	stream := b.consumerStream(role)
	want := b.ConsumerConfig(role)
	name := want.Durable
	c, err := b.js.Consumer(ctx, stream, name)
	if err == nil {
		have := c.CachedInfo().Config
		if have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver &&
			have.MaxAckPending == want.MaxAckPending && have.AckPolicy == want.AckPolicy &&
			slices.Equal(filters(have), filters(want)) {
			return c, nil
		}
		c, err = b.js.UpdateConsumer(ctx, stream, want)
		if err != nil {
			return nil, fmt.Errorf("events: update consumer %s: %w", name, err)
		}
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("events: look up consumer %s on %s: %w", name, stream, err)
	}
	if name != role {
		if err := b.removeUnfiltered(ctx, stream, role); err != nil {
			return nil, err
		}
	}
	c, err = b.js.CreateOrUpdateConsumer(ctx, stream, want)
	if err != nil {
		return nil, fmt.Errorf("events: create consumer %s on %s: %w", name, stream, err)
	}
	b.log.Info("consumer created", "stream", stream, "consumer", name, "filter", filters(want))
	return c, nil
}

// removeUnfiltered deletes the consumer named role on stream if it has no
// subject filter (it would take every namespace's jobs).
func (b *Bus) removeUnfiltered(ctx context.Context, stream, role string) error {
	old, err := b.js.Consumer(ctx, stream, role)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("events: look up consumer %s on %s: %w", role, stream, err)
	}
	if len(filters(old.CachedInfo().Config)) > 0 {
		return nil
	}
	if err := b.js.DeleteConsumer(ctx, stream, role); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("events: remove unfiltered consumer %s on %s: %w", role, stream, err)
	}
	b.log.Warn("unfiltered job consumer removed: workers share jobs per namespace now", "stream", stream, "consumer", role)
	return nil
}

// filters returns the subject filters of c, sorted.
func filters(c jetstream.ConsumerConfig) []string {
	out := slices.Clone(c.FilterSubjects)
	if c.FilterSubject != "" {
		out = append(out, c.FilterSubject)
	}
	slices.Sort(out)
	return out
}
