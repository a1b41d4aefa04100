package worker

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
	"github.com/matbus/matbus/plan"
)

// Delete jobs and their message ids: a clean-up's carry "del-<uid>@<job
// id>", a plan's stale deletes "del-<uid>~<status tag>" (see staleSuffix),
// so JetStream's de-duplication drops exactly the repeats.

// publishDeletes publishes one delete job per Service with Nats-Msg-Id
// "del-<uid><idSuffix>", up to 16 at once. plannedAt is when the status
// the deletes were planned from was fetched (zero for clean-ups).
//
// Stale deletes are remembered (see freshDeletes): a poll during a long
// fan-out does not publish every waiting delete again.
func (w *Worker) publishDeletes(ctx context.Context, key string, svcs []*corev1.Service, reason events.DeleteReason, idSuffix string, plannedAt time.Time) error {
	var (
		mu   sync.Mutex
		errs []string
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 16)
	)
	for _, s := range svcs {
		job := events.DeleteJob{Key: key, Namespace: s.Namespace, Name: s.Name, UID: string(s.UID),
			MatID: s.Annotations[plan.AnnotationMatID], Reason: reason, PlannedAt: plannedAt}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := w.bus.Publish(ctx, w.bus.Subjects().Delete(key), events.TypeDeleteJob, "del-"+string(s.UID)+idSuffix, job); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s: %v", s.Name, err))
				mu.Unlock()
				return
			}
			if reason == events.DeleteStale {
				w.pendingDeletes.Store(string(s.UID)+idSuffix, time.Now())
			}
			w.deleteJobs.Add(1)
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sort.Strings(errs)
		return jobs.Retry(fmt.Errorf("publish delete jobs: %s", strings.Join(errs, "; ")))
	}
	return nil
}

// fpTag is a short form of a status fingerprint for delete job ids ("" for none).
func fpTag(fp string) string {
	_, hexsum, _ := strings.Cut(fp, ":")
	return hexsum[:min(len(hexsum), 12)]
}

// staleSuffix is the Nats-Msg-Id suffix of the stale delete jobs planned
// from the status of fingerprint tag: the same status gives the same ids
// (workers planning it alike publish each job once), a later status new
// ones (a device that came back and went again is deleted at once, not
// after the de-duplication window).
func staleSuffix(tag string) string {
	if tag == "" {
		return ""
	}
	return "~" + tag
}

// freshDeletes returns the Services of svcs whose stale delete job for the
// status tagged tag was not published by this worker in the last duplicate
// window, and forgets older entries. The entries are swept at most once
// per eighth of the window: every entry is read with its age, so a swept
// entry only frees memory, and a plan during a fan-out of N Services does
// not walk all N entries each time (a 20,000-Service fan-out planned about
// 700 times).
func (w *Worker) freshDeletes(svcs []*corev1.Service, tag string) []*corev1.Service {
	window := w.bus.Config().DuplicateWindow
	out := svcs[:0:0]
	for _, s := range svcs {
		if at, ok := w.pendingDeletes.Load(string(s.UID) + staleSuffix(tag)); ok && time.Since(at.(time.Time)) < window {
			continue
		}
		out = append(out, s)
	}
	now := time.Now()
	if last := w.pendingSwept.Load(); last != 0 && now.Sub(time.Unix(0, last)) < window/8 {
		return out
	}
	w.pendingSwept.Store(now.UnixNano())
	w.pendingDeletes.Range(func(k, v any) bool {
		if now.Sub(v.(time.Time)) >= window {
			w.pendingDeletes.Delete(k)
		}
		return true
	})
	return out
}
