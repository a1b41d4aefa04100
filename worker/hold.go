package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// Holding deletes (see plan.HoldRule and docs/adr): a status that takes
// many of an instance's Services away at once starts a hold, kept in the
// state bucket under events.StateHoldKey, which every worker reads before
// it deletes a Service of the instance: syncs before they apply their
// plan, delete jobs before they run. The record is the hold: a worker
// that restarts, or another worker, sees it and never deletes early.

// holdAttempts bounds the read-decide-write rounds of one sync against
// concurrent writers of the same record.
const holdAttempts = 3

// holdView is this worker's copy of the hold records of its namespace,
// kept by a watch of the state bucket (watchHolds) and by its own writes.
// It answers the cheap questions (is a hold of this instance due for a
// plan, the metrics); every decision to delete reads the record itself.
// It is safe for concurrent use.
type holdView struct {
	mu   sync.Mutex
	recs map[string]events.HoldRecord // instance key -> record
}

func newHoldView() *holdView { return &holdView{recs: map[string]events.HoldRecord{}} }

func (v *holdView) get(key string) (events.HoldRecord, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r, ok := v.recs[key]
	return r, ok
}

func (v *holdView) set(r events.HoldRecord) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.recs[r.Key] = r
}

func (v *holdView) remove(key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.recs, key)
}

// stateKV returns the state bucket, binding (or creating) it on first use.
func (w *Worker) stateKV(ctx context.Context) (jetstream.KeyValue, error) {
	w.kvMu.Lock()
	defer w.kvMu.Unlock()
	if w.kv != nil {
		return w.kv, nil
	}
	kv, err := w.bus.StateKV(ctx)
	if err != nil {
		return nil, err
	}
	w.kv = kv
	return kv, nil
}

// readHold reads the hold record of instance key and its revision (nil, 0
// when there is none). A record that does not decode is reported and
// returned as none with its revision, so the next write replaces it.
func (w *Worker) readHold(ctx context.Context, key string) (*events.HoldRecord, uint64, error) {
	kv, err := w.stateKV(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, events.StateHoldKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read hold record: %w", err)
	}
	var r events.HoldRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil || r.Key != key {
		w.report.Report(ctx, events.Error{Kind: events.ErrorHold, Instance: key, Permanent: true,
			Message: fmt.Sprintf("hold record %s in %s does not decode and is replaced: %v", e.Key(), w.bus.StateBucket(), err)})
		return nil, e.Revision(), nil
	}
	return &r, e.Revision(), nil
}

// planHold turns a record into what plan.DecideHold reads (nil for none).
func planHold(r *events.HoldRecord) *plan.HoldState {
	if r == nil {
		return nil
	}
	return plan.NewHoldState(r.Since, r.Until, !r.InForce(), r.UIDs(), !r.Truncated)
}

// holdDeletes applies the hold rule to the deletes of plan p of instance
// key, planned from status st (fetched at fetchedAt) for desired d over
// existing: it reads the instance's hold record, decides (plan.DecideHold),
// writes the record (create, update under its revision, release, remove)
// and returns p with only the deletes that may run now. With the rule off
// and no record in view, or no deletes and no record, or a status whose
// deletes are held anyway (d.DeletesHeld), it returns p as it is without
// reading anything. When the record cannot be read or written,
// deletes that the rule or a record in view would hold are held this time
// (never an early delete), and the failure is reported.
func (w *Worker) holdDeletes(ctx context.Context, log *slog.Logger, key string, st *matclient.Status, d plan.Desired,
	existing []*corev1.Service, p plan.Plan, fetchedAt time.Time) plan.Plan {
	rule := w.cfg.Hold
	prevEpoch := w.memo.epoch(key)
	if st != nil {
		w.memo.setEpoch(key, st.EpochID)
	}
	_, inView := w.holds.get(key)
	if d.DeletesHeld() || !inView && (rule.Off() || len(p.Delete) == 0) {
		// A status with invalid devices deletes nothing and says nothing
		// about whether held devices are back: the hold stays as it is.
		return p
	}
	dis := plan.Disappearance{Existing: plan.Deletable(d, existing, w.cfg.Plan), Deletes: len(p.Delete), PrevEpoch: prevEpoch}
	if st != nil {
		dis.Epoch = st.EpochID
	}
	for range holdAttempts {
		cur, rev, err := w.readHold(ctx, key)
		if err != nil {
			return w.holdBlind(ctx, log, key, p, dis, inView, err)
		}
		dec := plan.DecideHold(rule, planHold(cur), p, dis, fetchedAt, w.cfg.Plan.IPMode)
		done, err := w.writeHold(ctx, log, key, cur, rev, dec, dis, fetchedAt)
		if err != nil {
			return w.holdBlind(ctx, log, key, p, dis, inView || cur != nil, err)
		}
		if !done {
			continue // another worker wrote the record meanwhile: decide again
		}
		if len(dec.Held) > 0 {
			log.Debug("deletes held", "held", len(dec.Held), "deleting", len(dec.Go))
		}
		p.Delete = dec.Go
		return p
	}
	return w.holdBlind(ctx, log, key, p, dis, true, errors.New("the hold record kept changing under concurrent writers"))
}

// holdBlind is holdDeletes when the record cannot be read or written:
// deletes are held this time when the rule or a record (known) would hold
// them, except those that free an IP a create needs.
func (w *Worker) holdBlind(ctx context.Context, log *slog.Logger, key string, p plan.Plan, dis plan.Disappearance, known bool, cause error) plan.Plan {
	if ctx.Err() != nil {
		p.Delete = nil
		return p
	}
	reason, _ := w.cfg.Hold.Mass(dis)
	if reason == plan.MassNone && !known {
		return p
	}
	dec := plan.DecideHold(plan.HoldRule{Share: 1, Window: time.Hour}, &plan.HoldState{Until: time.Now().Add(time.Hour), All: true},
		p, dis, time.Now(), w.cfg.Plan.IPMode)
	w.report.Report(ctx, events.Error{Kind: events.ErrorHold, Instance: key,
		Message: fmt.Sprintf("%d Service deletes held this time: the hold record in %s cannot be used: %v", len(dec.Held), w.bus.StateBucket(), cause)})
	log.Warn("deletes held: hold record not usable", "held", len(dec.Held), "error", cause)
	p.Delete = dec.Go
	return p
}

// writeHold carries out decision dec on the record cur (revision rev; nil
// for none). It returns false when another worker changed the record
// since it was read, and an error when the bucket refused or failed.
func (w *Worker) writeHold(ctx context.Context, log *slog.Logger, key string, cur *events.HoldRecord, rev uint64,
	dec plan.HoldDecision, dis plan.Disappearance, fetchedAt time.Time) (bool, error) {
	kv, err := w.stateKV(ctx)
	if err != nil {
		return false, err
	}
	now := time.Now()
	put := func(r events.HoldRecord) (bool, error) {
		r.Worker, r.Updated = w.cfg.Name, now
		b, err := json.Marshal(r)
		if err != nil {
			return false, err
		}
		var nrev uint64
		if rev == 0 {
			nrev, err = kv.Create(ctx, events.StateHoldKey(key), b)
		} else {
			nrev, err = kv.Update(ctx, events.StateHoldKey(key), b, rev)
		}
		if conflict(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("write hold record: %w", err)
		}
		_ = nrev
		w.holds.set(r)
		w.cfg.Metrics.holdSeen(r)
		return true, nil
	}
	switch dec.Action {
	case plan.HoldKeep:
		if cur != nil {
			w.holds.set(*cur)
			w.cfg.Metrics.holdSeen(*cur)
		}
		return true, nil
	case plan.HoldStart:
		r := events.HoldRecord{Key: key, Reason: string(dec.Reason), Detail: dec.Detail, Epoch: dis.Epoch, PrevEpoch: dis.PrevEpoch,
			Since: fetchedAt, Until: fetchedAt.Add(w.cfg.Hold.Window), Existing: dis.Existing}
		listHeld(&r, dec.Held)
		ok, err := put(r)
		if ok {
			w.holdStarted(ctx, log, r)
		}
		return ok, err
	case plan.HoldUpdate:
		r := *cur
		listHeld(&r, dec.Held)
		return put(r)
	case plan.HoldRelease:
		r := *cur
		r.Released = now
		listHeld(&r, dec.Go)
		ok, err := put(r)
		if ok {
			w.holdReleased(ctx, log, r, fetchedAt)
		}
		return ok, err
	case plan.HoldEnd:
		if cur == nil && rev == 0 {
			w.holds.remove(key)
			w.cfg.Metrics.holdGone(key)
			return true, nil
		}
		err := kv.Delete(ctx, events.StateHoldKey(key), jetstream.LastRevision(rev))
		if conflict(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("remove hold record: %w", err)
		}
		w.holds.remove(key)
		w.cfg.Metrics.holdGone(key)
		if cur != nil {
			w.holdEnded(ctx, log, *cur, endNote(*cur, now, w.cfg.Hold.Off()))
		}
		return true, nil
	}
	return true, nil
}

// conflict reports whether a KV write failed because the key changed since
// it was read (or exists already, for a create).
func conflict(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	// A delete under a revision reports the stream's own error (10071, or
	// 10164 on a replicated stream).
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// listHeld sets r's Held count and its list of Services (at most
// events.MaxHeldListed, by name).
func listHeld(r *events.HoldRecord, svcs []*corev1.Service) {
	sorted := append([]*corev1.Service(nil), svcs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	r.Held, r.Truncated, r.Services = len(sorted), len(sorted) > events.MaxHeldListed, nil
	for _, s := range sorted[:min(len(sorted), events.MaxHeldListed)] {
		r.Services = append(r.Services, events.HeldService{Name: s.Name, UID: string(s.UID), MatID: s.Annotations[plan.AnnotationMatID]})
	}
}

// endNote says why the hold of r ends at now.
func endNote(r events.HoldRecord, now time.Time, off bool) string {
	switch {
	case off:
		return fmt.Sprintf("hold of %d Service deletes ended: holding is switched off (--delete-hold-window=0); deletes run at once", r.Held)
	case !r.InForce():
		return fmt.Sprintf("hold ended: the %d Services whose devices stayed away after the window (until %s) were deleted",
			r.Held, r.Until.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("hold ended after %v: the devices are back; the %d held Services were kept as they are (same UIDs, not written)",
		now.Sub(r.Since).Round(time.Millisecond), r.Held)
}

// holdStarted makes the new hold r visible: log, error event, Kubernetes
// Event on the MAT Service, metric.
func (w *Worker) holdStarted(ctx context.Context, log *slog.Logger, r events.HoldRecord) {
	note := fmt.Sprintf("%d Service deletes held until %s (%s: %s); they run only if a status fetched then still lacks the devices, and a device that comes back keeps its Service",
		r.Held, r.Until.UTC().Format(time.RFC3339), r.Reason, r.Detail)
	log.Warn("mass disappearance: deletes held", "held", r.Held, "reason", r.Reason, "until", r.Until, "epoch", r.Epoch)
	w.report.Report(ctx, events.Error{Kind: events.ErrorHold, Instance: r.Key, Message: note})
	w.cfg.Events.Instance(r.Key, kubeevents.DeletesHeld, note)
	w.cfg.Metrics.holdStarted(r.Reason)
}

// holdReleased makes the end of r's window with its devices still away
// visible.
func (w *Worker) holdReleased(ctx context.Context, log *slog.Logger, r events.HoldRecord, fetchedAt time.Time) {
	note := fmt.Sprintf("hold window ended at %s and the status fetched at %s still lacks the devices of %d Services: deleting them",
		r.Until.UTC().Format(time.RFC3339), fetchedAt.UTC().Format(time.RFC3339), r.Held)
	log.Warn("hold released: deleting", "deleting", r.Held, "since", r.Since)
	w.report.Report(ctx, events.Error{Kind: events.ErrorHold, Instance: r.Key, Message: note})
	w.cfg.Events.Instance(r.Key, kubeevents.DeletesReleased, note)
}

// holdEnded reports the end of hold r with note, as a resolved event.
func (w *Worker) holdEnded(ctx context.Context, log *slog.Logger, r events.HoldRecord, note string) {
	log.Info("hold ended", "held", r.Held, "since", r.Since, "released", !r.InForce())
	w.report.Report(ctx, events.Error{Kind: events.ErrorHold, Instance: r.Key, Message: note, Resolved: true})
	w.cfg.Events.Instance(r.Key, kubeevents.HoldResolved, note)
}

// endHold removes the hold record of instance key (gone, cleaned up) and
// reports its end; no record is no work. A failure is logged: the record
// of a gone instance holds nothing that a clean-up deletes.
func (w *Worker) endHold(ctx context.Context, key, why string) {
	if _, ok := w.holds.get(key); !ok && w.cfg.Hold.Off() {
		return
	}
	cur, rev, err := w.readHold(ctx, key)
	if err != nil || rev == 0 {
		if err != nil {
			w.log.Debug("hold record of a gone instance not read", "instance", key, "error", err)
		}
		return
	}
	kv, err := w.stateKV(ctx)
	if err == nil {
		err = kv.Delete(ctx, events.StateHoldKey(key), jetstream.LastRevision(rev))
	}
	if err != nil {
		w.log.Debug("hold record of a gone instance not removed", "instance", key, "error", err)
		return
	}
	w.holds.remove(key)
	w.cfg.Metrics.holdGone(key)
	if cur != nil {
		w.holdEnded(ctx, w.log.With("instance", key), *cur, fmt.Sprintf("hold of %d Service deletes ended: %s", cur.Held, why))
	}
}

// heldDelete reports whether the hold record of job's instance holds the
// Service of job now. Errors: the record cannot be read (the job is then
// retried: a delete that may be held never runs blind).
func (w *Worker) heldDelete(ctx context.Context, job events.DeleteJob) (bool, error) {
	if _, ok := w.holds.get(job.Key); !ok && w.cfg.Hold.Off() {
		return false, nil
	}
	cur, _, err := w.readHold(ctx, job.Key)
	if err != nil {
		return false, err
	}
	return planHold(cur).Holds(types.UID(job.UID)), nil
}

// holdDue reports whether instance key has a hold record that a poll must
// act on although its status did not change: a hold in force whose window
// is over, or a released one whose Services are all gone from the
// informer cache (the record is then removed).
func (w *Worker) holdDue(key string) bool {
	r, ok := w.holds.get(key)
	switch {
	case !ok:
		return false
	case r.InForce():
		return !time.Now().Before(r.Until) || w.cfg.Hold.Off()
	case r.Truncated || w.services == nil:
		return true
	}
	lister := w.services.Services(w.cfg.Plan.Namespace)
	for _, s := range r.Services {
		if cur, err := lister.Get(s.Name); err == nil && string(cur.UID) == s.UID {
			return false
		}
	}
	return true
}

// watchHolds keeps the hold view and metrics in step with the hold records
// of the worker's namespace until ctx ends, watching the state bucket and
// starting again (after a pause) when the watch fails.
func (w *Worker) watchHolds(ctx context.Context) {
	keepWatching(ctx, w.log, "hold watch", w.watchHoldsOnce)
}

// keepWatching runs once until ctx ends, starting it again after a pause
// (1 s, doubling up to 30 s) whenever it returns early; what names it in
// the debug log line of each restart.
func keepWatching(ctx context.Context, log *slog.Logger, what string, once func(context.Context) error) {
	delay := time.Second
	for ctx.Err() == nil {
		err := once(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Debug(what+" ended; starting again", "error", err, "retry_in", delay)
		if !jobs.Sleep(ctx, delay) {
			return
		}
		delay = min(delay*2, 30*time.Second)
	}
}

func (w *Worker) watchHoldsOnce(ctx context.Context) error {
	kv, err := w.stateKV(ctx)
	if err != nil {
		return err
	}
	wa, err := kv.WatchFiltered(ctx, []string{events.StateHoldsIn(w.cfg.Plan.Namespace)})
	if err != nil {
		return err
	}
	defer func() { _ = wa.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-wa.Updates():
			if !ok {
				return errors.New("watcher stopped")
			}
			if e == nil {
				continue // every current record delivered
			}
			key := e.Key()[len("hold."):]
			if e.Operation() != jetstream.KeyValuePut {
				w.holds.remove(key)
				w.cfg.Metrics.holdGone(key)
				continue
			}
			var r events.HoldRecord
			if json.Unmarshal(e.Value(), &r) != nil || r.Key != key {
				continue
			}
			w.holds.set(r)
			w.cfg.Metrics.holdSeen(r)
		}
	}
}
