package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"

	"github.com/matbus/matbus/events"
)

// ErrNotLeading is wrapped by Term.Check's error once this process may no
// longer hold the Lease.
var ErrNotLeading = errors.New("discovery: not leading")

// Term is one tenure of this process as leader, from the acquire of the
// Lease until it is lost, released, or may have passed to another process.
// It is held only while the last successful acquire or renew was sent less
// than LeaseDuration − Margin ago on the monotonic clock: another process
// can take the Lease no earlier than LeaseDuration after it observed that
// renew, which the API server stored after it was sent. The request's
// send time counts, not its answer's arrival: a renew sent before a pause
// and answered after it proves nothing about the pause. A term that ended
// stays ended; the process campaigns again with a new Term.
//
// It is safe for concurrent use; a nil *Term is a publisher without leader
// election: always held, no epoch.
type Term struct {
	clock    clock.WithTicker
	lease    string // "<namespace>/<name>"
	identity string
	valid    time.Duration // LeaseDuration − Margin
	margin   time.Duration
	log      *slog.Logger
	stop     context.CancelCauseFunc // steps down: ends the campaign of this term

	mu      sync.Mutex
	held    bool // acquired
	epoch   events.Epoch
	renewed time.Time // when the last successful acquire or renew was sent
	ended   error
}

func newTerm(clk clock.WithTicker, lease, identity string, duration, margin time.Duration, log *slog.Logger, stop context.CancelCauseFunc) *Term {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Term{clock: clk, lease: lease, identity: identity, valid: duration - margin, margin: margin, log: log, stop: stop}
}

// Check returns nil while the term is held, else an error wrapping
// ErrNotLeading that says why (lease lost or released, the last renew too
// old, a pause). The first failed check ends the term and steps down.
// Call it before every reconcile and every publish.
func (t *Term) Check() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended != nil {
		return t.ended
	}
	if !t.held {
		return fmt.Errorf("%w: the Lease is not acquired yet", ErrNotLeading)
	}
	if age := t.clock.Since(t.renewed); age >= t.valid {
		t.endLocked(fmt.Errorf("%w: the last successful renew was sent %v ago, the lease may have passed on after %v (lease duration − %v margin)",
			ErrNotLeading, age.Round(time.Millisecond), t.valid, t.margin))
	}
	return t.ended
}

// Epoch returns the term's epoch: the Lease, its leaseTransitions and
// holder at the acquire (Term 0 and no Leader before it). It is nil for a
// nil Term.
func (t *Term) Epoch() *events.Epoch {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.epoch
	e.Lease = t.lease
	return &e
}

// PublishOptions are the options every publish of the term uses: its epoch
// in the envelope and Check before every attempt (none for a nil Term).
func (t *Term) PublishOptions() []events.PublishOption {
	if t == nil {
		return nil
	}
	return []events.PublishOption{events.WithEpoch(t.Epoch()), events.WithGuard(t.Check)}
}

// acquired reports whether the Lease was acquired in this term.
func (t *Term) acquired() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held
}

// end ends the term with cause unless it ended already.
func (t *Term) end(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended == nil {
		t.endLocked(cause)
	}
}

func (t *Term) endLocked(cause error) {
	t.ended = cause
	if t.held {
		t.log.Warn("stepping down", "epoch", (&t.epoch).String(), "reason", cause.Error())
	}
	t.stop(cause)
}

// observed records a successful acquire or renew of rec sent at sent.
func (t *Term) observed(sent time.Time, rec resourcelock.LeaderElectionRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended != nil {
		return
	}
	e := events.Epoch{Lease: t.lease, Term: int64(rec.LeaderTransitions), Leader: rec.HolderIdentity}
	if t.held && e != t.epoch {
		t.endLocked(fmt.Errorf("%w: the Lease moved to epoch %s", ErrNotLeading, &e))
		return
	}
	t.held, t.epoch, t.renewed = true, e, sent
}

// heldBy ends a held term when the Lease names another holder.
func (t *Term) heldBy(holder string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held && t.ended == nil && holder != t.identity {
		t.endLocked(fmt.Errorf("%w: the Lease is held by %q", ErrNotLeading, holder))
	}
}

// watchPauses ends the term when a ticker of period tick fires later than
// due by more than the margin (the process was stopped, or starved): a
// process that was paused steps down before anything else it would do. It
// returns when ctx ends or the term ends.
func (t *Term) watchPauses(ctx context.Context, tick time.Duration) {
	tk := t.clock.NewTicker(tick)
	defer tk.Stop()
	last := t.clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
		}
		// Now, not the tick's value: that is when the tick was due, also
		// when it is delivered after a pause.
		now := t.clock.Now()
		if late := now.Sub(last) - tick; late > t.margin {
			t.end(fmt.Errorf("%w: paused: a %v tick came %v late", ErrNotLeading, tick, late.Round(time.Millisecond)))
			return
		}
		last = now
		if t.Check() != nil {
			return
		}
	}
}

// fencedLock is the Lease lock that tells a Term about every acquire, renew
// and release, and about another holder it reads. It never releases a
// Lease that its last read shows held by another process: client-go's
// release reads the Lease but decides on the holder it observed before, so
// a leader that was paused past its lease would otherwise empty the new
// leader's Lease (and could take it back).
type fencedLock struct {
	resourcelock.Interface
	term *Term

	// floor, when set, gives the lowest term a Lease this process creates
	// may start at (see LeaderConfig.Bus).
	floor func(ctx context.Context) (int, error)
	// owner, when set, puts the owner reference on the Lease (see
	// LeaderConfig.OwnerDeployment).
	owner *leaseOwner

	mu     sync.Mutex
	holder string // the holder of the last Lease read
	min    int    // the lowest leaseTransitions this process writes
}

// ErrLeaseHeldByOther is the error of a release refused because the Lease
// is held by another process.
var ErrLeaseHeldByOther = errors.New("discovery: the Lease is held by another process; not released")

func (l *fencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	if err == nil && rec != nil {
		l.mu.Lock()
		l.holder = rec.HolderIdentity
		l.mu.Unlock()
		l.term.heldBy(rec.HolderIdentity)
	}
	return rec, raw, err
}

// Create creates the Lease. A Lease that was deleted would start its
// terms at 0 again, below the epochs workers have seen: with a floor, the
// first term is one above the newest term of the Lease stored on the
// instances stream. A floor that cannot be read fails the create (tried
// again at the next retry period).
func (l *fencedLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if l.floor != nil {
		f, err := l.floor(ctx)
		if err != nil {
			return fmt.Errorf("discovery: newest leader term on the instances stream: %w", err)
		}
		l.mu.Lock()
		l.min = max(l.min, f)
		l.mu.Unlock()
	}
	return l.write(ctx, rec, l.Interface.Create)
}

func (l *fencedLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if rec.HolderIdentity != l.term.identity {
		// A release: the term ends before the Lease is given up.
		l.term.end(fmt.Errorf("%w: the Lease is released", ErrNotLeading))
		l.mu.Lock()
		holder := l.holder
		l.mu.Unlock()
		if holder != l.term.identity {
			return fmt.Errorf("%w (holder %q)", ErrLeaseHeldByOther, holder)
		}
		return l.Interface.Update(ctx, rec)
	}
	return l.write(ctx, rec, l.Interface.Update)
}

// write sends rec, an acquire or renew by this process, with send (Create
// or Update), at least at the floor's term (the elector carries the term it
// created the Lease with), and tells the term when it was sent once it
// succeeded.
func (l *fencedLock) write(ctx context.Context, rec resourcelock.LeaderElectionRecord, send func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	l.mu.Lock()
	rec.LeaderTransitions = max(rec.LeaderTransitions, l.min)
	l.mu.Unlock()
	sent := l.term.clock.Now()
	if err := send(ctx, rec); err != nil {
		return err
	}
	l.term.observed(sent, rec)
	if l.owner != nil && l.owner.ensure(ctx) {
		// The lock's cached Lease is older than the owner's write: read it
		// again, so the next renew is not refused as a conflict (if this
		// read fails, that renew falls back to client-go's get and update).
		_, _, _ = l.Interface.Get(ctx)
	}
	return nil
}

// termFloor returns the newest term of lease on the instances stream plus
// one (0 when none is stored).
func termFloor(bus *events.Bus, lease string) func(ctx context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		recs, _, err := bus.Instances(ctx)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		floor := 0
		for _, r := range recs {
			if r.Epoch != nil && r.Epoch.Lease == lease {
				floor = max(floor, int(r.Epoch.Term)+1)
			}
		}
		return floor, nil
	}
}
