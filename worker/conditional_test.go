package worker_test

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
)

// condLog records, per status request that reached a simulator, whether
// it carried If-None-Match and the status code of the answer.
// record is a list that handlers append to while the test reads it.
type record[T any] struct {
	mu    sync.Mutex
	items []T
}

func (l *record[T]) add(v T) {
	l.mu.Lock()
	l.items = append(l.items, v)
	l.mu.Unlock()
}

// since returns a copy of the items from index i on.
func (l *record[T]) since(i int) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.items[min(i, len(l.items)):]...)
}

func (l *record[T]) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.items)
}

// condLog records each status request's If-None-Match and answer code.
type condLog struct {
	record[condReq]
	url string // the logged front of the simulator (condSim)
}

// condSim serves the v2-mixed fixture fleet, with or without ETags,
// behind a front that logs every status request.
func condSim(t *testing.T, etag bool) (*matsim.Server, *condLog) {
	t.Helper()
	sim, err := matsim.New(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed), DisableETag: !etag})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	log := &condLog{}
	front := httptest.NewServer(log.wrap(sim))
	t.Cleanup(front.Close)
	log.url = front.URL
	return sim, log
}

type condReq struct {
	inm  string
	code int
}

type codeRecorder struct {
	http.ResponseWriter
	code int
}

func (c *codeRecorder) WriteHeader(code int) {
	c.code = code
	c.ResponseWriter.WriteHeader(code)
}

func (l *condLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &codeRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		l.add(condReq{inm: r.Header.Get("If-None-Match"), code: rec.code})
	})
}

// TestConditionalPolls: against a MAT that sends ETags, polls of an
// unchanged status are answered 304 and cost no API request; a BMC IP
// change (same MAT generation) reaches its Service through the next poll;
// a full resync asks without conditions and gets the whole body. Against
// a MAT without ETags nothing is conditional and the steady state is the
// same.
func TestConditionalPolls(t *testing.T) {
	for _, etag := range []bool{true, false} {
		t.Run(fmt.Sprintf("etag=%v", etag), func(t *testing.T) {
			e := newEnv(t)
			sim, log := condSim(t, etag)
			e.startPolling(e.entry("mat-a", log.url))
			w := e.startWorker(workerOpts{})
			before := e.waitServices(v2MixedNames()...)
			nm := sim.NotModified()
			e.steady(w, sim)
			if got := sim.NotModified() - nm; etag && got < 6 {
				t.Errorf("%d of 8 steady polls answered 304, want at least 6", got)
			}
			for _, r := range log.since(0) {
				if !etag && (r.inm != "" || r.code != http.StatusOK) {
					t.Fatalf("MAT without ETag got If-None-Match %q, answered %d", r.inm, r.code)
				}
			}

			// A BMC IP change keeps MAT's generation but changes the body.
			const name = "mat-bmc-host-7ec7b7c3-126-c030b365"
			if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", "10.96.64.50"); err != nil {
				t.Fatal(err)
			}
			var s *corev1.Service
			waitFor(t, name+" on 10.96.64.50", func() (bool, string) {
				if s = e.service(name); s == nil {
					return false, "missing"
				}
				return s.Spec.ClusterIP == "10.96.64.50", "clusterIP " + s.Spec.ClusterIP
			})
			if s.UID == before[name].UID {
				t.Errorf("%s not re-created", name)
			}
			e.steady(w, sim)

			// A full resync: no condition, a whole body, planned.
			at := log.len()
			if err := w.Sync(e.ctx, e.key("mat-a")); err != nil {
				t.Fatalf("full resync: %v", err)
			}
			full := false
			for _, r := range log.since(at) {
				full = full || (r.inm == "" && r.code == http.StatusOK)
			}
			if !full {
				t.Errorf("no unconditional 200 during the full resync: %+v", log.since(at))
			}
			if after := e.waitServices(v2MixedNames()...); len(after) != len(before) {
				t.Errorf("%d Services after the resync, want %d", len(after), len(before))
			}
		})
	}
}

// resultLog records the sync results of one instance as the scheduler
// gets them.
type resultLog struct{ record[timedResult] }

type timedResult struct {
	r  events.SyncResult
	at time.Time
}

func (e *env) results(key string) *resultLog {
	e.t.Helper()
	l := &resultLog{}
	sub, err := e.bus.SubscribeResults(func(r events.SyncResult) {
		if r.Key != key {
			return
		}
		l.add(timedResult{r, time.Now()})
	}, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.onStop(func() { _ = sub.Unsubscribe() })
	return l
}

// TestConditionalPollsStretch: the worker tells the scheduler which polls
// MAT answered 304 (SyncResult.NotModified), and the scheduler polls such
// an instance at the stretched interval; a change is still seen, by a
// result that is not NotModified, and the interval steps back. A MAT
// without ETags never gets a NotModified result and is polled every
// poll interval.
func TestConditionalPollsStretch(t *testing.T) {
	const poll, pollMax = 200 * time.Millisecond, 600 * time.Millisecond
	for _, etag := range []bool{true, false} {
		t.Run(fmt.Sprintf("etag=%v", etag), func(t *testing.T) {
			e := newEnv(t)
			sim, err := matsim.New(matsim.Options{Fleet: fixtureFleet(t, fixtureV2Mixed), DisableETag: !etag})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sim.Close() })
			front := httptest.NewServer(sim)
			t.Cleanup(front.Close)
			src, err := discovery.NewStatic("test", []discovery.StaticEntry{e.entry("mat-a", front.URL)})
			if err != nil {
				t.Fatal(err)
			}
			results := e.results(e.key("mat-a"))
			e.startPublisherWith(src, discovery.PublisherConfig{SyncInterval: fullResync,
				Scheduler: discovery.SchedulerConfig{PollInterval: poll, PollMaxInterval: pollMax}})
			e.startWorker(workerOpts{})
			e.waitServices(v2MixedNames()...)

			// Steady: a window of about 4 s after the ramp.
			time.Sleep(2 * time.Second)
			at := results.len()
			time.Sleep(4 * time.Second)
			window := results.since(at)
			nm := 0
			for _, x := range window {
				if x.r.NotModified {
					nm++
					if x.r.Outcome != events.OutcomeUnchanged {
						t.Errorf("NotModified on a %s result of a poll", x.r.Outcome)
					}
				}
			}
			n := len(window)
			switch {
			case etag && (nm < n-1 || n > 9):
				// 4 s at 600 ms: about 7 polls (4 s at 200 ms would be 20).
				t.Errorf("%d results in 4s, %d NotModified; want at most 9, all but one NotModified", n, nm)
			case !etag && (nm != 0 || n < 14):
				t.Errorf("%d results in 4s, %d NotModified; want about 20 (every 200ms), none NotModified", n, nm)
			}

			// A change: seen by a result that is not NotModified.
			at = results.len()
			const name = "mat-bmc-host-7ec7b7c3-126-c030b365"
			if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", "10.96.64.50"); err != nil {
				t.Fatal(err)
			}
			changed := time.Now()
			waitFor(t, name+" on 10.96.64.50", func() (bool, string) {
				s := e.service(name)
				if s == nil {
					return false, "missing"
				}
				return s.Spec.ClusterIP == "10.96.64.50", "clusterIP " + s.Spec.ClusterIP
			})
			if took := time.Since(changed); took > pollMax+2*time.Second {
				t.Errorf("change took %v, want within the %v bound and a sync", took, pollMax)
			}
			// The result is published after the write the wait above saw,
			// so it may arrive a moment later.
			waitFor(t, "a synced result for the change", func() (bool, string) {
				for _, x := range results.since(at) {
					if x.r.Outcome == events.OutcomeSynced {
						if x.r.NotModified {
							t.Error("the result that planned the change says NotModified")
						}
						return true, ""
					}
				}
				return false, fmt.Sprintf("%d results since the change, none synced", len(results.since(at)))
			})
		})
	}
}

// TestRevalidatedFullResync: with matclient's BodyMaxAge, a full resync of
// an unchanged status is revalidated — If-None-Match, a 304, no body — and
// still plans from the whole status: a Service deleted behind matbus's
// back is created again by the resync, the others are left as they are.
// A status that changed is read whole by the resync's conditional GET. A
// MAT without ETags gets no condition on a resync either.
func TestRevalidatedFullResync(t *testing.T) {
	for _, etag := range []bool{true, false} {
		t.Run(fmt.Sprintf("etag=%v", etag), func(t *testing.T) {
			e := newEnv(t)
			sim, log := condSim(t, etag)
			e.startPolling(e.entry("mat-a", log.url))
			w := e.startWorker(workerOpts{Mat: matclient.Config{BodyMaxAge: time.Hour}})
			before := e.waitServices(v2MixedNames()...)
			e.steady(w, sim)

			// Resync of an unchanged status: only 304s, with a condition.
			at := log.len()
			if err := w.Sync(e.ctx, e.key("mat-a")); err != nil {
				t.Fatalf("full resync: %v", err)
			}
			for _, r := range log.since(at) {
				switch {
				case etag && (r.inm == "" || r.code != http.StatusNotModified):
					t.Errorf("unchanged status: a request with If-None-Match %q answered %d during the resync, want only 304s to a condition", r.inm, r.code)
				case !etag && (r.inm != "" || r.code != http.StatusOK):
					t.Errorf("MAT without ETag: If-None-Match %q, answered %d", r.inm, r.code)
				}
			}
			if after := e.waitServices(v2MixedNames()...); !maps.Equal(uids(before), uids(after)) {
				t.Errorf("the revalidated resync changed Services: before %v, after %v", uids(before), uids(after))
			}

			// Drift in Kubernetes: the revalidated resync plans it back.
			const gone = "mat-bmc-host-7ec7b7c3-126-c030b365"
			if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx, gone, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, gone+" back", func() (bool, string) {
				if err := w.Sync(e.ctx, e.key("mat-a")); err != nil {
					return false, err.Error()
				}
				return e.service(gone) != nil, "missing"
			})

			// A changed status: the resync's conditional GET gets the body.
			if err := sim.SetBMCIP("7ec7b7c3-126b-412a-babf-fd79d002e921", "10.96.64.51"); err != nil {
				t.Fatal(err)
			}
			if err := w.Sync(e.ctx, e.key("mat-a")); err != nil {
				t.Fatalf("full resync after a change: %v", err)
			}
			if s := e.service(gone); s == nil || s.Spec.ClusterIP != "10.96.64.51" {
				t.Errorf("after the resync of a changed status, %s is %v, want clusterIP 10.96.64.51", gone, s)
			}
		})
	}
}
