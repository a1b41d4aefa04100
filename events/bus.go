package events

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

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

// Bus is matbus's handle on JetStream. It is safe for concurrent use, and
// exports no field: each capability has its own file and its own state.
//   - provision.go: the layout (streams, durable job consumers;
//     the state bucket is in state.go), created or updated on demand.
//   - publish.go: publishing with retries, fencing (guard, expected last
//     sequence) and counts.
//   - instances.go: reads of the instances stream, LastInstance coalesced
//     per key.
//   - readers.go: ordered readers of a stream, and counts of stored jobs.
type Bus struct {
	js       jetstream.JetStream
	subjects Subjects
	cfg      Config
	log      *slog.Logger

	mu        sync.Mutex
	published map[Type]int64    // publish.go: Publish calls that succeeded, by event type
	failed    map[Type]int64    // publish.go: Publish calls that gave up, by event type
	refused   map[string]string // provision.go: stream → the last refused replica change, as logged; "<stream>/storage" → the storage kept

	instances jetstream.Stream // instances.go: handle of the instances stream, once looked up (see instancesStream)

	// instances.go
	readMu sync.Mutex
	reads  map[string]*instanceReads // instance key → its coalesced LastInstance reads
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
