package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
)

// Workers whose plan options differ (another --bmc-ip-mode, say) write
// the same Services differently. Run side by side, as in a rolling update
// that changes the mode, each would undo the other's writes on every sync
// until the old ones stop: a Service recreated several times instead of
// once. So workers announce themselves in the state bucket
// (events.WorkerState) and hand over (docs/adr/0035-configuration-handover.md):
//
//   - a worker stands by — takes no job, finishes the ones it runs, then
//     marks its entry Standby — while a live, active worker with another
//     fingerprint and a higher epoch (it started later) runs;
//   - a worker that starts takes its first job only once every live,
//     active worker with another fingerprint and a lower epoch stands by,
//     or after handoverWait.
//
// Workers with the same fingerprint never wait for each other. Without
// the state bucket (NATS down at start) a worker runs as if alone and
// announces itself once it can.

// handoverWait bounds how long a starting worker waits for the workers
// of another configuration to stand by: one that does not (an older
// version, a job stuck in a long apply) is then overruled.
const handoverWait = events.WorkerStale

// handoverTick is how often the handover re-reads its view of the
// workers (for entries that went stale) and a standing-by worker checks
// whether its jobs ended.
const handoverTick = 250 * time.Millisecond

// peer is one worker's entry as the watch last saw it.
type peer struct {
	state events.WorkerState
	epoch uint64
	rev   uint64    // the entry's bucket revision
	seen  time.Time // when the bucket stored the entry (the server's clock)
}

func (p peer) live(now time.Time) bool {
	return now.Sub(p.seen) < events.WorkerStale
}

func (p peer) String() string {
	return fmt.Sprintf("%s (epoch %d, fingerprint %s)", p.state.Name, p.epoch, p.state.Fingerprint)
}

// newerConfig returns the live, active peer with another fingerprint than
// fp and the highest epoch above epoch: the worker that one of epoch
// stands by for.
func newerConfig(fp string, epoch uint64, peers []peer, now time.Time) (peer, bool) {
	var best peer
	found := false
	for _, p := range peers {
		if p.state.Fingerprint != fp && p.epoch > epoch && !p.state.Standby && p.live(now) && (!found || p.epoch > best.epoch) {
			best, found = p, true
		}
	}
	return best, found
}

// olderConfig returns the live, active peers with another fingerprint
// than fp and an epoch below epoch: the workers one of epoch waits for
// before its first job.
func olderConfig(fp string, epoch uint64, peers []peer, now time.Time) []peer {
	var out []peer
	for _, p := range peers {
		if p.state.Fingerprint != fp && p.epoch < epoch && !p.state.Standby && p.live(now) {
			out = append(out, p)
		}
	}
	return out
}

// handover is a worker's part in it: its entry, its view of the others,
// and whether it may take jobs.
type handover struct {
	name, fp, ns string
	kv           func(context.Context) (jetstream.KeyValue, error)
	read         func(ctx context.Context, ns string) ([]events.WorkerEntry, error) // events.Bus.ReadWorkers
	log          *slog.Logger
	metrics      *Metrics

	started time.Time    // when start began: the start-up wait's origin
	joined  atomic.Bool  // the start-up wait is over
	standby atomic.Bool  // a newer configuration runs: take no jobs
	running atomic.Int64 // jobs running here
	reason  atomic.Pointer[string]

	mu    sync.Mutex
	epoch uint64 // 0 until announced
	peers map[string]peer
	// written is what the entry says now: standby and for whom.
	written events.WorkerState
}

func newHandover(name, fp, ns string, bus *events.Bus, kv func(context.Context) (jetstream.KeyValue, error), m *Metrics, log *slog.Logger) *handover {
	return &handover{name: name, fp: fp, ns: ns, kv: kv, read: bus.ReadWorkers, log: log, metrics: m, peers: map[string]peer{}}
}

// paused reports whether the consumers take no jobs now.
func (h *handover) paused() bool { return !h.joined.Load() || h.standby.Load() }

// err says why the worker takes no jobs (nil when it takes them), for
// its readiness.
func (h *handover) err() error {
	if !h.paused() {
		return nil
	}
	if r := h.reason.Load(); r != nil {
		return errors.New(*r)
	}
	return errors.New("the handover has not started")
}

func (h *handover) setReason(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	h.reason.Store(&s)
}

// handler wraps a job handler: a job that starts while the worker stands
// by is handed back unrun (context.Canceled: a nak without delay, for
// another worker), and running counts the others, so that standing by
// can wait for them.
func (h *handover) handler(next jobs.Handler) jobs.Handler {
	return func(ctx context.Context, env events.Envelope, subject string) error {
		h.running.Add(1)
		defer h.running.Add(-1)
		if h.paused() {
			return context.Canceled
		}
		return next(ctx, env, subject)
	}
}

// announce writes the worker's first entry and takes its revision as the
// epoch. Errors: the bucket cannot be read or written.
func (h *handover) announce(ctx context.Context) error {
	kv, err := h.kv(ctx)
	if err != nil {
		return err
	}
	st := events.WorkerState{Name: h.name, Fingerprint: h.fp, Updated: time.Now()}
	data, _ := json.Marshal(st)
	rev, err := kv.Put(ctx, events.StateWorkerKey(h.ns, h.name), data)
	if err != nil {
		return fmt.Errorf("announce worker %s: %w", h.name, err)
	}
	h.mu.Lock()
	h.epoch = rev
	h.written = st
	h.mu.Unlock()
	return nil
}

// write rewrites the worker's entry with its epoch and standby state.
func (h *handover) write(ctx context.Context, standby bool, forWhom string) error {
	kv, err := h.kv(ctx)
	if err != nil {
		return err
	}
	h.mu.Lock()
	st := events.WorkerState{Name: h.name, Fingerprint: h.fp, Epoch: h.epoch, Standby: standby, StandbyFor: forWhom, Updated: time.Now()}
	h.mu.Unlock()
	data, _ := json.Marshal(st)
	if _, err := kv.Put(ctx, events.StateWorkerKey(h.ns, h.name), data); err != nil {
		return fmt.Errorf("write worker entry %s: %w", h.name, err)
	}
	h.mu.Lock()
	h.written = st
	h.mu.Unlock()
	return nil
}

// remove deletes the worker's entry (at a clean stop), so the others need
// not wait for it to go stale.
func (h *handover) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := h.kv(ctx)
	if err != nil {
		return
	}
	if err := kv.Delete(ctx, events.StateWorkerKey(h.ns, h.name)); err != nil {
		h.log.Debug("worker entry not removed; it goes stale", "error", err)
	}
}

// start announces the worker and reads the others' entries (bounded by
// 5 s) before its consumers start, so that a worker with no one to wait
// for takes jobs from its first pull. When the bucket cannot be written or
// read it runs as if alone (joined), and run announces it later.
func (h *handover) start(ctx context.Context) {
	h.started = time.Now()
	started := h.started
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h.setReason("waiting for the state bucket to announce this worker")
	err := h.announce(actx)
	if err == nil {
		err = h.load(actx)
	}
	if err != nil {
		h.log.Warn("worker not announced in the state bucket; it takes jobs without waiting for workers of another configuration to stand by", "error", err)
		h.joined.Store(true)
		return
	}
	h.setReason("waiting for the workers of another configuration to stand by")
	if err := h.decide(actx, started); err != nil {
		h.log.Debug("worker entry not written", "error", err)
	}
}

// load reads every worker entry of the namespace into the view.
func (h *handover) load(ctx context.Context) error {
	entries, err := h.read(ctx, h.ns)
	if err != nil && !errors.Is(err, events.ErrNoState) {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range entries {
		if e.Key != events.StateWorkerKey(h.ns, h.name) {
			h.peers[e.Key] = peer{state: e.WorkerState, epoch: e.EpochOf, rev: e.Revision, seen: e.Stored}
		}
	}
	return nil
}

// run keeps the entry fresh, watches the others and stands by or resumes,
// until ctx ends; then it removes the entry.
func (h *handover) run(ctx context.Context) {
	defer h.remove()
	keepWatching(ctx, h.log, "worker watch", func(ctx context.Context) error { return h.watchOnce(ctx, h.started) })
}

func (h *handover) watchOnce(ctx context.Context, started time.Time) error {
	h.mu.Lock()
	announced := h.epoch != 0
	h.mu.Unlock()
	if !announced {
		if err := h.announce(ctx); err != nil {
			return err
		}
	}
	kv, err := h.kv(ctx)
	if err != nil {
		return err
	}
	wa, err := kv.WatchFiltered(ctx, []string{events.StateWorkersIn(h.ns)})
	if err != nil {
		return err
	}
	defer func() { _ = wa.Stop() }()
	h.mu.Lock()
	clear(h.peers)
	h.mu.Unlock()
	tick := time.NewTicker(handoverTick)
	defer tick.Stop()
	refreshed := time.Now()
	synced := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-wa.Updates():
			if !ok {
				return errors.New("watcher stopped")
			}
			if e == nil {
				synced = true
			} else {
				h.observe(e)
			}
		case <-tick.C:
		}
		if !synced {
			continue
		}
		if err := h.decide(ctx, started); err != nil {
			return err
		}
		if time.Since(refreshed) >= events.StateRefresh {
			h.mu.Lock()
			st := h.written
			h.mu.Unlock()
			if err := h.write(ctx, st.Standby, st.StandbyFor); err != nil {
				return err
			}
			refreshed = time.Now()
		}
	}
}

// observe takes one watched entry into the view (not the worker's own).
func (h *handover) observe(e jetstream.KeyValueEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Key() == events.StateWorkerKey(h.ns, h.name) {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(h.peers, e.Key())
		return
	}
	var st events.WorkerState
	if err := json.Unmarshal(e.Value(), &st); err != nil || st.Fingerprint == "" {
		h.log.Debug("worker entry does not decode; ignored", "key", e.Key(), "error", err)
		delete(h.peers, e.Key())
		return
	}
	h.peers[e.Key()] = peer{state: st, epoch: events.WorkerEpoch(st, e.Revision()), rev: e.Revision(), seen: e.Created()}
}

// decide applies the two rules to the current view.
func (h *handover) decide(ctx context.Context, started time.Time) error {
	now := time.Now()
	h.mu.Lock()
	epoch := h.epoch
	peers := make([]peer, 0, len(h.peers))
	for _, p := range h.peers {
		peers = append(peers, p)
	}
	h.mu.Unlock()
	slices.SortFunc(peers, func(a, b peer) int { return cmp.Compare(a.epoch, b.epoch) })
	h.sweep(ctx, peers, now)

	if !h.joined.Load() {
		older := olderConfig(h.fp, epoch, peers, now)
		switch {
		case len(older) == 0:
			h.joined.Store(true)
			h.log.Info("worker takes jobs", "epoch", epoch, "fingerprint", h.fp)
		case now.Sub(started) >= handoverWait:
			h.joined.Store(true)
			h.log.Warn("workers of another configuration did not stand by in time; taking jobs beside them", "waited", handoverWait, "workers", names(older))
		default:
			h.setReason("waiting for the workers of another configuration to stand by: %s", names(older))
			return nil
		}
	}

	newer, ok := newerConfig(h.fp, epoch, peers, now)
	switch {
	case ok && !h.standby.Load():
		h.setReason("standing by: worker %s started later with another configuration and writes the Services", newer)
		h.standby.Store(true)
		h.metrics.setStandby(true)
		h.log.Warn("standing by: a worker with another configuration started later; taking no jobs while it runs", "worker", newer.state.Name,
			"its_epoch", newer.epoch, "its_fingerprint", newer.state.Fingerprint, "epoch", epoch, "fingerprint", h.fp)
	case !ok && h.standby.Load():
		h.standby.Store(false)
		h.metrics.setStandby(false)
		h.log.Info("taking jobs again: no live worker with another configuration started later", "epoch", epoch)
		return h.write(ctx, false, "")
	}
	if ok {
		h.setReason("standing by: worker %s started later with another configuration and writes the Services", newer)
		h.mu.Lock()
		written := h.written
		h.mu.Unlock()
		// Marked only once the jobs running here ended: the newer worker
		// takes its first job after that.
		if (!written.Standby || written.StandbyFor != newer.state.Name) && h.running.Load() == 0 {
			return h.write(ctx, true, newer.state.Name)
		}
	}
	return nil
}

// sweep deletes the entries of workers gone for two WorkerStale (a crash
// leaves its entry behind), each only at the revision this worker saw, so
// an entry rewritten meanwhile stays.
func (h *handover) sweep(ctx context.Context, peers []peer, now time.Time) {
	for _, p := range peers {
		if now.Sub(p.seen) < 2*events.WorkerStale {
			continue
		}
		kv, err := h.kv(ctx)
		if err != nil {
			return
		}
		key := events.StateWorkerKey(h.ns, p.state.Name)
		if err := kv.Delete(ctx, key, jetstream.LastRevision(p.rev)); err != nil {
			h.log.Debug("entry of a gone worker not removed", "key", key, "error", err)
		}
		h.mu.Lock()
		if q, ok := h.peers[key]; ok && q.rev == p.rev {
			delete(h.peers, key)
		}
		h.mu.Unlock()
	}
}

func names(ps []peer) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
