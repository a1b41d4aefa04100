package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/plan"
)

// errNotOurs is returned when a Service name we want is taken by a Service
// that another tool manages, or another instance's.
var errNotOurs = errors.New("a Service of that name exists and is not managed by matbus")

// errOutsideRange is returned by recreate, before it deletes anything, when
// the new cluster IP lies outside the known service range: the create would
// be refused, and deleting and restoring the old Service on every sync only
// churned it.
var errOutsideRange = errors.New("outside the service range")

// errRecreateHeldBack is returned by recreate, before it deletes anything,
// while a refusal of the same replacement holds it back (recreateRefusals).
var errRecreateHeldBack = errors.New("recreate held back")

// apply runs the plan's writes, each retried with its own backoff, with at
// most Concurrency Kubernetes writes in flight in this worker, then
// publishes the remaining deletes as delete jobs (planned at plannedAt,
// from the status whose fingerprint tag is tag).
//
// Order matters when a BMC IP moves (cluster-ip mode): a Service to delete
// that holds an IP a create or recreate of this plan needs is deleted
// first, inline (UID precondition), then the recreates run, then the
// creates and updates; so a status that frees an IP and gives it to
// another device converges in one sync instead of failing with "IP already
// allocated".
//
// Permanent failures are reported at once, one event per Service; the other
// writes and the deletes still happen, and the job then ends as failed
// (retrying cannot help; the next sync tries again). Transient ones that
// outlast their backoff are reported together, one event for the job.
func (w *Worker) apply(ctx context.Context, log *slog.Logger, key string, p plan.Plan, plannedAt time.Time, tag string) error {
	type op struct {
		kind events.ErrorKind
		svc  *corev1.Service
		run  func(ctx context.Context, attempt int) error
		done func()
	}
	var (
		mu        sync.Mutex
		total     int
		transient []string
		permanent []string
		firstErr  error
		firstKind events.ErrorKind
	)
	runPhase := func(ops []op) {
		var wg sync.WaitGroup
		for _, o := range ops {
			select {
			case w.writes <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return
			}
			total++
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-w.writes }()
				cls, err := w.retry(ctx, key, o.kind, o.svc, o.run)
				if err == nil {
					if o.done != nil {
						o.done()
					}
					return
				}
				mu.Lock()
				defer mu.Unlock()
				switch cls {
				case Transient:
					if firstErr == nil {
						firstErr, firstKind = err, o.kind
					}
					transient = append(transient, o.svc.Namespace+"/"+o.svc.Name)
				case Permanent:
					permanent = append(permanent, o.svc.Namespace+"/"+o.svc.Name+": "+err.Error())
				}
			}()
		}
		wg.Wait()
	}

	// Phase 1: deletes that free an IP this plan needs.
	firstDeletes, later := w.splitDeletes(ctx, key, p, tag)
	var first []op
	for _, s := range firstDeletes {
		first = append(first, op{events.ErrorDelete, s, func(ctx context.Context, _ int) error { return w.deleteOwned(ctx, s) },
			func() { w.deleted.Add(1) }})
	}
	if len(first)+len(later)+len(p.Create)+len(p.Update)+len(p.Recreate) > 0 {
		log.Info("applying plan", "create", len(p.Create), "update", len(p.Update), "recreate", len(p.Recreate),
			"delete", len(first)+len(later), "delete_waiting", len(p.Delete)-len(first)-len(later))
	}
	runPhase(first)

	// Phase 2: recreates (each frees its old IP before it takes the new one).
	var recreates []op
	for _, u := range p.Recreate {
		recreates = append(recreates, op{events.ErrorCreate, u.New, func(ctx context.Context, _ int) error { return w.recreate(ctx, u.Old, u.New) },
			func() { w.recreated.Add(1) }})
	}
	runPhase(recreates)

	// Phase 3: creates and updates.
	var rest []op
	for _, s := range p.Create {
		rest = append(rest, op{events.ErrorCreate, s, func(ctx context.Context, _ int) error { return w.create(ctx, s) }, nil})
	}
	for _, u := range p.Update {
		rest = append(rest, op{events.ErrorUpdate, u.New, func(ctx context.Context, attempt int) error {
			if attempt == 1 {
				return w.update(ctx, u.New)
			}
			return w.reconverge(ctx, u.New)
		}, func() { w.updated.Add(1); w.recordAdopted(ctx, key, u.Old) }})
	}
	runPhase(rest)

	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := w.publishDeletes(ctx, key, later, events.DeleteStale, staleSuffix(tag), plannedAt); err != nil {
		return err
	}
	return w.writesFailed(ctx, key, total, transient, permanent, firstKind, firstErr)
}

// writesFailed is the error of an apply of total writes of which those
// of transient failed after their backoff (the first with kind firstKind
// and firstErr: one event for them all, and the job is retried) and those
// of permanent were refused (reported per Service already: the job is
// terminated); nil when none failed.
func (w *Worker) writesFailed(ctx context.Context, key string, total int, transient, permanent []string, firstKind events.ErrorKind, firstErr error) error {
	if len(transient) > 0 {
		w.reportTransient(ctx, key, firstKind, transient, total, firstErr)
		return &jobs.Error{Retry: true, Reported: true, Err: fmt.Errorf("%d Service writes failed transiently, first: %s: %w", len(transient), transient[0], firstErr)}
	}
	if len(permanent) > 0 {
		// Reported per Service already; the job is terminated, not retried.
		return &jobs.Error{Reported: true, Err: fmt.Errorf("%d Service writes failed permanently, first: %s", len(permanent), permanent[0])}
	}
	return nil
}

// splitDeletes divides the deletes of p: first those that free an IP a
// create or recreate of p needs (run inline, before them), later the rest
// (published as delete jobs), without those this worker published for the
// same status already (see freshDeletes), and none while a fan-out of the
// instance is still queued (the memo records that the plan deferred them).
func (w *Worker) splitDeletes(ctx context.Context, key string, p plan.Plan, tag string) (first, later []*corev1.Service) {
	needed := map[string]bool{}
	if w.cfg.Plan.IPMode != plan.IPModeExternalIP {
		for _, s := range p.Create {
			needed[s.Spec.ClusterIP] = true
		}
		for _, u := range p.Recreate {
			needed[u.New.Spec.ClusterIP] = true
		}
	}
	// Their deletes are no change of the instance's Services (see memo);
	// a failure below makes the next poll plan again.
	w.memo.expect(key, p.Delete)
	later = make([]*corev1.Service, 0, len(p.Delete))
	for _, s := range p.Delete {
		if ip := s.Spec.ClusterIP; ip != "" && needed[ip] {
			first = append(first, s)
			continue
		}
		later = append(later, s)
	}
	later = w.freshDeletes(later, tag)
	deferred := len(later) > 0 && w.storedJobs(ctx, events.StreamDelete, w.bus.Subjects().Delete(key)) > 0
	if deferred {
		// A fan-out of this instance is still being worked off (perhaps
		// planned by another worker): add nothing now; once its queue is
		// empty, the next poll plans again and publishes what is still
		// to delete.
		later = nil
	}
	w.memo.setDeferred(key, deferred)
	return first, later
}

// deleteOwned deletes s (an existing Service of the plan) with its UID as
// precondition; NotFound and a changed UID count as done.
func (w *Worker) deleteOwned(ctx context.Context, s *corev1.Service) error {
	uid := s.UID
	err := w.kube.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		if err == nil {
			w.log.Info("Service deleted to free its IP for another device", "service", s.Namespace+"/"+s.Name, "ip", s.Spec.ClusterIP)
		}
		return nil
	}
	return err
}

// allocAttempts bounds the tries of one write refused with "IP already
// allocated" (a 422 that Classify calls transient). A few quick tries let a
// swap of BMC IPs within one plan settle; a conflict that outlasts them is
// held by another Service (e.g. of another instance whose sync has not
// freed it yet), so the write ends as transient without the whole backoff
// and the instance's next poll tries again. It is reported as
// permanent and left to the next sync instead of being retried for
// RetryMaxElapsed and redelivered (which made every sync job hammer the API
// server with creates).
const allocAttempts = 3

// retry runs fn with a fresh exponential backoff bounded by RetryMaxElapsed
// and the job's context. Conflicts are retried silently; an "IP already
// allocated" refusal is tried allocAttempts times and then treated as
// permanent; permanent failures are reported (per Service) and end the
// loop. Transient failures that outlast the backoff are returned, not
// reported: the caller reports them per job (reportTransient). It returns
// the class of the last error.
func (w *Worker) retry(ctx context.Context, key string, kind events.ErrorKind, svc *corev1.Service,
	fn func(ctx context.Context, attempt int) error) (Class, error) {
	bo := backoff.WithContext(w.newBackoff(w.cfg.RetryMaxElapsed), ctx)
	attempt := 0
	cls := Transient
	var msg string
	allocRefusals := 0
	err := backoff.Retry(func() error {
		attempt++
		err := fn(ctx, attempt)
		if err == nil {
			return nil
		}
		if errors.Is(err, errNotOurs) || errors.Is(err, errOutsideRange) || errors.Is(err, errRecreateHeldBack) {
			cls, msg = Permanent, err.Error()
			return backoff.Permanent(err)
		}
		cls, msg = w.cfg.Classifier.Classify(ctx, err, svc)
		switch cls {
		case Permanent, Canceled:
			return backoff.Permanent(err)
		}
		if apierrors.IsInvalid(err) {
			// The holder may go away by itself (an IP moving between
			// instances): then the write stays transient, without the whole
			// backoff, and the instance's next poll tries again. Otherwise
			// (someone else's Service, or two instances reporting one BMC
			// IP) it is permanent.
			if allocRefusals++; allocRefusals >= allocAttempts {
				if !w.allocationResolves(ctx, svc.Spec.ClusterIP) {
					cls = Permanent
				}
				return backoff.Permanent(err)
			}
		}
		w.log.Debug("retrying Service write", "service", svc.Name, "attempt", attempt, "error", err)
		return err
	}, bo)
	if err == nil {
		return cls, nil
	}
	if cls == Canceled || ctx.Err() != nil {
		return Canceled, err
	}
	if cls == Permanent {
		w.report.Report(ctx, events.Error{Kind: kind, Instance: key, Service: svc.Namespace + "/" + svc.Name,
			MatID: svc.Annotations[plan.AnnotationMatID], Message: msg, Permanent: true, Attempts: attempt})
		w.recordRefused(ctx, key, kind, svc, msg)
	}
	return cls, &retryError{attempts: attempt, msg: msg, last: err}
}

// retryError is a failure that outlasted retry's backoff.
type retryError struct {
	attempts int
	msg      string // the classifier's message
	last     error  // the last error itself
}

func (e *retryError) Error() string { return e.msg }
func (e *retryError) Unwrap() error { return e.last }

// reportTransient publishes one error event for the writes of one job that
// failed transiently after their backoff: per instance and kind, not per
// Service, so an API outage or an overloaded API server gives one event per
// rate-limit window instead of one per Service. The message names the
// cause without the Service or URL (those are in the worker's log), so it
// reads the same for every job the same outage fails.
func (w *Worker) reportTransient(ctx context.Context, key string, kind events.ErrorKind, failed []string, total int, first error) {
	attempts := 0
	var re *retryError
	if errors.As(first, &re) {
		attempts = re.attempts
	}
	w.log.Warn("Service writes failed transiently; the job will be retried", "instance", key, "services", failed, "error", first)
	w.report.Report(ctx, events.Error{Kind: kind, Instance: key, Attempts: attempts,
		Message: fmt.Sprintf("%d of %d Service writes failed after retrying for up to %v; the job will be retried: %s",
			len(failed), total, w.cfg.RetryMaxElapsed, transientCause(first))})
}

// transientCause describes a transient failure by what went wrong, not
// where: the status code and reason of an API answer, or the network error
// of a request (without the request's URL).
func transientCause(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		return fmt.Sprintf("HTTP %d %s", s.Code, s.Reason)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// create creates want; if the name exists and is ours, it converges the
// existing object instead (another worker got there first).
//
// The API server allocates spec.clusterIP before it checks the name, so when
// another worker has just created this very Service, the answer is a 422
// "provided IP is already allocated", not AlreadyExists. A 422 is therefore
// followed by a read: if the Service exists, it is converged like after
// AlreadyExists; otherwise the IP really belongs to another Service and the
// error is returned (and classified) as it is.
//
// A create is skipped, with no request, when the informer cache already
// holds this instance's Service of that name exactly as wanted: another
// worker created it since the plan was made (two syncs of one instance at
// once, e.g. after the scheduler released a job that waited long for an
// apply slot). Each such create cost a refused Create and two GETs.
func (w *Worker) create(ctx context.Context, want *corev1.Service) error {
	if w.cachedAsWanted(want) {
		return nil
	}
	created, err := w.createOrConverge(ctx, want)
	if created != nil {
		w.created.Add(1)
	}
	return err
}

// createOrConverge is create without the counter; created is the object
// this call's Create made, nil when it converged an existing one or failed.
func (w *Worker) createOrConverge(ctx context.Context, want *corev1.Service) (created *corev1.Service, err error) {
	svcs := w.kube.CoreV1().Services(want.Namespace)
	created, err = svcs.Create(ctx, want, metav1.CreateOptions{FieldManager: "matbus"})
	if err == nil {
		return created, nil
	}
	if apierrors.IsAlreadyExists(err) {
		return nil, w.reconverge(ctx, want)
	}
	if apierrors.IsInvalid(err) {
		if cur, gerr := svcs.Get(ctx, want.Name, metav1.GetOptions{}); gerr == nil {
			return nil, w.convergeTo(ctx, want, cur)
		}
	}
	return nil, err
}

// cachedAsWanted says whether the informer cache holds a Service named
// like want, managed by this worker's matbus and of want's instance, that
// the single-object plan leaves as it is (nothing to create, update or
// recreate). A stale cache entry (the Service deleted since) is no loss:
// its delete event makes the instance's next poll plan again.
func (w *Worker) cachedAsWanted(want *corev1.Service) bool {
	if w.services == nil {
		return false
	}
	cur, err := w.services.Services(want.Namespace).Get(want.Name)
	if err != nil || cur.DeletionTimestamp != nil || cur.Labels[plan.LabelManagedBy] != w.managedBy() {
		return false
	}
	if inst, ok := cur.Labels[plan.LabelInstance]; !ok || inst != want.Labels[plan.LabelInstance] {
		return false
	}
	p := plan.Diff(plan.Desired{Services: []*corev1.Service{want}}, []*corev1.Service{cur}, w.cfg.Plan)
	return len(p.Create)+len(p.Update)+len(p.Recreate)+len(p.Delete) == 0
}

func (w *Worker) update(ctx context.Context, next *corev1.Service) error {
	_, err := w.kube.CoreV1().Services(next.Namespace).Update(ctx, next, metav1.UpdateOptions{FieldManager: "matbus"})
	if apierrors.IsNotFound(err) {
		return w.create(ctx, stripIdentity(next))
	}
	return err
}

// reconverge re-reads the Service named like want and applies the
// single-object plan to it: after a conflict, or when a create found it.
func (w *Worker) reconverge(ctx context.Context, want *corev1.Service) error {
	cur, err := w.kube.CoreV1().Services(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = w.kube.CoreV1().Services(want.Namespace).Create(ctx, stripIdentity(want), metav1.CreateOptions{FieldManager: "matbus"})
		if err == nil {
			w.created.Add(1)
		}
		return err
	}
	if err != nil {
		return err
	}
	return w.convergeTo(ctx, want, cur)
}

// convergeTo applies the single-object plan of want to cur, the Service of
// that name just read from the API server.
func (w *Worker) convergeTo(ctx context.Context, want, cur *corev1.Service) error {
	if cur.Labels[plan.LabelManagedBy] != w.managedBy() {
		return fmt.Errorf("%w: %s/%s", errNotOurs, cur.Namespace, cur.Name)
	}
	if inst, ok := cur.Labels[plan.LabelInstance]; ok && inst != want.Labels[plan.LabelInstance] {
		return fmt.Errorf("%w: %s/%s belongs to instance %q (mat_id %q)", errNotOurs, cur.Namespace, cur.Name, inst, cur.Annotations[plan.AnnotationMatID])
	}
	p := plan.Diff(plan.Desired{Services: []*corev1.Service{want}}, []*corev1.Service{cur}, w.cfg.Plan)
	switch {
	case len(p.Update) == 1:
		_, err := w.kube.CoreV1().Services(cur.Namespace).Update(ctx, p.Update[0].New, metav1.UpdateOptions{FieldManager: "matbus"})
		return err
	case len(p.Recreate) == 1:
		return w.recreate(ctx, p.Recreate[0].Old, p.Recreate[0].New)
	}
	return nil
}

// recreate replaces old by want when an immutable field (spec.clusterIP)
// changed: delete old with its UID as precondition, then create want. A new
// cluster IP known to lie outside the service range is refused before
// anything is deleted (errOutsideRange), so old keeps serving its IP; ranges
// listed from the API are listed again first, so a ServiceCIDR created since
// is used without a restart. If the create is refused permanently
// otherwise, the old Service is put back (without its UID) so the BMC stays
// reachable at its previous IP, the error is returned, and the same
// replacement is held back (errRecreateHeldBack, nothing deleted) for a
// backoff of 1 minute doubling to 1 hour (recreateRefusals): trying it at
// every sync would take the Service away each time.
func (w *Worker) recreate(ctx context.Context, old, want *corev1.Service) error {
	key := want.Labels[plan.LabelInstance]
	if f, ok := w.recreates.blocked(key, want, time.Now()); ok {
		return fmt.Errorf("%w: %s/%s keeps cluster IP %s; its replacement was refused and is tried again at %s, or at once when it changes: %s",
			errRecreateHeldBack, old.Namespace, old.Name, old.Spec.ClusterIP, f.until.UTC().Format(time.RFC3339), f.msg)
	}
	if ip := want.Spec.ClusterIP; w.cfg.Classifier.OutsideRange(ctx, ip) {
		return fmt.Errorf("cluster IP %s: %w %v (create a ServiceCIDR that covers it, or use --bmc-ip-mode=external-ip); %s/%s keeps %s",
			ip, errOutsideRange, w.cfg.Classifier.Prefixes(), old.Namespace, old.Name, old.Spec.ClusterIP)
	}
	svcs := w.kube.CoreV1().Services(old.Namespace)
	uid := old.UID
	err := svcs.Delete(ctx, old.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			// Someone re-created it meanwhile: converge that one instead.
			return w.reconverge(ctx, want)
		}
		return err
	}
	// create converges a Service that another worker created meanwhile.
	created, err := w.createOrConverge(ctx, stripIdentity(want))
	if err == nil {
		w.recreates.done(key, want.Name)
		w.recordRecreated(ctx, old, created)
		return nil
	}
	if cls, _ := w.cfg.Classifier.Classify(ctx, err, want); cls == Permanent {
		back := stripIdentity(old)
		if _, rerr := svcs.Create(ctx, back, metav1.CreateOptions{FieldManager: "matbus"}); rerr != nil {
			w.log.Warn("could not restore Service after a failed recreate", "service", old.Name, "error", rerr)
		}
		f := w.recreates.refused(key, want, err.Error(), time.Now())
		return fmt.Errorf("%w (put back with its old cluster IP; not tried again before %s unless the replacement changes)",
			err, f.until.UTC().Format(time.RFC3339))
	}
	return err
}

// stripIdentity returns a copy of s without server-set identity fields, ready to create.
func stripIdentity(s *corev1.Service) *corev1.Service {
	c := s.DeepCopy()
	c.ResourceVersion = ""
	c.UID = types.UID("")
	c.CreationTimestamp = metav1.Time{}
	c.ManagedFields = nil
	c.DeletionTimestamp = nil
	c.Generation = 0
	c.Status = corev1.ServiceStatus{}
	return c
}
