package events

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/internal/testenv"
)

func newBus(t *testing.T, cfg Config) (*Bus, *nats.Conn) {
	t.Helper()
	nc := testenv.NATS(t)
	b, err := New(nc, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	return b, nc
}

func TestEnsureStreamsIdempotent(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx := context.Background()
	before := map[string]time.Time{}
	for _, cfg := range b.StreamConfigs() {
		s, err := b.js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		before[cfg.Name] = s.CachedInfo().Created
		if !streamSame(s.CachedInfo().Config, cfg) {
			t.Errorf("stream %s as stored differs from what matbus asks for", cfg.Name)
		}
	}
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	for name, created := range before {
		s, _ := b.js.Stream(ctx, name)
		if !s.CachedInfo().Created.Equal(created) {
			t.Errorf("stream %s was re-created", name)
		}
	}
	for _, name := range []string{SyncConsumer, DeleteConsumer} {
		c1, err := b.EnsureConsumer(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := b.EnsureConsumer(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c1.CachedInfo().Created != c2.CachedInfo().Created || c2.CachedInfo().Config.MaxDeliver != 5 {
			t.Errorf("consumer %s not stable: %+v", name, c2.CachedInfo().Config)
		}
	}
}

func TestPublishDeduplicatesAndInstancesRead(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx := context.Background()
	inst := Instance{Key: "ns.mat-0", URL: "https://h:1266", Scope: "static:t"}
	for i := 0; i < 3; i++ {
		if err := b.Publish(ctx, b.Subjects().Instance(inst.Key), TypeInstanceAppeared, "same-id", inst); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := b.js.Stream(ctx, b.StreamName(StreamInstances))
	info, _ := s.Info(ctx)
	if info.State.LastSeq != 1 {
		t.Fatalf("re-published event stored %d times", info.State.LastSeq)
	}
	rec, found, err := b.LastInstance(ctx, inst.Key)
	if err != nil || !found || !rec.Present() || rec.Instance != inst {
		t.Fatalf("LastInstance = %+v %v %v", rec, found, err)
	}
	if err := b.Publish(ctx, b.Subjects().Instance(inst.Key), TypeInstanceGone, "gone-1", inst); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, b.Subjects().Instance("ns.bad"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	recs, bad, err := b.Instances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[inst.Key].Present() || len(bad) != 1 || bad[0] != "ns.bad" {
		t.Fatalf("Instances = %+v bad=%v", recs, bad)
	}
	if _, found, _ := b.LastInstance(ctx, "ns.never"); found {
		t.Fatal("LastInstance found an instance never announced")
	}
}

func TestPublishRecreatesLostStream(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.js.DeleteStream(ctx, b.StreamName(StreamSync)); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, b.Subjects().Sync("ns.a"), TypeSyncJob, "s1", SyncJob{Key: "ns.a"}); err != nil {
		t.Fatalf("publish after the stream was lost: %v", err)
	}
	s, err := b.js.Stream(ctx, b.StreamName(StreamSync))
	if err != nil {
		t.Fatal(err)
	}
	if s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("stream holds %d messages", s.CachedInfo().State.Msgs)
	}
}

func TestSyncStreamKeepsFewJobsPerInstance(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		if err := b.Publish(ctx, b.Subjects().Sync("ns.a"), TypeSyncJob, "", SyncJob{Key: "ns.a"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Publish(ctx, b.Subjects().Cleanup("ns.a"), TypeCleanupJob, "", CleanupJob{Key: "ns.a", Scope: "s"}); err != nil {
		t.Fatal(err)
	}
	s, _ := b.js.Stream(ctx, b.StreamName(StreamSync))
	info, _ := s.Info(ctx, jetstream.WithSubjectFilter(b.Subjects().SyncJobs()))
	if info.State.Msgs != 3 { // 2 sync jobs kept + the clean-up job
		t.Fatalf("sync stream holds %d messages, want 3", info.State.Msgs)
	}
}

func TestReporterRateLimits(t *testing.T) {
	b, nc := newBus(t, Config{Memory: true})
	got := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(b.Subjects().Errors(), got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	r := NewReporter(b, nil, "w1", time.Hour)
	now := time.Now()
	r.now = func() time.Time { return now }
	ctx := context.Background()
	e := Error{Kind: ErrorDelete, Instance: "ns.a", Service: "ns/svc-1", Message: "forbidden"}
	if !r.Report(ctx, e) {
		t.Fatal("first event not published")
	}
	for i := 0; i < 5; i++ {
		if r.Report(ctx, e) {
			t.Fatal("repeated event published inside the window")
		}
	}
	e2 := e
	e2.Service = "ns/svc-2"
	if !r.Report(ctx, e2) {
		t.Fatal("event of another Service suppressed")
	}
	now = now.Add(2 * time.Hour)
	if !r.Report(ctx, e) {
		t.Fatal("event after the window suppressed")
	}
	var last Error
	for i := 0; i < 3; i++ {
		select {
		case m := <-got:
			env, err := Decode(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			last, _ = Into[Error](env, TypeError)
			if m.Subject != "mat.errors.delete" || last.Worker != "w1" {
				t.Fatalf("event on %s: %+v", m.Subject, last)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d events arrived", i)
		}
	}
	if last.Suppressed != 5 {
		t.Fatalf("Suppressed = %d, want 5", last.Suppressed)
	}
}

func TestReporterPublishesAChangedCause(t *testing.T) {
	b, _ := newBus(t, Config{Memory: true})
	r := NewReporter(b, nil, "w1", time.Hour)
	ctx := context.Background()
	e := Error{Kind: ErrorFetch, Instance: "ns.a", Message: "invalid status: machines: is null"}
	if !r.Report(ctx, e) {
		t.Fatal("first event not published")
	}
	e.Message = "invalid status: machines[0].bmc.redfish.listen_port: 70000 is out of range"
	if !r.Report(ctx, e) {
		t.Fatal("an event with another cause was suppressed")
	}
	e.Message = "invalid status: machines[3].bmc.redfish.listen_port: 70001 is out of range"
	if r.Report(ctx, e) {
		t.Fatal("the same cause with other numbers was published again inside the window")
	}
}

// TestEnsureStreamsKeepsStorage: a process configured for file storage
// joins streams and a state bucket another process made in memory (as
// `matbus dev` does): JetStream cannot change the storage, so EnsureStreams
// and EnsureState keep it, log it once at error level, and succeed.
func TestEnsureStreamsKeepsStorage(t *testing.T) {
	nc := testenv.NATS(t)
	ctx := context.Background()
	mem, err := New(nc, Config{Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.EnsureState(ctx); err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	file, err := New(nc, Config{}, slog.New(slog.NewJSONHandler(&logBuf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := file.EnsureStreams(ctx); err != nil {
			t.Fatalf("EnsureStreams over memory streams: %v", err)
		}
		if _, err := file.EnsureState(ctx); err != nil {
			t.Fatalf("EnsureState over a memory bucket: %v", err)
		}
	}
	names := []string{"KV_" + file.StateBucket()}
	for _, cfg := range file.StreamConfigs() {
		names = append(names, cfg.Name)
	}
	for _, name := range names {
		s, err := file.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st := s.CachedInfo().Config.Storage; st != jetstream.MemoryStorage {
			t.Errorf("stream %s storage = %v, want memory kept", name, st)
		}
		if n := strings.Count(logBuf.String(), `"stream":"`+name+`","storage":"Memory"`); n != 1 {
			t.Errorf("stream %s: %d log lines about its kept storage, want 1:\n%s", name, n, logBuf.String())
		}
	}
}

// TestKeepStreamsCreatesButNeverUpdates: a bus with KeepStreams (a
// worker's) creates the streams that are missing with its settings and
// leaves existing ones as they are, even when their settings differ; a bus
// without it (discovery's) updates them.
func TestKeepStreamsCreatesButNeverUpdates(t *testing.T) {
	nc := testenv.NATS(t)
	ctx := context.Background()
	keep, err := New(nc, Config{Memory: true, KeepStreams: true, ErrorMaxAge: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keep.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	errorsAge := func() time.Duration {
		s, err := keep.js.Stream(ctx, keep.StreamName(StreamErrors))
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.MaxAge
	}
	for _, cfg := range keep.StreamConfigs() {
		if _, err := keep.js.Stream(ctx, cfg.Name); err != nil {
			t.Errorf("stream %s not created: %v", cfg.Name, err)
		}
	}
	if got := errorsAge(); got != time.Hour {
		t.Fatalf("created error stream max age %v, want 1h", got)
	}
	other, err := New(nc, Config{Memory: true, KeepStreams: true, ErrorMaxAge: 2 * time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if got := errorsAge(); got != time.Hour {
		t.Errorf("a KeepStreams bus changed the error stream's max age to %v", got)
	}
	owner, err := New(nc, Config{Memory: true, ErrorMaxAge: 2 * time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if got := errorsAge(); got != 2*time.Hour {
		t.Errorf("the discovery's bus left the error stream's max age at %v, want 2h", got)
	}
}

// TestLastInstanceSharesFreshReads: concurrent LastInstance calls of one
// key share STREAM.MSG.GET requests, and every call still returns a record
// at least as new as the last one published before the call was made.
func TestLastInstanceSharesFreshReads(t *testing.T) {
	b, nc := newBus(t, Config{Memory: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	watch, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var gets atomic.Int64
	if _, err := watch.Subscribe("$JS.API.STREAM.MSG.GET.>", func(*nats.Msg) { gets.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	inst := Instance{Key: "ns.mat-0", URL: "https://h:1266", Scope: "static:t"}
	var published atomic.Int64 // the newest version whose publish was acknowledged
	publish := func(v int64) {
		inst := inst
		inst.Version = strconv.FormatInt(v, 10)
		if err := b.Publish(ctx, b.Subjects().Instance(inst.Key), TypeInstanceAppeared, "v"+inst.Version, inst); err != nil {
			t.Error(err)
			return
		}
		published.Store(v)
	}
	publish(1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for v := int64(2); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			publish(v)
			time.Sleep(time.Millisecond)
		}
	})
	const callers, calls = 32, 40
	var readers sync.WaitGroup
	for range callers {
		readers.Go(func() {
			for range calls {
				want := published.Load()
				rec, found, err := b.LastInstance(ctx, inst.Key)
				if err != nil || !found {
					t.Errorf("LastInstance: found=%v err=%v", found, err)
					return
				}
				got, _ := strconv.ParseInt(rec.Instance.Version, 10, 64)
				if got < want {
					t.Errorf("LastInstance returned version %d, made after version %d was published", got, want)
					return
				}
			}
		})
	}
	readers.Wait()
	close(stop)
	wg.Wait()
	_ = watch.Flush()
	if n := gets.Load(); n == 0 || n > callers*calls/2 {
		t.Errorf("%d concurrent calls sent %d STREAM.MSG.GET requests; want some, and at most half as many", callers*calls, n)
	} else {
		t.Logf("%d concurrent calls sent %d STREAM.MSG.GET requests", callers*calls, n)
	}
	b.readMu.Lock()
	left := len(b.reads)
	b.readMu.Unlock()
	if left != 0 {
		t.Errorf("%d keys' read state left after every call returned", left)
	}
}
