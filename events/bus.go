package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config holds the JetStream layout of one matbus installation. The zero
// value of every field means its documented default.
type Config struct {
	// Prefix is the first subject token(s); default "mat".
	Prefix string
	// Source names this process in the envelope's "source" attribute, e.g. "worker/pod-a".
	Source string
	// Replicas of every stream: 1 (the default) to MaxReplicas. More than
	// one needs a JetStream cluster of at least that many servers;
	// EnsureStreams changes the replicas of existing streams to it (see
	// ErrReplicas).
	Replicas int
	// Memory keeps streams in memory instead of files (tests, `matbus dev`).
	Memory bool
	// DuplicateWindow is how long JetStream remembers Nats-Msg-Id values; default 2 min.
	DuplicateWindow time.Duration
	// ErrorMaxAge and ErrorMaxBytes bound the error stream; defaults 24 h and 64 MiB.
	ErrorMaxAge   time.Duration
	ErrorMaxBytes int64
	// SyncJobsPerInstance is how many sync jobs one instance may have
	// waiting (older ones are dropped: a sync is level-triggered); default 2.
	SyncJobsPerInstance int64
	// AckWait is how long a delivered job may stay unacknowledged before
	// redelivery; handlers send progress more often. Default 30 s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one job; default 5. The last failed
	// delivery produces an error event and the job is terminated.
	MaxDeliver int
	// MaxAckPending bounds jobs in flight per durable consumer over all
	// workers; default 512.
	MaxAckPending int
	// Namespace is the pipeline's namespace, the first token of every
	// instance key it handles. When set, the job consumers are per
	// namespace (ConsumerName) and filtered to its subjects, and Instances
	// and SubscribeResults see only its keys, so pipelines of several
	// namespaces share one NATS and prefix without crossing. It must be a
	// DNS label (see Key). Empty means every namespace: fine for readers
	// such as `matbus errors`, and for a single pipeline on the prefix.
	Namespace string
	// KeepStreams has EnsureStreams create the streams that are missing
	// and leave existing ones as they are, whatever their settings: the
	// workers' mode. The discovery publisher keeps the layout (replicas,
	// limits), and a worker's NATS identity may not update a stream, since
	// an update could map a subject the worker may publish onto instance
	// events or sync jobs (docs/adr/0025-nats-identities.md).
	KeepStreams bool
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Source == "" {
		c.Source = "matbus"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.ErrorMaxAge == 0 {
		c.ErrorMaxAge = 24 * time.Hour
	}
	if c.ErrorMaxBytes == 0 {
		c.ErrorMaxBytes = 64 << 20
	}
	if c.SyncJobsPerInstance == 0 {
		c.SyncJobsPerInstance = 2
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 5
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 512
	}
	return c
}

// MaxReplicas is the most replicas JetStream keeps of a stream.
const MaxReplicas = 5

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

// Bus is matbus's handle on JetStream: layout, publishing and reads of the
// instance stream. It is safe for concurrent use.
type Bus struct {
	js       jetstream.JetStream
	subjects Subjects
	cfg      Config
	log      *slog.Logger

	mu        sync.Mutex
	published map[Type]int64    // Publish calls that succeeded, by event type
	failed    map[Type]int64    // Publish calls that gave up, by event type
	refused   map[string]string // stream → the last refused replica change, as logged; "<stream>/storage" → the storage kept

	instances jetstream.Stream // handle of the instances stream, once looked up (see instancesStream)

	readMu sync.Mutex
	reads  map[string]*instanceReads // instance key → its coalesced LastInstance reads
}

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

// New returns a Bus on nc. It returns an error for an invalid prefix.
func New(nc *nats.Conn, cfg Config, log *slog.Logger) (*Bus, error) {
	cfg = cfg.withDefaults()
	if err := ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("events: jetstream: %w", err)
	}
	if cfg.Replicas < 1 || cfg.Replicas > MaxReplicas {
		return nil, fmt.Errorf("events: %d stream replicas: want 1 to %d", cfg.Replicas, MaxReplicas)
	}
	if cfg.Namespace != "" {
		if _, err := Key(cfg.Namespace, "x"); err != nil {
			return nil, fmt.Errorf("events: pipeline namespace: %w", err)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Bus{js: js, subjects: Subjects{Prefix: cfg.Prefix}, cfg: cfg, log: log,
		published: map[Type]int64{}, failed: map[Type]int64{}, refused: map[string]string{}}, nil
}

// Config returns the effective configuration (defaults filled in).
func (b *Bus) Config() Config { return b.cfg }

// Subjects returns the subject names under this bus's prefix.
func (b *Bus) Subjects() Subjects { return b.subjects }

// Role names one of matbus's streams (or its state bucket) independently
// of the subject prefix; StreamName turns it into the name on the server.
type Role string

// The stream roles, and the state bucket's.
const (
	StreamInstances Role = "INSTANCES" // last instance event per instance
	StreamSync      Role = "SYNC"      // sync and clean-up jobs (work queue)
	StreamDelete    Role = "DELETE"    // Service delete jobs (work queue)
	StreamErrors    Role = "ERRORS"    // error events (limits)
	BucketState     Role = "STATE"     // the discovery leader's key-value bucket (its stream is KV_<name>)
)

// StreamName returns the name of the stream (or bucket) of role under this
// bus's prefix, e.g. "MAT_SYNC" for StreamSync under prefix "mat".
func (b *Bus) StreamName(role Role) string {
	p := strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(b.cfg.Prefix))
	return p + "_" + string(role)
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

// InstanceRecord is the last event stored for one instance subject.
type InstanceRecord struct {
	Type     Type // TypeInstanceAppeared or TypeInstanceGone
	Instance Instance
	Seq      uint64
	Time     time.Time
	// Epoch is the term of the leader that published it (nil: none).
	Epoch *Epoch
}

// Present reports whether the instance currently exists.
func (r InstanceRecord) Present() bool { return r.Type == TypeInstanceAppeared }

// LastInstance reads the current record of instance key straight from the
// instances stream (the lister of this system). found is false when the
// instance was never announced. A stored message that does not decode is
// returned as an error wrapping ErrMalformed (or ErrUnknownSchema/ErrUnknownType).
//
// Concurrent calls for one key share reads, and every call still gets a
// record read after it was made: a call made while a read of its key is in
// flight joins the next read, which starts once that one has answered and
// serves every call that joined it. So a fan-out's delete jobs of one
// instance, each of which must see the newest record, cost JetStream about
// two STREAM.MSG.GET requests at a time instead of one each. The shared
// read does not end with one caller's ctx (it is bounded by JetStream's
// request timeout); a caller whose ctx ends stops waiting at once, with
// ctx's error.
func (b *Bus) LastInstance(ctx context.Context, key string) (rec InstanceRecord, found bool, err error) {
	b.readMu.Lock()
	if b.reads == nil {
		b.reads = make(map[string]*instanceReads)
	}
	st := b.reads[key]
	if st == nil {
		st = &instanceReads{}
		b.reads[key] = st
	}
	r, prev, lead := st.pending, (*instanceRead)(nil), false
	if r == nil {
		r, lead = &instanceRead{done: make(chan struct{})}, true
		if st.running == nil {
			st.running = r
		} else {
			st.pending, prev = r, st.running
		}
	}
	b.readMu.Unlock()
	if lead {
		go b.runRead(context.WithoutCancel(ctx), key, st, r, prev)
	}
	select {
	case <-r.done:
		return r.rec, r.found, r.err
	case <-ctx.Done():
		return rec, false, ctx.Err()
	}
}

// runRead performs the shared read r of key once prev (the read in flight
// when r was made, or nil) has answered, and closes r.done. ctx carries no
// cancellation of any one caller: JetStream's request timeout (5 s when ctx
// has no deadline) bounds the read, and so this goroutine.
func (b *Bus) runRead(ctx context.Context, key string, st *instanceReads, r, prev *instanceRead) {
	if prev != nil {
		<-prev.done
		b.readMu.Lock()
		st.running, st.pending = r, nil
		b.readMu.Unlock()
	}
	r.rec, r.found, r.err = b.readInstance(ctx, key)
	b.readMu.Lock()
	if st.running == r {
		st.running = nil
		if st.pending == nil {
			delete(b.reads, key)
		}
	}
	b.readMu.Unlock()
	close(r.done)
}

// instanceReads are the LastInstance reads of one key: the one in flight
// and the one that starts after it, which calls made meanwhile join.
type instanceReads struct {
	running, pending *instanceRead
}

// instanceRead is one shared read; its result is set before done closes.
type instanceRead struct {
	done  chan struct{}
	rec   InstanceRecord
	found bool
	err   error
}

// readInstance is one STREAM.MSG.GET of key's last record (LastInstance).
func (b *Bus) readInstance(ctx context.Context, key string) (rec InstanceRecord, found bool, err error) {
	s, err := b.instancesStream(ctx)
	if err != nil {
		return rec, false, err
	}
	m, err := s.GetLastMsgForSubject(ctx, b.subjects.Instance(key))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rec, false, nil
	}
	if err != nil {
		b.forgetInstancesStream(s)
		return rec, false, fmt.Errorf("events: read instance %s: %w", key, err)
	}
	rec, err = decodeInstanceRecord(m.Data)
	if err == nil && rec.Instance.Key != key {
		err = fmt.Errorf("%w: record on %s names instance %q", ErrMalformed, m.Subject, rec.Instance.Key)
	}
	rec.Seq, rec.Time = m.Sequence, m.Time
	return rec, err == nil, err
}

// instancesStream returns the instances stream's handle, looked up (one
// STREAM.INFO request) on first use and kept: a message read by subject
// needs only the stream's name, so a delete job costs one JetStream request,
// not two. Errors: the stream cannot be looked up (not created yet, NATS
// unreachable).
func (b *Bus) instancesStream(ctx context.Context) (jetstream.Stream, error) {
	b.mu.Lock()
	s := b.instances
	b.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return nil, fmt.Errorf("events: instances stream: %w", err)
	}
	b.mu.Lock()
	b.instances = s
	b.mu.Unlock()
	return s, nil
}

// forgetInstancesStream drops the kept handle s after a failed read, so the
// next read looks the stream up again (it may have been re-created with
// another configuration).
func (b *Bus) forgetInstancesStream(s jetstream.Stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.instances == s {
		b.instances = nil
	}
}

func decodeInstanceRecord(body []byte) (InstanceRecord, error) {
	env, err := Decode(body)
	if err != nil {
		return InstanceRecord{}, err
	}
	inst, err := Into[Instance](env, TypeInstanceAppeared, TypeInstanceGone)
	if err != nil {
		return InstanceRecord{}, err
	}
	return InstanceRecord{Type: env.Type, Instance: inst, Epoch: env.Epoch}, nil
}

// InstanceNamespaces returns, sorted, the namespaces that have at least
// one instance record (present or gone) in the instances stream under this
// bus's subject prefix: those where a discovery has published. Errors: the
// stream or its info cannot be read (jetstream.ErrStreamNotFound when no
// discovery ever started under this prefix).
func (b *Bus) InstanceNamespaces(ctx context.Context) ([]string, error) {
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return nil, fmt.Errorf("events: instances stream: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(b.subjects.Instances()))
	if err != nil {
		return nil, fmt.Errorf("events: instances stream info: %w", err)
	}
	seen := map[string]bool{}
	for subj := range info.State.Subjects {
		if ns, _, ok := strings.Cut(strings.TrimPrefix(subj, b.subjects.p()+".instances."), "."); ok && ns != "" {
			seen[ns] = true
		}
	}
	out := make([]string, 0, len(seen))
	for ns := range seen {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, nil
}

// Instances returns the current record of every instance subject of the
// bus's namespace (every namespace when Config.Namespace is empty), keyed by
// instance key. Records that do not decode are skipped and their keys
// returned in bad, so the caller can report them.
func (b *Bus) Instances(ctx context.Context) (recs map[string]InstanceRecord, bad []string, err error) {
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return nil, nil, fmt.Errorf("events: instances stream: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(b.subjects.InstancesIn(b.cfg.Namespace)))
	if err != nil {
		return nil, nil, fmt.Errorf("events: instances stream info: %w", err)
	}
	recs = make(map[string]InstanceRecord, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("events: read %s: %w", subj, err)
		}
		key := strings.TrimPrefix(subj, b.subjects.p()+".instances.")
		rec, err := decodeInstanceRecord(m.Data)
		if err == nil && rec.Instance.Key != key {
			err = ErrMalformed
		}
		if err != nil {
			bad = append(bad, key)
			continue
		}
		rec.Seq, rec.Time = m.Sequence, m.Time
		recs[key] = rec
	}
	slices.Sort(bad)
	return recs, bad, nil
}
