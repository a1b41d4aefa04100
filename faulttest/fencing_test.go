package faulttest

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// discoveryMsgs records every instance event, sync and clean-up job that
// reaches NATS (a core subscription sees a publish even when the stream
// refuses to store it), with its sender and epoch.
type discoveryMsgs struct {
	mu   sync.Mutex
	list []discoveryMsg
}

type discoveryMsg struct {
	at      time.Time
	subject string
	source  string
	id      string
	epoch   *events.Epoch
}

func (d *discoveryMsgs) add(m *nats.Msg) {
	env, err := events.Decode(m.Data)
	if err != nil {
		return
	}
	d.mu.Lock()
	d.list = append(d.list, discoveryMsg{at: time.Now(), subject: m.Subject, source: env.Source, id: env.ID, epoch: env.Epoch})
	d.mu.Unlock()
}

// by returns the messages of source since t0.
func (d *discoveryMsgs) by(source string, t0 time.Time) []discoveryMsg {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []discoveryMsg
	for _, m := range d.list {
		if m.source == source && !m.at.Before(t0) {
			out = append(out, m)
		}
	}
	return out
}

// fencing is one run of the split-brain scenario with the given Lease timing.
type fencing struct {
	lease, renew, retry time.Duration
	freeze              time.Duration // how long the leader is stopped (past the lease)
	window              time.Duration // how long after the thaw Service creates are watched
}

// TestDeposedLeaderIsFenced: two `matbus discovery` processes (lease 4 s,
// renew deadline 3 s) and a worker. The leader is frozen with SIGSTOP for
// 12 s; meanwhile one MAT Service is deleted and another created, and the
// other process takes the Lease and handles both. After SIGCONT the old
// leader publishes nothing (it notices that its last renew is older than
// lease − margin, or the pause, before anything else), no Service of the
// gone instance is created in the window after the thaw, and the new
// leader converges the fleet. Then the receiver side: a message with the
// old leader's epoch, as one that beat its checks would be, is refused by
// the worker with an error event and changes nothing, and an instance
// event based on a read from before the takeover is refused by the stream
// (expected last subject sequence).
func TestDeposedLeaderIsFenced(t *testing.T) {
	runFencing(t, fencing{lease: 4 * time.Second, renew: 3 * time.Second, retry: 500 * time.Millisecond,
		freeze: 12 * time.Second, window: 6 * time.Second})
}

// TestDeposedLeaderIsFencedDefaultLease is TestDeposedLeaderIsFenced with
// the default Lease settings (15 s lease, 10 s renew deadline, 2 s retry
// period): the freeze is 22 s and the window after the thaw 12 s, longer
// than the renew deadline the old leader used to keep publishing for.
func TestDeposedLeaderIsFencedDefaultLease(t *testing.T) {
	if testing.Short() {
		t.Skip("about a minute; runs without -short (make test)")
	}
	runFencing(t, fencing{lease: 15 * time.Second, renew: 10 * time.Second, retry: 2 * time.Second,
		freeze: 22 * time.Second, window: 12 * time.Second})
}

func runFencing(t *testing.T, f fencing) {
	w := newWorld(t)
	spec := fleetSpec{hosts: 3, switches: 1} // 7 Services each
	keep, gone, added := w.newInstance("mat-keep", spec, 0), w.newInstance("mat-gone", spec, 0), w.newInstance("mat-new", spec, 0)
	msgs := &discoveryMsgs{}
	for _, subj := range []string{w.bus.Subjects().Instances(), w.bus.Subjects().SyncJobs(), w.bus.Subjects().CleanupJobs()} {
		if _, err := w.nc.Subscribe(subj, msgs.add); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w.discover(keep)
	w.discover(gone)
	w.startWorker("w1")
	timing := []string{"--leader-elect-lease-duration", f.lease.String(), "--leader-elect-renew-deadline", f.renew.String(),
		"--leader-elect-retry-period", f.retry.String()}
	procs := map[string]*proc{"disc-1": w.startDiscovery("disc-1", timing...), "disc-2": w.startDiscovery("disc-2", timing...)}
	lease := func() (string, int64) {
		l, err := adminKube.CoordinationV1().Leases(w.ns).Get(w.ctx, "matbus-discovery", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.LeaseTransitions == nil {
			return "", -1
		}
		return *l.Spec.HolderIdentity, int64(*l.Spec.LeaseTransitions)
	}
	w.waitFor("a leader", 60*time.Second, func() (bool, string) { h, _ := lease(); return h != "", "no holder" })
	leader, oldTerm := lease()
	follower := "disc-1"
	if leader == "disc-1" {
		follower = "disc-2"
	}
	old := procs[leader]
	stayUIDs := uidsOf(keep.waitConverged(time.Minute))
	gone.waitConverged(time.Minute)
	w.waitFor("the leader's epoch on the instance records", 30*time.Second, func() (bool, string) {
		rec, _, err := w.bus.LastInstance(w.ctx, gone.key())
		return err == nil && rec.Epoch != nil && rec.Epoch.Term == oldTerm && rec.Epoch.Leader == leader,
			fmt.Sprintf("record epoch %v (%v)", rec.Epoch, err)
	})
	before, _, err := w.bus.LastInstance(w.ctx, gone.key()) // the old leader's read of mat-gone
	if err != nil {
		t.Fatal(err)
	}
	oldEpoch := *before.Epoch

	// The leader freezes; the world changes; the other takes over.
	w.onStop(func() { _ = old.cmd.Process.Signal(syscall.SIGCONT) })
	frozen := time.Now()
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	w.undiscover(gone)
	w.discover(added)
	took := w.waitFor(follower+" takes the Lease", f.freeze, func() (bool, string) {
		h, _ := lease()
		return h == follower, "holder " + h
	})
	t.Logf("measured: %s holds the Lease %v after %s was frozen (lease %v)", follower, took.Round(time.Millisecond), leader, f.lease)
	_, newTerm := lease()
	gone.waitGone(f.freeze)
	added.waitConverged(f.freeze)
	if d := f.freeze - time.Since(frozen); d > 0 {
		time.Sleep(d)
	}

	// Watch every Service create of the gone instance from the thaw on.
	list, err := adminKube.CoreV1().Services(w.ns).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	goneSel := plan.InstanceSelector(plan.Options{}, gone.key()).String()
	wt, err := adminKube.CoreV1().Services(w.ns).Watch(w.ctx, metav1.ListOptions{LabelSelector: goneSel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	var recreated []string
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range wt.ResultChan() {
			if s, ok := ev.Object.(*corev1.Service); ok && ev.Type == watch.Added {
				recreated = append(recreated, s.Name)
			}
		}
	}()
	stepped := old.log.Watch("stepping down") // before the thaw: the line may come at once
	thaw := time.Now()
	if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: %s frozen for %v (lease %v, renew deadline %v)", leader, thaw.Sub(frozen).Round(time.Millisecond), f.lease, f.renew)
	select {
	case line := <-stepped:
		t.Logf("measured: %s stepped down %v after the thaw: %s", leader, time.Since(thaw).Round(time.Millisecond), line)
	case <-time.After(f.window):
		t.Errorf("%s did not log a step-down within %v of the thaw", leader, f.window)
	}
	if d := f.window - time.Since(thaw); d > 0 {
		time.Sleep(d)
	}

	// The old leader published nothing after the thaw.
	src := "discovery/" + leader
	late := msgs.by(src, thaw)
	if len(late) > 0 {
		t.Errorf("the old leader published %d messages after the thaw, the first %v after it: %s %s (epoch %v)",
			len(late), late[0].at.Sub(thaw).Round(time.Millisecond), late[0].subject, late[0].id, late[0].epoch)
		t.Logf("measured: the old leader's last message %v after the thaw", late[len(late)-1].at.Sub(thaw).Round(time.Millisecond))
	} else {
		t.Logf("measured: the old leader published 0 messages in the %v after the thaw", f.window)
	}
	for _, m := range msgs.by("discovery/"+follower, frozen) {
		if m.epoch == nil || m.epoch.Term != newTerm || m.epoch.Leader != follower {
			t.Errorf("new leader's %s carries epoch %v, want term %d of %s", m.id, m.epoch, newTerm, follower)
			break
		}
	}
	refused := 0
	for _, e := range w.errs.Since(frozen) {
		if e.Err.Kind == events.ErrorDiscovery && strings.Contains(e.Err.Message, "deposed") {
			refused += 1 + e.Err.Suppressed
		}
	}
	t.Logf("measured: the worker refused %d messages of the old leader", refused)

	// Receiver side: messages of the old epoch, as if they had beaten the
	// old leader's checks, change nothing.
	forged := time.Now()
	appeared := events.Instance{Key: gone.key(), URL: gone.url, Scope: before.Instance.Scope}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Instance(gone.key()), events.TypeInstanceAppeared, "forged-appeared", appeared,
		events.WithEpoch(&oldEpoch)); err != nil {
		t.Fatal(err)
	}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Sync(gone.key()), events.TypeSyncJob, "forged-sync",
		events.SyncJob{Key: gone.key(), Reason: events.ReasonAppeared}, events.WithEpoch(&oldEpoch)); err != nil {
		t.Fatal(err)
	}
	if err := w.bus.Publish(w.ctx, w.bus.Subjects().Cleanup(keep.key()), events.TypeCleanupJob, "forged-cleanup",
		events.CleanupJob{Key: keep.key(), Scope: before.Instance.Scope}, events.WithEpoch(&oldEpoch)); err != nil {
		t.Fatal(err)
	}
	w.waitFor("the worker refuses the old epoch's messages", 30*time.Second, func() (bool, string) {
		n := 0
		for _, e := range w.errs.Since(forged) {
			if e.Err.Kind == events.ErrorDiscovery && strings.Contains(e.Err.Message, "forged-") {
				n++
			}
		}
		return n == 3, fmt.Sprintf("%d of 3 refusals reported:\n%s", n, w.errs)
	})
	// The stream side: an event based on the old leader's read of mat-gone.
	err = w.bus.Publish(w.ctx, w.bus.Subjects().Instance(gone.key()), events.TypeInstanceAppeared, "stale-read", appeared,
		events.WithEpoch(&oldEpoch), events.WithExpectedLastSubjectSeq(before.Seq))
	if !errors.Is(err, events.ErrWrongLastSequence) {
		t.Errorf("an instance event based on a read from before the takeover: %v, want ErrWrongLastSequence", err)
	}
	// The new leader rewrites the forged record.
	w.waitFor("the new leader rewrites mat-gone's record", 30*time.Second, func() (bool, string) {
		rec, _, err := w.bus.LastInstance(w.ctx, gone.key())
		return err == nil && !rec.Present() && rec.Epoch != nil && rec.Epoch.Term == newTerm, fmt.Sprintf("record %s epoch %v (%v)", rec.Type, rec.Epoch, err)
	})
	time.Sleep(2 * syncInterval) // a tick or two of the new leader and the worker

	wt.Stop()
	<-watched
	if len(recreated) > 0 {
		t.Errorf("Services of the gone instance created after the thaw: %v", recreated)
	}
	if n := len(gone.services()); n != 0 {
		t.Errorf("mat-gone has %d Services, want none", n)
	}
	added.waitConverged(30 * time.Second)
	if got := uidsOf(keep.waitConverged(30 * time.Second)); !maps.Equal(got, stayUIDs) {
		t.Errorf("mat-keep's Services were re-created")
	}
	if h, _ := lease(); h != follower {
		t.Errorf("the Lease is held by %q, want %s", h, follower)
	}
	if old.Exited() {
		t.Errorf("the old leader exited: %v", old.state)
	}
	t.Logf("error events:\n%s", w.errs)
}
