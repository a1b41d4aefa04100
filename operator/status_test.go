package operator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

// TestWriteStatusText: what is unknown is "-" and named on an unknown:
// line; an instance the sources API does not list says NO; a leader entry
// older than three refreshes is STALE, with its age and no leading time
// counting up, and the rows' rotation "?"; Services unknown is said in the
// summary.
func TestWriteStatusText(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	no := false
	st := &Status{Time: now, Namespace: "ns", Rows: []StatusRow{
		{Instance: "ns.a", URL: "https://a:1266", Published: &no,
			State:     &events.InstanceState{Key: "ns.a", InRotation: false, PollIntervalMS: 1000, ProbeIntervalMS: 8000, FailedFetches: 6},
			LastError: &ErrorSummary{Kind: events.ErrorFetch, Time: now.Add(-90 * time.Second)}},
		{Instance: "ns.b", URL: "https://b:1266"},
	}, Summary: Summary{Instances: 2, Services: -1,
		Leader:      &events.LeaderState{Identity: "discovery/p", Since: now.Add(-time.Hour), Updated: now.Add(-time.Minute)},
		LeaderStale: true, StateStale: true, Unknown: []string{"Services: no kubeconfig", "sources API: connection refused"}}}
	var b bytes.Buffer
	if err := WriteStatusText(&b, st); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []struct {
		line int
		has  []string
	}{
		{2, []string{"ns.b", "https://b:1266"}},
		{1, []string{"ns.a", "? (was OUT, 6 failed)", "never", "fetch 1m30s ago", "NO"}},
		{4, []string{"2 instances, unknown Services; consumers unknown; discovery leader discovery/p STALE (written 1m0s ago, leading 59m0s then)"}},
		{5, []string{"unknown: Services: no kubeconfig"}},
		{6, []string{"unknown: sources API: connection refused"}},
	}
	if len(lines) != 7 {
		t.Fatalf("%d lines, want 7:\n%s", len(lines), b.String())
	}
	for _, w := range want {
		for _, h := range w.has {
			if !strings.Contains(lines[w.line], h) {
				t.Errorf("line %d %q lacks %q", w.line, lines[w.line], h)
			}
		}
	}
	if f := strings.Fields(lines[2]); len(f) != 9 || f[2] != "-" || f[3] != "-" || f[4] != "-" || f[5] != "-" || f[6] != "-" || f[7] != "-" || f[8] != "-" {
		t.Errorf("an instance without state, Services, error or sources answer: %q, want - in every column after the URL", lines[2])
	}
}

// TestWriteStatusTextLeaders: a live leader's rows show their rotation and
// the leading time; a leader that stepped down is "no discovery leader"
// with its identity and the age of its step-down, and the rows' rotation
// is "?" with the last value, their last sync and worker kept.
func TestWriteStatusTextLeaders(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	row := StatusRow{Instance: "ns.a", URL: "https://a:1266", State: &events.InstanceState{Key: "ns.a", InRotation: true,
		PollIntervalMS: 1000, LastGoodSync: now.Add(-5 * time.Minute), Worker: "w1"}}
	for _, c := range []struct {
		name      string
		sum       Summary
		row, last string
	}{
		{"live", Summary{Leader: &events.LeaderState{Identity: "discovery/vm", Since: now.Add(-time.Hour), Updated: now.Add(-2 * time.Second)}},
			"in (poll 1s)", "discovery leader discovery/vm (leading 1h0m0s, written 2s ago)"},
		{"stepped down", Summary{StateStale: true, Leader: &events.LeaderState{Identity: "discovery/vm", Since: now.Add(-time.Hour),
			Updated: now.Add(-3 * time.Minute), Ended: now.Add(-3 * time.Minute)}},
			"? (was in)", "no discovery leader (last: discovery/vm, stepped down 3m0s ago after leading 57m0s)"},
		{"none", Summary{StateStale: true}, "? (was in)", "; no discovery leader"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteStatusText(&b, &Status{Time: now, Namespace: "ns", Rows: []StatusRow{row}, Summary: c.sum}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			if len(lines) != 4 || !strings.Contains(lines[1], c.row) || !strings.Contains(lines[1], "5m0s ago") || !strings.Contains(lines[1], " w1 ") ||
				!strings.HasSuffix(lines[3], c.last) {
				t.Errorf("want the row with %q, last sync 5m0s ago, worker w1, and the summary ending %q:\n%s", c.row, c.last, b.String())
			}
		})
	}
}

// TestWriteStatusJSONNewline: the JSON document ends with a newline.
func TestWriteStatusJSONNewline(t *testing.T) {
	var b bytes.Buffer
	if err := WriteStatusJSON(&b, &Status{Namespace: "ns"}); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.HasSuffix(s, "}\n") || strings.HasSuffix(s, "\n\n") {
		t.Errorf("status JSON does not end with exactly one newline: %q", s[max(len(s)-10, 0):])
	}
}

// errorConsumers returns the number of consumers of bus's error stream.
func errorConsumers(t *testing.T, js jetstream.JetStream, bus *events.Bus) (int, string) {
	t.Helper()
	s, err := js.Stream(context.Background(), bus.StreamName(events.StreamErrors))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		return -1, err.Error()
	}
	return info.State.Consumers, fmt.Sprint(info.State.Consumers, " consumers")
}

// TestStatusLeavesNoConsumer: ReadStatus reads the error stream with an
// ordered consumer that is gone once it returns; a stepped-down leader's
// entry makes the state stale.
func TestStatusLeavesNoConsumer(t *testing.T) {
	defer func(d time.Duration) { consumerInactive = d }(consumerInactive)
	consumerInactive = time.Second
	ctx := context.Background()
	nc := testenv.NATS(t)
	bus, err := events.New(nc, events.Config{Namespace: "ns", Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bus.Publish(ctx, bus.Subjects().Error(events.ErrorFetch), events.TypeError, "e1",
		events.Error{Kind: events.ErrorFetch, Instance: "ns.a", Message: "HTTP 500"}); err != nil {
		t.Fatal(err)
	}
	kv, err := bus.EnsureState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := kv.Put(ctx, events.StateLeaderKey("ns"), fmt.Appendf(nil, `{"identity":"discovery/vm","since":%q,"updated":%q,"ended":%q}`,
		now.Add(-time.Minute).Format(time.RFC3339Nano), now.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))); err != nil {
		t.Fatal(err)
	}
	before, _ := errorConsumers(t, js, bus)
	st, err := ReadStatus(ctx, StatusConfig{Bus: bus})
	if err != nil {
		t.Fatal(err)
	}
	if l := st.Summary.Leader; l == nil || l.Ended.IsZero() || !st.Summary.StateStale || st.Summary.LeaderStale {
		t.Errorf("summary %+v: want the ended leader entry and state_stale", st.Summary)
	}
	testenv.Wait(t, 5*time.Second, fmt.Sprintf("the error stream's consumers back to %d", before), func() (bool, string) {
		n, s := errorConsumers(t, js, bus)
		return n == before, s
	})
}

// TestTailErrorsIdleKeepsConsumer: an idle TailErrors --follow keeps its
// ordered consumer beyond the inactive threshold (its waiting pull
// requests are activity) and still prints a later event; its consumer is
// gone once it returns.
func TestTailErrorsIdleKeepsConsumer(t *testing.T) {
	defer func(d time.Duration) { consumerInactive = d }(consumerInactive)
	consumerInactive = time.Second
	ctx := context.Background()
	nc := testenv.NATS(t)
	bus, err := events.New(nc, events.Config{Namespace: "ns", Memory: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	var out, notes testenv.Buffer
	tctx, cancel := context.WithCancel(ctx)
	reading := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- TailErrors(tctx, ErrorsConfig{Bus: bus, Follow: true, Out: &out, Notes: &notes, Reading: func() { close(reading) }})
	}()
	defer func() { cancel(); <-done }()
	<-reading
	testenv.Wait(t, 5*time.Second, "the line saying it follows", func() (bool, string) {
		return strings.Contains(notes.String(), "following error events on mat.errors.> of stream MAT_ERRORS: new ones"), notes.String()
	})
	time.Sleep(3 * consumerInactive)
	if n, s := errorConsumers(t, js, bus); n != 1 {
		t.Fatalf("after %v idle: %s, want the follower's one", 3*consumerInactive, s)
	}
	if err := bus.Publish(ctx, bus.Subjects().Error(events.ErrorFetch), events.TypeError, "e1",
		events.Error{Kind: events.ErrorFetch, Instance: "ns.a", Message: "HTTP 500"}); err != nil {
		t.Fatal(err)
	}
	testenv.Wait(t, 5*time.Second, "the event printed", func() (bool, string) {
		return strings.Contains(out.String(), "HTTP 500"), out.String()
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("TailErrors: %v", err)
	}
	done <- nil
	testenv.Wait(t, 5*time.Second, "no consumer left", func() (bool, string) {
		n, s := errorConsumers(t, js, bus)
		return n == 0, s
	})
}

// TestWriteStatusTextHolds: the HELD column shows a hold in force with the
// time left, one whose window is over, and one released; the summary
// counts the deletes held now.
func TestWriteStatusTextHolds(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	st := &Status{Time: now, Namespace: "ns", Rows: []StatusRow{
		{Instance: "ns.a", URL: "https://a:1266", Hold: &HoldSummary{Reason: "all", Held: 400, Existing: 400, Since: now.Add(-time.Minute), Until: now.Add(4 * time.Minute)}},
		{Instance: "ns.b", URL: "https://b:1266", Hold: &HoldSummary{Reason: "share", Held: 7, Existing: 10, Since: now.Add(-6 * time.Minute), Until: now.Add(-time.Minute)}},
		{Instance: "ns.c", URL: "https://c:1266", Hold: &HoldSummary{Reason: "epoch", Held: 3, Since: now.Add(-6 * time.Minute), Until: now.Add(-time.Minute), Released: now.Add(-50 * time.Second)}},
	}, Summary: Summary{Instances: 3, Services: 10, HeldDeletes: 407, HeldInstances: 2}}
	var b bytes.Buffer
	if err := WriteStatusText(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"HELD", "400 (all, 4m0s left)", "7 (share, window over 1m0s ago)", "deleting 3",
		"held deletes: 407 Services of 2 instances"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// TestWriteStatusTextWorkers: the workers line names each live worker
// with its configuration, and which one stands by for whom.
func TestWriteStatusTextWorkers(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	st := &Status{Time: now, Namespace: "ns", Summary: Summary{Services: -1, Workers: []events.WorkerEntry{
		{WorkerState: events.WorkerState{Name: "w-old", Fingerprint: "aaaaaaaaaaaa", Standby: true, StandbyFor: "w-new"}, EpochOf: 3},
		{WorkerState: events.WorkerState{Name: "w-new", Fingerprint: "bbbbbbbbbbbb"}, EpochOf: 9},
	}}}
	var b bytes.Buffer
	if err := WriteStatusText(&b, st); err != nil {
		t.Fatal(err)
	}
	want := "workers: w-old (config aaaaaaaaaaaa, STANDING BY for w-new), w-new (config bbbbbbbbbbbb)\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}

// TestStatusNoPipeline: a namespace without instance records and without
// a discovery leader is ErrNoPipeline, naming the namespace and prefix it
// looked in and the namespaces that have instances on that NATS; one with
// records is read as before.
func TestStatusNoPipeline(t *testing.T) {
	ctx := context.Background()
	nc := testenv.NATS(t)
	bus := func(ns string) *events.Bus {
		b, err := events.New(nc, events.Config{Namespace: ns, Memory: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.EnsureStreams(ctx); err != nil {
			t.Fatal(err)
		}
		return b
	}
	appear := func(b *events.Bus, key string) {
		inst := events.Instance{Key: key, URL: "https://mat.example:1266", Scope: "static:t"}
		if err := b.Publish(ctx, b.Subjects().Instance(key), events.TypeInstanceAppeared, key, inst); err != nil {
			t.Fatal(err)
		}
	}
	def := bus("default")
	for _, tt := range []struct {
		publish string // namespace of an instance published before reading
		want    string
	}{
		{"", `in namespace "default" (no instance record and no discovery leader under subject prefix "mat"); no namespace has one on this NATS under that prefix`},
		{"lab", `namespace lab has one on this NATS: give --namespace lab`},
		{"dev", `these namespaces have one on this NATS: dev, lab (give one with --namespace)`},
	} {
		if tt.publish != "" {
			appear(bus(tt.publish), tt.publish+".mat-0")
		}
		_, err := ReadStatus(ctx, StatusConfig{Bus: def})
		if !errors.Is(err, ErrNoPipeline) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("after publishing in %q: error %v, want ErrNoPipeline saying %q", tt.publish, err, tt.want)
		}
	}
	st, err := ReadStatus(ctx, StatusConfig{Bus: bus("lab")})
	if err != nil || len(st.Rows) != 1 || st.Rows[0].Instance != "lab.mat-0" {
		t.Fatalf("namespace lab: %+v, %v; want its one instance", st, err)
	}
}
