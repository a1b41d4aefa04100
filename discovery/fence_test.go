package discovery

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/matbus/matbus/events"
)

// testTerm is a Term on a fake clock whose step-down is recorded.
func testTerm(t *testing.T, lease, margin time.Duration) (*Term, *clocktesting.FakeClock, *atomic.Pointer[error]) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	var cause atomic.Pointer[error]
	stop := func(err error) { cause.CompareAndSwap(nil, &err) }
	return newTerm(clk, "ns/lease", "a", lease, margin, nil, stop), clk, &cause
}

func rec(holder string, transitions int) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaderTransitions: transitions}
}

// The term is held while the last renew was sent less than lease − margin
// ago on the term's clock, and stays ended after the first failed check,
// even if a renew succeeds later.
func TestTermHeldUntilLeaseMinusMargin(t *testing.T) {
	term, clk, stopped := testTerm(t, 4*time.Second, time.Second)
	if err := term.Check(); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("before the acquire: %v, want ErrNotLeading", err)
	}
	if stopped.Load() != nil {
		t.Fatal("a term that was never acquired stepped down")
	}
	term.observed(clk.Now(), rec("a", 3))
	if err := term.Check(); err != nil {
		t.Fatalf("just acquired: %v", err)
	}
	if got, want := *term.Epoch(), (events.Epoch{Lease: "ns/lease", Term: 3, Leader: "a"}); got != want {
		t.Fatalf("epoch %v, want %v", got, want)
	}
	clk.Step(2999 * time.Millisecond)
	if err := term.Check(); err != nil {
		t.Fatalf("2.999 s after the acquire: %v", err)
	}
	term.observed(clk.Now(), rec("a", 3)) // a renew
	clk.Step(2999 * time.Millisecond)
	if err := term.Check(); err != nil {
		t.Fatalf("2.999 s after the renew: %v", err)
	}
	clk.Step(time.Millisecond)
	err := term.Check()
	if !errors.Is(err, ErrNotLeading) {
		t.Fatalf("3 s after the renew (lease 4 s, margin 1 s): %v, want ErrNotLeading", err)
	}
	if c := stopped.Load(); c == nil || !errors.Is(*c, ErrNotLeading) {
		t.Fatalf("the term did not step down (cause %v)", c)
	}
	term.observed(clk.Now(), rec("a", 3)) // a renew answered late
	if err := term.Check(); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("after a late renew: %v; an ended term must stay ended", err)
	}
}

// A renew of another epoch (the Lease changed hands in between) and a
// Lease read with another holder end the term.
func TestTermEndsOnOtherEpochOrHolder(t *testing.T) {
	term, clk, _ := testTerm(t, 4*time.Second, time.Second)
	term.observed(clk.Now(), rec("a", 3))
	term.observed(clk.Now(), rec("a", 5))
	if err := term.Check(); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("after a renew of another epoch: %v, want ErrNotLeading", err)
	}
	term, clk, _ = testTerm(t, 4*time.Second, time.Second)
	term.heldBy("b") // not acquired yet: reading the holder before the acquire is normal
	term.observed(clk.Now(), rec("a", 4))
	if err := term.Check(); err != nil {
		t.Fatalf("acquired after reading another holder: %v", err)
	}
	term.heldBy("b")
	if err := term.Check(); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("after reading holder b: %v, want ErrNotLeading", err)
	}
}

// A ticker that fires much later than due (a stopped or starved process)
// ends the term at once, before its last renew is too old; ticks on time,
// even some dropped ones, do not.
func TestTermPauseDetection(t *testing.T) {
	const tick = 100 * time.Millisecond
	term, clk, stopped := testTerm(t, time.Minute, 10*time.Second)
	term.observed(clk.Now(), rec("a", 1))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); term.watchPauses(ctx, tick) }()
	defer func() { cancel(); <-done }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	for range 20 { // 2 s in all, less than the margin even if no tick is read
		clk.Step(tick)
		term.observed(clk.Now(), rec("a", 1))
		time.Sleep(5 * time.Millisecond)
	}
	if err := term.Check(); err != nil {
		t.Fatalf("ticks on time: %v", err)
	}
	clk.Step(11 * time.Second) // a pause longer than the margin, well inside the lease
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pause was not noticed")
	}
	err := term.Check()
	if !errors.Is(err, ErrNotLeading) {
		t.Fatalf("after the pause: %v, want ErrNotLeading", err)
	}
	if c := stopped.Load(); c == nil {
		t.Fatal("the paused term did not step down")
	}
	t.Logf("after an 11 s pause: %v", err)
}

// fencedLock counts a renew from when its request was sent: a request
// answered after a pause proves nothing about the time of the pause. The
// pause is a clock step during the request to a real API server.
func TestFencedLockRenewCountsFromSend(t *testing.T) {
	cfg := startKubeConfig(t)
	var pauseOnUpdate atomic.Pointer[clocktesting.FakeClock]
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if clk := pauseOnUpdate.Load(); clk != nil && r.Method == http.MethodPut {
				clk.Step(5 * time.Second) // the process stops after the request went out
			}
			return resp, err
		})
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	term, clk, _ := testTerm(t, 4*time.Second, time.Second)
	lock := &fencedLock{term: term, Interface: &resourcelock.LeaseLock{
		LeaseMeta: metav1.ObjectMeta{Namespace: "default", Name: "fence"}, Client: kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: "a"},
	}}
	ctx := context.Background()
	now := metav1.NewTime(time.Now())
	r := resourcelock.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 4, AcquireTime: now, RenewTime: now, LeaderTransitions: 2}
	if err := lock.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := term.Check(); err != nil {
		t.Fatalf("after the acquire: %v", err)
	}
	if _, _, err := lock.Get(ctx); err != nil { // the lock keeps the read object for Update
		t.Fatal(err)
	}
	pauseOnUpdate.Store(clk)
	if err := lock.Update(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := term.Check(); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("a renew sent 5 s ago (lease 4 s) keeps the term: %v", err)
	}
	pauseOnUpdate.Store(nil)

	// Meanwhile b took the Lease: the paused process must not release it,
	// though client-go's release decides on the holder it observed before.
	leases := kube.CoordinationV1().Leases("default")
	l, err := leases.Get(ctx, "fence", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr("b")
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lock.Get(ctx); err != nil {
		t.Fatal(err)
	}
	release := resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now, LeaderTransitions: 2}
	if err := lock.Update(ctx, release); !errors.Is(err, ErrLeaseHeldByOther) {
		t.Fatalf("release of b's Lease: %v, want ErrLeaseHeldByOther", err)
	}
	if l, err := leases.Get(ctx, "fence", metav1.GetOptions{}); err != nil || *l.Spec.HolderIdentity != "b" {
		t.Fatalf("b's Lease was released: %+v %v", l.Spec, err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// RunLeaderElected gives lead a term whose epoch is the Lease's
// leaseTransitions and holder; when the Lease is taken by another holder,
// the term ends, lead's context ends, and a publish with the term's
// options is fenced (nothing is stored).
func TestRunLeaderElectedTermFollowsTheLease(t *testing.T) {
	kube := startKube(t)
	b := newBus(t)
	ctx := context.Background()
	term, ended := startLeading(t, kube, LeaderConfig{Namespace: "default", LeaseName: "run", Identity: "a"})
	leases := kube.CoordinationV1().Leases("default")
	l, err := leases.Get(ctx, "run", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := events.Epoch{Lease: "default/run", Term: int64(*l.Spec.LeaseTransitions), Leader: "a"}
	if got := term.Epoch(); got == nil || *got != want {
		t.Fatalf("epoch %v, want %v", got, want)
	}
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	subj := b.Subjects().Instance("ns.x")
	inst := events.Instance{Key: "ns.x", URL: "https://x:1", Scope: "t"}
	if err := b.Publish(ctx, subj, events.TypeInstanceAppeared, "held", inst, term.PublishOptions()...); err != nil {
		t.Fatalf("publish while held: %v", err)
	}
	stored, _, err := b.LastInstance(ctx, "ns.x")
	if err != nil || stored.Epoch == nil || *stored.Epoch != want {
		t.Fatalf("stored record epoch %v (%v), want %v", stored.Epoch, err, want)
	}

	// Another process takes the Lease (as after this one was paused).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, "run", metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = ptr("b")
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		l.Spec.LeaseTransitions = ptr(*l.Spec.LeaseTransitions + 1)
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("lead's context did not end after the Lease moved to b")
	}
	if err := term.Check(); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("term after the Lease moved: %v, want ErrNotLeading", err)
	}
	err = b.Publish(ctx, subj, events.TypeInstanceGone, "deposed", inst, term.PublishOptions()...)
	if !errors.Is(err, events.ErrFenced) {
		t.Fatalf("publish of the deposed term: %v, want ErrFenced", err)
	}
	if last, _, _ := b.LastInstance(ctx, "ns.x"); last.Seq != stored.Seq {
		t.Fatalf("the deposed term's publish was stored (seq %d, was %d)", last.Seq, stored.Seq)
	}
	l, err = leases.Get(ctx, "run", metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != "b" {
		t.Fatalf("the deposed leader changed the Lease: %+v %v", l.Spec, err)
	}
}

func ptr[T any](v T) *T { return &v }

// startLeading runs RunLeaderElected with cfg (lease 4 s, renew deadline
// 3 s, retry period 200 ms) until the test ends and returns the first
// term's once leading, and a channel that receives when a term's context
// ends.
func startLeading(t *testing.T, kube kubernetes.Interface, cfg LeaderConfig) (*Term, <-chan struct{}) {
	t.Helper()
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 3*time.Second, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	terms := make(chan *Term, 4)
	ended := make(chan struct{}, 4)
	done := make(chan error, 1)
	go func() {
		done <- RunLeaderElected(ctx, kube, cfg, nil, func(lctx context.Context, term *Term) {
			select {
			case terms <- term:
			default: // later terms are not the test's
			}
			<-lctx.Done()
			select {
			case ended <- struct{}{}:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case term := <-terms:
		return term, ended
	case <-time.After(30 * time.Second):
		t.Fatal("not leading")
		return nil, nil
	}
}

// A publisher whose term is held stamps every instance event and sync job
// with the term's epoch; once the term's last renew is older than lease −
// margin it publishes nothing more (here: no gone event and no clean-up
// job for an instance removed from the source) and steps down.
func TestPublisherFencedByTerm(t *testing.T) {
	b, js := newBusJS(t)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	term := newTerm(clk, "ns/lease", "a", 4*time.Second, time.Second, nil, stop)
	term.observed(clk.Now(), rec("a", 3))
	two := []StaticEntry{{Namespace: "ns", Name: "mat-0", URL: "https://a:1266"}, {Namespace: "ns", Name: "mat-1", URL: "https://b:1266"}}
	src, err := NewStatic("t", two)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- NewPublisher(b, src, PublisherConfig{SyncInterval: time.Hour}, nil, nil).Lead(ctx, term)
	}()
	eventually(t, "both instances present", func() bool { return present(b, "ns.mat-0")() && present(b, "ns.mat-1")() })
	eventually(t, "a sync job per instance", func() bool { return jobs(t, b, events.StreamSync, b.Subjects().SyncJobs()) == 2 })
	want := *term.Epoch()
	for _, key := range []string{"ns.mat-0", "ns.mat-1"} {
		r, _, err := b.LastInstance(ctx, key)
		if err != nil || r.Epoch == nil || *r.Epoch != want {
			t.Errorf("%s: record epoch %v (%v), want %v", key, r.Epoch, err, want)
		}
		s, err := js.Stream(ctx, b.StreamName(events.StreamSync))
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetLastMsgForSubject(ctx, b.Subjects().Sync(key))
		if err != nil {
			t.Fatal(err)
		}
		env, err := events.Decode(m.Data)
		if err != nil || env.Epoch == nil || *env.Epoch != want {
			t.Errorf("%s: sync job epoch %v (%v), want %v", key, env.Epoch, err, want)
		}
	}

	clk.Step(3 * time.Second) // no renew for lease − margin
	if err := src.Set(two[:1]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the publisher did not stop after its term passed")
	}
	if !present(b, "ns.mat-1")() {
		t.Error("a publisher whose term passed published mat-1 gone")
	}
	if n := jobs(t, b, events.StreamSync, b.Subjects().Cleanup("ns.mat-1")); n != 0 {
		t.Errorf("a publisher whose term passed published %d clean-up jobs", n)
	}
	if c := context.Cause(ctx); !errors.Is(c, ErrNotLeading) {
		t.Errorf("step-down cause %v, want ErrNotLeading", c)
	}
}

// A Lease that does not exist (deleted) would start its terms at 0 again,
// below the epochs on the instances stream: with LeaderConfig.Bus the
// first term is one above the newest stored term of that Lease, and stays
// so across renews.
func TestRecreatedLeaseStartsAboveStoredTerms(t *testing.T) {
	kube := startKube(t)
	b := newBus(t)
	ctx := context.Background()
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	stored := &events.Epoch{Lease: "default/again", Term: 6, Leader: "old"}
	other := &events.Epoch{Lease: "default/other", Term: 40, Leader: "x"}
	for key, ep := range map[string]*events.Epoch{"ns.a": stored, "ns.b": other} {
		inst := events.Instance{Key: key, URL: "https://x:1", Scope: "t"}
		if err := b.Publish(ctx, b.Subjects().Instance(key), events.TypeInstanceGone, key, inst, events.WithEpoch(ep)); err != nil {
			t.Fatal(err)
		}
	}
	term, _ := startLeading(t, kube, LeaderConfig{Namespace: "default", LeaseName: "again", Identity: "a", Bus: b})
	if got := term.Epoch(); got.Term != 7 {
		t.Fatalf("first term of a created Lease %v, want 7 (stored 6 on it; 40 on another Lease)", got)
	}
	time.Sleep(time.Second) // several renews
	if err := term.Check(); err != nil {
		t.Fatalf("after renews: %v", err)
	}
	l, err := kube.CoordinationV1().Leases("default").Get(ctx, "again", metav1.GetOptions{})
	if err != nil || *l.Spec.LeaseTransitions != 7 {
		t.Fatalf("Lease transitions %v (%v), want 7", l.Spec.LeaseTransitions, err)
	}
}
