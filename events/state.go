package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// InstanceState is what the discovery leader knows of one instance's
// scheduling, as it keeps it in the state bucket under
// StateInstanceKey(Key) for `matbus status`. It is a view, never an
// input: no component acts on it.
type InstanceState struct {
	Key string `json:"key"`
	// InRotation is false once FailedFetches consecutive status fetches
	// failed (the scheduler's backoff threshold): the instance is then
	// probed every ProbeIntervalMS instead of polled every PollIntervalMS.
	InRotation bool `json:"in_rotation"`
	// PollIntervalMS is the instance's current poll interval: the
	// scheduler's PollInterval, or longer (up to PollMaxInterval) while
	// MAT answers its polls 304 Not Modified.
	PollIntervalMS  int64 `json:"poll_interval_ms"`
	ProbeIntervalMS int64 `json:"probe_interval_ms,omitempty"`
	FailedFetches   int   `json:"failed_fetches,omitempty"`
	// LastGoodSync is when the scheduler last took a result with a good
	// fetch (synced, unchanged, or an apply failure after a good fetch);
	// zero when none is known. A new leader keeps the one its predecessor
	// wrote (and Worker, LastOutcome, LastError) until it learns newer
	// ones. It is refreshed at most every StateRefresh while nothing else
	// changes.
	LastGoodSync time.Time `json:"last_good_sync,omitzero"`
	// Worker names the worker of the last good result ("" when none).
	Worker string `json:"worker,omitempty"`
	// LastOutcome is the Outcome* of the last result (between synced and
	// unchanged refreshed like LastGoodSync); LastError its error.
	LastOutcome string `json:"last_outcome,omitempty"`
	LastError   string `json:"last_error,omitempty"`
	// Updated is when the leader wrote this entry.
	Updated time.Time `json:"updated"`
}

// LeaderState is the state bucket's entry StateLeaderKey(namespace): the
// discovery process publishing for that namespace. The leader rewrites it
// every StateRefresh, so an Updated older than a few refreshes means no
// publisher is running. A leader that steps down while it can still write
// (its term or process ends cleanly) rewrites it once more with Ended set:
// no publisher has run since Ended.
type LeaderState struct {
	Identity string    `json:"identity"`
	Since    time.Time `json:"since"`
	Updated  time.Time `json:"updated"`
	Ended    time.Time `json:"ended,omitzero"`
}

// StateRefresh is how often the discovery leader rewrites its leader entry
// and the LastGoodSync of instances whose state is otherwise unchanged.
const StateRefresh = 10 * time.Second

// StateBucket is the name of the state bucket (a JetStream key-value
// bucket, one value kept per key): "<PREFIX>_STATE", e.g. "MAT_STATE".
func (b *Bus) StateBucket() string { return b.StreamName("STATE") }

// StateInstanceKey is the state bucket's key of instance key
// ("instance.<namespace>.<name>").
func StateInstanceKey(key string) string { return "instance." + key }

// StateInstancesIn matches the instance keys of namespace ns.
func StateInstancesIn(ns string) string { return "instance." + ns + ".*" }

// StateLeaderKey is the state bucket's key of the leader of namespace ns
// ("leader.<ns>"; "leader._all" for a pipeline of every namespace).
func StateLeaderKey(ns string) string {
	if ns == "" {
		ns = "_all"
	}
	return "leader." + ns
}

// EnsureState creates the state bucket, or updates it to one value per
// key with the bus's replicas and storage (an existing bucket keeps its
// storage, logged once), and returns it.
func (b *Bus) EnsureState(ctx context.Context) (jetstream.KeyValue, error) {
	st := jetstream.FileStorage
	if b.cfg.Memory {
		st = jetstream.MemoryStorage
	}
	// A bucket's storage cannot change: keep the one it has, as
	// EnsureStreams does for streams.
	if s, err := b.JS.Stream(ctx, "KV_"+b.StateBucket()); err == nil && s.CachedInfo().Config.Storage != st {
		b.storageOnce("KV_"+b.StateBucket(), s.CachedInfo().Config.Storage, st)
		st = s.CachedInfo().Config.Storage
	}
	kv, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.StateBucket(), History: 1,
		Description: "matbus: the discovery leader's view of each instance, for matbus status", Replicas: b.cfg.Replicas, Storage: st})
	if err != nil {
		return nil, fmt.Errorf("events: state bucket %s: %w", b.StateBucket(), err)
	}
	return kv, nil
}

// ErrNoState is returned by ReadState when the state bucket does not
// exist: no discovery leader of this version has run on this NATS.
var ErrNoState = errors.New("events: no state bucket")

// ReadState returns the state bucket's entries of namespace ns (every
// namespace when ns is empty): the instance states by key and the leader
// (nil when none wrote one). Entries that do not decode are skipped.
// Errors: ErrNoState, or the bucket cannot be read.
func (b *Bus) ReadState(ctx context.Context, ns string) (map[string]InstanceState, *LeaderState, error) {
	kv, err := b.JS.KeyValue(ctx, b.StateBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil, ErrNoState
	}
	if err != nil {
		return nil, nil, fmt.Errorf("events: state bucket %s: %w", b.StateBucket(), err)
	}
	filter := StateInstancesIn(ns)
	if ns == "" {
		filter = "instance.>"
	}
	w, err := kv.WatchFiltered(ctx, []string{filter, StateLeaderKey(ns)}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, nil, fmt.Errorf("events: read state bucket %s: %w", b.StateBucket(), err)
	}
	defer func() { _ = w.Stop() }()
	states := map[string]InstanceState{}
	var leader *LeaderState
	for {
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("events: read state bucket %s: %w", b.StateBucket(), ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, nil, fmt.Errorf("events: read state bucket %s: watcher stopped", b.StateBucket())
			}
			if e == nil { // every current value delivered
				return states, leader, nil
			}
			if strings.HasPrefix(e.Key(), "leader.") {
				var l LeaderState
				if json.Unmarshal(e.Value(), &l) == nil {
					leader = &l
				}
				continue
			}
			var s InstanceState
			if json.Unmarshal(e.Value(), &s) == nil && StateInstanceKey(s.Key) == e.Key() {
				states[s.Key] = s
			}
		}
	}
}

// ConsumerInfo returns the info of the durable job consumer of role
// (SyncConsumer or DeleteConsumer) of this bus's namespace: its pending
// (not yet delivered) and ack-pending (delivered, not yet acknowledged)
// jobs. It errors (wrapping jetstream.ErrConsumerNotFound or
// ErrStreamNotFound) when no worker created it yet.
func (b *Bus) ConsumerInfo(ctx context.Context, role string) (*jetstream.ConsumerInfo, error) {
	c, err := b.JS.Consumer(ctx, b.consumerStream(role), ConsumerName(role, b.cfg.Namespace))
	if err != nil {
		return nil, fmt.Errorf("events: consumer %s: %w", ConsumerName(role, b.cfg.Namespace), err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: consumer %s: %w", ConsumerName(role, b.cfg.Namespace), err)
	}
	return info, nil
}
