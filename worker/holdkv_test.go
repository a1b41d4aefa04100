package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

// TestHoldRecordConflicts: on a real JetStream bucket, of concurrent
// creates of one hold record exactly one wins and the others are
// conflicts; an update or a delete under a stale revision is a conflict
// too, never a silent overwrite.
func TestHoldRecordConflicts(t *testing.T) {
	js := testenv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T_STATE", History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	const key = "hold.ns.mat"
	var won, lost atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := kv.Create(ctx, key, []byte("{}"))
			switch {
			case err == nil:
				won.Add(1)
			case conflict(err):
				lost.Add(1)
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 || lost.Load() != 7 {
		t.Fatalf("%d creates won, %d conflicts; want 1 and 7", won.Load(), lost.Load())
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	stale := e.Revision()
	if _, err := kv.Update(ctx, key, []byte(`{"a":1}`), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, key, []byte(`{"a":2}`), stale); !conflict(err) {
		t.Errorf("update under a stale revision: %v, want a conflict", err)
	}
	if err := kv.Delete(ctx, key, jetstream.LastRevision(stale)); !conflict(err) {
		t.Errorf("delete under a stale revision: %v, want a conflict", err)
	}
	e, _ = kv.Get(ctx, key)
	if err := kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
		t.Errorf("delete under the current revision: %v", err)
	}
	// A removed record can be created again.
	if _, err := kv.Create(ctx, key, []byte("{}")); err != nil {
		t.Errorf("create after delete: %v", err)
	}
	if conflict(nil) || conflict(context.Canceled) {
		t.Error("no error, or another error, is no conflict")
	}
}
