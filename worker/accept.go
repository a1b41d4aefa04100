package worker

import (
	"context"
	"fmt"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
)

// opening is how a handler accepts a message of type T: the event types
// it takes, the instance key the data names, an extra check (may be nil)
// and whether the epoch fence applies (see admit).
type opening[T any] struct {
	types  []events.Type
	key    func(T) string
	check  func(w *Worker, v T) error
	fenced bool
}

var (
	syncOpening = opening[events.SyncJob]{types: []events.Type{events.TypeSyncJob},
		key: func(j events.SyncJob) string { return j.Key }, fenced: true}
	cleanupOpening = opening[events.CleanupJob]{types: []events.Type{events.TypeCleanupJob},
		key: func(j events.CleanupJob) string { return j.Key }, fenced: true}
	instanceOpening = opening[events.Instance]{types: []events.Type{events.TypeInstanceAppeared, events.TypeInstanceGone},
		key: func(i events.Instance) string { return i.Key }, fenced: true}
	deleteOpening = opening[events.DeleteJob]{types: []events.Type{events.TypeDeleteJob},
		key: func(j events.DeleteJob) string { return j.Key }, check: (*Worker).ownNamespace}
)

// accept decodes env as a T, checks that the key it names is subject's
// (see keyMatches) and o.check, and, when o.fenced, admits it through the
// epoch fence. A message that fails the checks is reported as rejected
// (kind event); every error accept returns has been reported, and
// terminates a job.
func (o opening[T]) accept(ctx context.Context, w *Worker, env events.Envelope, subject string) (T, error) {
	v, err := events.Into[T](env, o.types...)
	if err == nil {
		err = keyMatches(subject, o.key(v))
	}
	if err == nil && o.check != nil {
		err = o.check(w, v)
	}
	if err != nil {
		w.rejectEvent(ctx, subject, err)
		return v, jobs.Reported(err)
	}
	if o.fenced {
		return v, w.admit(ctx, env, subject)
	}
	return v, nil
}

// ownNamespace refuses a delete job for another namespace than the worker's.
func (w *Worker) ownNamespace(job events.DeleteJob) error {
	if job.Namespace != w.cfg.Plan.Namespace {
		return fmt.Errorf("%w: delete job for namespace %q; this worker manages %q", events.ErrMalformed, job.Namespace, w.cfg.Plan.Namespace)
	}
	return nil
}

// keyMatches rejects a message whose data names another instance than its
// subject: such a message could act on an instance outside the per-instance
// ordering of its subject.
func keyMatches(subject, key string) error {
	if k, ok := events.KeyFromSubject(subject); !ok || k != key {
		return fmt.Errorf("%w: data key %q does not match subject %s", events.ErrMalformed, key, subject)
	}
	return nil
}
