package worker_test

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/worker"
)

// TestManyInstancesLeaveNoGoroutine: 200 instances, each on its own MAT
// simulator, appear in one running worker, get their Services, and go
// away. Once their Services are deleted and the client cache is empty,
// the worker — still running — has no goroutine more than before they
// appeared: no MAT connection, per-instance gate, timer or backoff is left
// behind. Only the shared API server's HTTP/2 connections and klog's
// daemon are ignored; MAT's HTTP/1.1 connections are not.
func TestManyInstancesLeaveNoGoroutine(t *testing.T) {
	const n = 200
	e := newEnv(t)
	sims := make([]*matsim.Server, n)
	entries := make([]discovery.StaticEntry, n)
	var want []string
	for i := range sims {
		f, err := matsim.Generate(matsim.FleetSpec{Hosts: 1, BMCSubnet: fmt.Sprintf("10.100.%d.0/24", i), Seed: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		sims[i] = e.startSim(matsim.Options{Fleet: f})
		entries[i] = e.entry(fmt.Sprintf("mat-%03d", i), sims[i].URL())
		want = append(want, wantServiceNames(f)...)
	}
	// The publisher and the worker start with no instance.
	src, err := discovery.NewStatic("test", entries[:1])
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Set(nil); err != nil {
		t.Fatal(err)
	}
	e.startPublisher(src)
	metrics, err := worker.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	w := e.startWorker(workerOpts{Tweak: func(c *worker.Config) { c.Metrics = metrics }})
	time.Sleep(time.Second) // the publisher's first reconcile

	// goleak finds goroutines by id; a job consumer's pull request is
	// replaced every 10 s by design, so its two goroutines are counted by
	// the function they run instead: no function may run in more
	// goroutines than now.
	before, beforeProf := runtime.NumGoroutine(), goroutineProfile()
	opts := []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreTopFunction("github.com/matbus/matbus/internal/jobs.(*requests).drain"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*pullConsumer).fetch.func1"),
		goleak.IgnoreCurrent(),
	}

	if err := src.Set(entries); err != nil {
		t.Fatal(err)
	}
	e.waitServices(want...)
	waitFor(t, "every instance synced", func() (bool, string) {
		s := w.Cache().Stats()
		return len(s.URLs) == n, fmt.Sprintf("%d URLs cached", len(s.URLs))
	})
	during := runtime.NumGoroutine()
	if err := src.Set(nil); err != nil {
		t.Fatal(err)
	}
	e.waitServices()
	waitFor(t, "cache empty", func() (bool, string) {
		s := w.Cache().Stats()
		return len(s.URLs) == 0 && s.Closed == s.Created, fmt.Sprintf("%+v", s)
	})
	waitFor(t, "every per-instance store empty", func() (bool, string) {
		sizes := w.StateSizes()
		for _, n := range sizes {
			if n != 0 {
				return false, fmt.Sprintf("%v", sizes)
			}
		}
		return true, ""
	})
	// The pull requests that the delete fan-out split are merged once
	// they have expired (10 s after the last one was sent).
	gone := time.Now()
	more, leaked := settle(15*time.Second, beforeProf, opts...)
	t.Logf("measured: goroutines %d before %d instances appeared, %d while present, %d %v after the last went away",
		before, n, during, runtime.NumGoroutine(), time.Since(gone).Round(100*time.Millisecond))
	if leaked != nil {
		t.Errorf("goroutines left behind by instances that went away: %v", leaked)
	}
	if more != "" {
		t.Errorf("more goroutines than before the instances appeared (count: stack):\n%s", more)
	}
}

// TestRunLeavesNoGoroutine: every goroutine a worker starts (informer,
// consumers, pull requests, job runners, the shutdown grace, the hold
// watch, MAT clients) has ended when Run returns, with instances synced.
func TestRunLeavesNoGoroutine(t *testing.T) {
	e := newEnv(t)
	f, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, BMCSubnet: "10.101.0.0/24", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sim := e.startSim(matsim.Options{Fleet: f})
	src, err := discovery.NewStatic("test", []discovery.StaticEntry{e.entry("mat-0", sim.URL())})
	if err != nil {
		t.Fatal(err)
	}
	e.startPublisher(src)
	time.Sleep(time.Second) // the publisher's first reconcile
	opts := []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreCurrent(),
	}
	// The durable consumers the worker created live on in the server.
	for _, fn := range []string{"loopAndGatherMsgs", "processInboundAcks", "processInboundNextMsgReqs"} {
		opts = append(opts, goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*consumer)."+fn))
	}
	w := e.startWorker(workerOpts{})
	e.waitServices(wantServiceNames(f)...)
	w.Stop()
	if _, leaked := settle(10*time.Second, goroutineProfile(), opts...); leaked != nil {
		t.Errorf("goroutines left after Worker.Run returned: %v", leaked)
	}
}

// settle waits up to max until goleak finds no goroutine beyond opts and
// no stack has more goroutines than in before, and returns the last
// findings of both.
func settle(max time.Duration, before map[string]int, opts ...goleak.Option) (string, error) {
	deadline := time.Now().Add(max)
	for {
		err, more := goleak.Find(opts...), profileDiff(before, goroutineProfile())
		if err == nil && more == "" || time.Now().After(deadline) {
			return more, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// goroutineProfile counts goroutines by the function each runs (the
// outermost frame of its stack in runtime/pprof's debug=1 form, offset
// dropped), with the whole stack of one of them for the report. Keyed by
// that function, not by the whole stack, a goroutine that only moved
// within its work (the test's publisher reading the stream, say) is not
// counted as a new one, while a goroutine started and left behind is.
func goroutineProfile() map[string]int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	out := map[string]int{}
	for _, rec := range strings.Split(b.String(), "\n\n") {
		lines := strings.Split(strings.TrimSpace(rec), "\n")
		var count int
		if _, err := fmt.Sscanf(lines[0], "%d @", &count); err != nil {
			continue
		}
		var frames []string
		for _, l := range lines[1:] {
			if f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "#")); len(f) >= 2 {
				frames = append(frames, f[1])
			}
		}
		if len(frames) == 0 {
			continue
		}
		entry, _, _ := strings.Cut(frames[len(frames)-1], "+0x")
		out[entry] += count
	}
	return out
}

// profileDiff lists the functions that have more goroutines in after than
// in before (except the one taking the profile).
func profileDiff(before, after map[string]int) string {
	var lines []string
	for stack, n := range after {
		if d := n - before[stack]; d > 0 && stack != "testing.tRunner" {
			lines = append(lines, fmt.Sprintf("%+d: %s", d, stack))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
