package events

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// InstanceState is what the discovery leader knows of one instance's
// scheduling, as it keeps it in the state bucket under
// StateInstanceKey(Key) for `matbus status`. It is a view, never an
// input: no component acts on it (the bucket's hold records, HoldRecord,
// are the one input it holds).
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
func (b *Bus) StateBucket() string { return b.StreamName(BucketState) }

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

// HoldRecord is the state bucket's entry StateHoldKey(Key): the deletes
// of one instance that a worker holds for a confirmation window because
// its status lost many devices at once (see plan.HoldRule). Unlike the
// other entries it is an input: every worker reads it before it deletes a
// Service of the instance, so a hold is shared by all workers and outlives
// any of them. The first worker creates it (KV Create: the first wins),
// later ones update it under its revision; it is removed when nothing is
// left to hold (the devices came back, their Services were deleted after
// the window, or the instance is gone).
type HoldRecord struct {
	Key string `json:"key"`
	// Reason is the plan.MassReason that started the hold (all, share,
	// epoch); Detail says it for people.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// Epoch is the status's epoch_id when the hold started; PrevEpoch the
	// one before it, when known.
	Epoch     string `json:"epoch,omitempty"`
	PrevEpoch string `json:"prev_epoch,omitempty"`
	// Since is when the hold started (the fetch of the status that started
	// it); Until when its window ends: deletes go ahead only if a status
	// fetched at or after Until still lacks the devices.
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Existing is how many Services the instance had when the hold started.
	Existing int `json:"existing"`
	// Held is how many Services are held; Services lists them (at most
	// MaxHeldListed; Truncated when there are more, and then every delete
	// of the instance is held).
	Held      int           `json:"held"`
	Services  []HeldService `json:"services"`
	Truncated bool          `json:"truncated,omitempty"`
	// Released is when a status fetched after Until still lacked the
	// devices and their deletes went ahead; zero while the hold is in
	// force.
	Released time.Time `json:"released,omitzero"`
	// Worker names the worker that wrote the entry, at Updated.
	Worker  string    `json:"worker"`
	Updated time.Time `json:"updated"`
}

// HeldService is one Service whose delete a HoldRecord holds.
type HeldService struct {
	Name  string `json:"name"`
	UID   string `json:"uid"`
	MatID string `json:"mat_id,omitempty"`
}

// MaxHeldListed is how many Services a HoldRecord lists at most, so that an
// entry stays well below NATS's default max_payload (1 MB).
const MaxHeldListed = 5000

// InForce reports whether h holds deletes now (it is not released).
func (h HoldRecord) InForce() bool { return h.Released.IsZero() }

// UIDs returns the UIDs of the Services h lists.
func (h HoldRecord) UIDs() []string {
	out := make([]string, len(h.Services))
	for i, s := range h.Services {
		out[i] = s.UID
	}
	return out
}

// StateHoldKey is the state bucket's key of the hold of instance key
// ("hold.<namespace>.<name>").
func StateHoldKey(key string) string { return "hold." + key }

// StateHoldsIn matches the hold keys of namespace ns (every namespace when
// ns is empty).
func StateHoldsIn(ns string) string {
	if ns == "" {
		return "hold.>"
	}
	return "hold." + ns + ".*"
}

// WorkerState is the state bucket's entry StateWorkerKey(namespace, Name):
// one running worker and the configuration it writes Services with. Each
// worker writes its entry when it starts (before it takes a job) and every
// StateRefresh after that, and removes it when it stops cleanly; an entry
// whose Updated is older than WorkerStale is of a worker that is gone.
//
// It is an input, like HoldRecord: two workers whose Fingerprints differ
// would write the same Services differently (another --bmc-ip-mode, for
// one) and undo each other's writes while they run side by side, as in a
// rolling update. So a worker stands by — takes no job — while a live
// worker with another Fingerprint and a higher Epoch is active, and a
// worker that starts waits until the live, active workers of another
// Fingerprint and a lower Epoch stand by (docs/adr/0035-configuration-handover.md).
type WorkerState struct {
	Name string `json:"name"`
	// Fingerprint identifies the options that shape the Services the
	// worker writes (plan.Options.Fingerprint, e.g. "3f9a0c21d4e7").
	Fingerprint string `json:"fingerprint"`
	// Epoch is the bucket revision of the worker's first entry: assigned by
	// the NATS server, so it orders workers by when they started without
	// trusting their clocks. 0 in that first entry (its revision is its
	// epoch; see WorkerEpoch).
	Epoch uint64 `json:"epoch,omitempty"`
	// Standby is set while the worker takes no jobs because a worker with
	// another Fingerprint and a higher Epoch is active; StandbyFor names
	// that worker.
	Standby    bool   `json:"standby,omitempty"`
	StandbyFor string `json:"standby_for,omitempty"`
	// Updated is when the worker wrote this entry (its clock).
	Updated time.Time `json:"updated"`
}

// WorkerStale is how old a WorkerState's Updated may be before the entry
// counts as that of a worker that is gone (three missed refreshes).
const WorkerStale = 3 * StateRefresh

// WorkerEpoch is the epoch of a WorkerState read at bucket revision rev:
// its Epoch, or rev for the first entry (Epoch 0).
func WorkerEpoch(s WorkerState, rev uint64) uint64 {
	if s.Epoch == 0 {
		return rev
	}
	return s.Epoch
}

// StateWorkerKey is the state bucket's key of worker name in namespace ns:
// "worker.<ns>.<name>", with every character a key may not hold in name
// (anything but letters, digits, '-', '_' and '=') written as '_'.
func StateWorkerKey(ns, name string) string {
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '=':
			return r
		}
		return '_'
	}, name)
	if safe == "" {
		safe = "_"
	}
	return "worker." + ns + "." + safe
}

// StateWorkersIn matches the worker keys of namespace ns.
func StateWorkersIn(ns string) string { return "worker." + ns + ".*" }

// StateKV returns the state bucket, bound as it is, or created (as by
// EnsureState) when it does not exist yet: a worker may start before any
// discovery leader.
func (b *Bus) StateKV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := b.js.KeyValue(ctx, b.StateBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return b.EnsureState(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("events: state bucket %s: %w", b.StateBucket(), err)
	}
	return kv, nil
}

// ReadHolds returns the hold records of namespace ns (every namespace when
// ns is empty) by instance key. Entries that do not decode are skipped.
// Errors: ErrNoState, or the bucket cannot be read.
func (b *Bus) ReadHolds(ctx context.Context, ns string) (map[string]HoldRecord, error) {
	out := map[string]HoldRecord{}
	err := b.readEntries(ctx, "read holds", []string{StateHoldsIn(ns)}, func(e jetstream.KeyValueEntry) {
		var h HoldRecord
		if json.Unmarshal(e.Value(), &h) == nil && StateHoldKey(h.Key) == e.Key() {
			out[h.Key] = h
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WorkerEntry is a worker's entry as ReadWorkers read it: the entry, its
// epoch (WorkerEpoch), its revision and key, and when the bucket stored it
// (the server's clock).
type WorkerEntry struct {
	WorkerState
	EpochOf uint64 `json:"epoch_of"`
	// Revision is the entry's bucket revision; Key its key.
	Revision uint64    `json:"revision"`
	Key      string    `json:"key"`
	Stored   time.Time `json:"stored"`
}

// ReadWorkers returns the worker entries of namespace ns, sorted by epoch
// (stale ones included: compare Stored with WorkerStale). Entries that do
// not decode are skipped. Errors: ErrNoState, or the bucket cannot be read.
func (b *Bus) ReadWorkers(ctx context.Context, ns string) ([]WorkerEntry, error) {
	var out []WorkerEntry
	err := b.readEntries(ctx, "read workers", []string{StateWorkersIn(ns)}, func(e jetstream.KeyValueEntry) {
		var s WorkerState
		if json.Unmarshal(e.Value(), &s) == nil && s.Fingerprint != "" {
			out = append(out, WorkerEntry{WorkerState: s, EpochOf: WorkerEpoch(s, e.Revision()), Revision: e.Revision(), Key: e.Key(), Stored: e.Created()})
		}
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b WorkerEntry) int { return cmp.Compare(a.EpochOf, b.EpochOf) })
	return out, nil
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
	if s, err := b.js.Stream(ctx, "KV_"+b.StateBucket()); err == nil && s.CachedInfo().Config.Storage != st {
		b.storageOnce("KV_"+b.StateBucket(), s.CachedInfo().Config.Storage, st)
		st = s.CachedInfo().Config.Storage
	}
	kv, err := b.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.StateBucket(), History: 1,
		Description: "matbus: the discovery leader's view of each instance, for matbus status, and the workers' delete holds", Replicas: b.cfg.Replicas, Storage: st})
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
	filter := StateInstancesIn(ns)
	if ns == "" {
		filter = "instance.>"
	}
	states := map[string]InstanceState{}
	var leader *LeaderState
	err := b.readEntries(ctx, "read state bucket", []string{filter, StateLeaderKey(ns)}, func(e jetstream.KeyValueEntry) {
		if strings.HasPrefix(e.Key(), "leader.") {
			var l LeaderState
			if json.Unmarshal(e.Value(), &l) == nil {
				leader = &l
			}
			return
		}
		var s InstanceState
		if json.Unmarshal(e.Value(), &s) == nil && StateInstanceKey(s.Key) == e.Key() {
			states[s.Key] = s
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return states, leader, nil
}

// readEntries calls each with every current entry of the state bucket
// under filters (deletes left out), in bucket order, and returns once all
// were delivered. Errors: ErrNoState, or the bucket cannot be read (what
// names the read in the error).
func (b *Bus) readEntries(ctx context.Context, what string, filters []string, each func(jetstream.KeyValueEntry)) error {
	kv, err := b.js.KeyValue(ctx, b.StateBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return ErrNoState
	}
	if err != nil {
		return fmt.Errorf("events: state bucket %s: %w", b.StateBucket(), err)
	}
	w, err := kv.WatchFiltered(ctx, filters, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("events: %s in %s: %w", what, b.StateBucket(), err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("events: %s in %s: %w", what, b.StateBucket(), ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("events: %s in %s: watcher stopped", what, b.StateBucket())
			}
			if e == nil { // every current entry delivered
				return nil
			}
			each(e)
		}
	}
}

// ConsumerInfo returns the info of the durable job consumer of role
// (SyncConsumer or DeleteConsumer) of this bus's namespace: its pending
// (not yet delivered) and ack-pending (delivered, not yet acknowledged)
// jobs, as of this call. It errors (wrapping jetstream.ErrConsumerNotFound or
// ErrStreamNotFound) when no worker created it yet.
func (b *Bus) ConsumerInfo(ctx context.Context, role string) (*jetstream.ConsumerInfo, error) {
	c, err := b.js.Consumer(ctx, b.consumerStream(role), ConsumerName(role, b.cfg.Namespace))
	if err != nil {
		return nil, fmt.Errorf("events: consumer %s: %w", ConsumerName(role, b.cfg.Namespace), err)
	}
	return c.CachedInfo(), nil // the answer of the lookup: one CONSUMER.INFO request
}
