package faulttest

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/matbus/matbus/events"
)

// versions maps Service names to "uid/resourceVersion": equal maps mean
// nothing was re-created or even updated.
func versions(svcs map[string]corev1.Service) map[string]string {
	out := make(map[string]string, len(svcs))
	for n, s := range svcs {
		out[n] = string(s.UID) + "/" + s.ResourceVersion
	}
	return out
}

// TestEventIdentity (issue point 7): de-duplication ids change with the
// event. An instance that appears, goes and appears again three times
// within the duplicate window has every transition stored (none swallowed
// as a duplicate) and ends present with its Services; then it ends gone
// with none. Re-published duplicates are harmless: the same id is stored
// once; the same event under a new id, repeated sync jobs, a clean-up job
// and a "gone" delete job for an instance that is present, and a delete job
// for an older UID change nothing (same UIDs and resourceVersions) and
// publish no error event.
func TestEventIdentity(t *testing.T) {
	w := newWorld(t)
	spec := fleetSpec{hosts: 4, switches: 1, shelves: 1}
	flap, steady := w.newInstance("flap", spec, 0), w.newInstance("steady", spec, 0)
	w.startWorker("w1")
	w.startWorker("w2")
	disc := w.startStaticDiscovery(flap, steady)
	flap.waitConverged(time.Minute)
	before := versions(steady.waitConverged(time.Minute))

	record := func(in *instance) (events.InstanceRecord, bool) {
		rec, found, err := w.bus.LastInstance(w.ctx, in.key())
		if err != nil {
			t.Fatalf("read %s: %v", in.name, err)
		}
		return rec, found
	}
	first, _ := record(flap)
	start := time.Now()
	const flaps = 3
	for range flaps {
		disc.Remove(flap)
		w.waitFor("flap gone", 30*time.Second, func() (bool, string) {
			rec, found := record(flap)
			return found && !rec.Present(), "still present"
		})
		disc.Add(flap)
		w.waitFor("flap present", 30*time.Second, func() (bool, string) {
			rec, found := record(flap)
			return found && rec.Present(), "still gone"
		})
	}
	if d := time.Since(start); d >= w.bus.Config().DuplicateWindow {
		t.Fatalf("the flaps took %v, longer than the duplicate window %v: nothing proven", d, w.bus.Config().DuplicateWindow)
	}
	last, _ := record(flap)
	ctx := w.ctx
	stream, err := w.js.Stream(ctx, w.bus.StreamName(events.StreamInstances))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: %d appeared/gone transitions in %v; instance record sequence %d → %d",
		2*flaps, time.Since(start).Round(time.Millisecond), first.Seq, last.Seq)
	if last.Seq-first.Seq < 2*flaps {
		t.Errorf("record sequence advanced by %d for %d transitions: some were dropped as duplicates", last.Seq-first.Seq, 2*flaps)
	}
	flap.waitConverged(30 * time.Second)
	disc.Remove(flap)
	flap.waitGone(30 * time.Second)

	// Duplicates of the steady instance's events and jobs.
	raw, err := stream.GetLastMsgForSubject(ctx, w.bus.Subjects().Instance(steady.key()))
	if err != nil {
		t.Fatal(err)
	}
	id := raw.Header.Get(jetstream.MsgIDHeader)
	if id == "" {
		t.Fatal("stored appeared event has no Nats-Msg-Id")
	}
	ack, err := w.js.Publish(ctx, raw.Subject, raw.Data, jetstream.WithMsgID(id))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate || ack.Sequence != raw.Sequence {
		t.Errorf("re-published appeared event (id %s) stored again: %+v", id, ack)
	}
	if err := w.bus.PublishRaw(ctx, raw.Subject, id+"-again", raw.Data); err != nil {
		t.Fatal(err)
	}
	sync := events.SyncJob{Key: steady.key(), Reason: "test"}
	for i := range 5 {
		for range 2 { // each id twice
			if err := w.bus.Publish(ctx, w.bus.Subjects().Sync(steady.key()), events.TypeSyncJob, fmt.Sprintf("dup-sync-%d", i), sync); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.bus.Publish(ctx, w.bus.Subjects().Cleanup(steady.key()), events.TypeCleanupJob, "dup-cleanup",
		events.CleanupJob{Key: steady.key(), Scope: "static:faulttest"}); err != nil {
		t.Fatal(err)
	}
	for name, s := range steady.services() {
		for _, j := range []events.DeleteJob{
			{Key: steady.key(), Namespace: w.ns, Name: name, UID: string(s.UID), Reason: events.DeleteGone},
			{Key: steady.key(), Namespace: w.ns, Name: name, UID: "an-older-uid", Reason: events.DeleteStale},
		} {
			if err := w.bus.Publish(ctx, w.bus.Subjects().Delete(steady.key()), events.TypeDeleteJob, "dup-del-"+name+"-"+string(j.Reason), j); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.waitFor("duplicates handled", 30*time.Second, func() (bool, string) {
		d, err1 := w.streamMsgs("DELETE")
		sc, err2 := w.consumerInfo("SYNC", events.SyncConsumer)
		dc, err3 := w.consumerInfo("DELETE", events.DeleteConsumer)
		if err1 != nil || err2 != nil || err3 != nil {
			return false, fmt.Sprint(err1, err2, err3)
		}
		return d == 0 && sc.NumAckPending == 0 && dc.NumAckPending == 0 && sc.NumPending == 0,
			fmt.Sprintf("delete jobs %d, sync pending %d/%d", d, sc.NumPending, sc.NumAckPending)
	})
	time.Sleep(2 * syncInterval) // a few more ticks
	if after := versions(steady.services()); !maps.Equal(after, before) {
		t.Errorf("duplicates changed the steady instance's Services:\nbefore %v\nafter  %v", before, after)
	}
	if n := w.errs.Len(); n != 0 {
		t.Errorf("error events:\n%s", w.errs)
	}
}
