package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/testenv"
)

// sourcesFixture is the shape of GET /v1/sources: two discovered MAT
// Services in mat-system, the second of a multi-pod deployment.
const sourcesFixture = "testdata/sources.json"

// getSources fetches and decodes the document at url, failing on anything
// but a 200 JSON answer whose keys are exactly those of the fixture.
func getSources(t *testing.T, url string) Sources {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %s %q: %s", url, resp.Status, resp.Header.Get("Content-Type"), body)
	}
	checkShape(t, body)
	var s Sources
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkShape compares the keys of body with those of the fixture: the top
// level, and every entry of "sources" (which must be a list, never null).
func checkShape(t *testing.T, body []byte) {
	t.Helper()
	keys := func(b []byte) (top []string, entry []string) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("not a JSON object: %v: %s", err, b)
		}
		for k := range m {
			top = append(top, k)
		}
		var list []map[string]any
		if err := json.Unmarshal(m["sources"], &list); err != nil || list == nil {
			t.Fatalf("sources is not a list: %s", m["sources"])
		}
		for _, e := range list {
			var ks []string
			for k := range e {
				ks = append(ks, k)
			}
			if entry != nil && !sameSet(entry, ks) {
				t.Fatalf("entries with different keys: %v and %v", entry, ks)
			}
			entry = ks
		}
		return top, entry
	}
	fix, err := os.ReadFile(sourcesFixture)
	if err != nil {
		t.Fatal(err)
	}
	wantTop, wantEntry := keys(fix)
	gotTop, gotEntry := keys(body)
	if !sameSet(gotTop, wantTop) || gotEntry != nil && !sameSet(gotEntry, wantEntry) {
		t.Fatalf("keys %v / %v, want those of %s: %v / %v", gotTop, gotEntry, sourcesFixture, wantTop, wantEntry)
	}
}

func sameSet(a, b []string) bool {
	m := map[string]int{}
	for _, s := range a {
		m[s]++
	}
	for _, s := range b {
		m[s]--
	}
	for _, n := range m {
		if n != 0 {
			return false
		}
	}
	return true
}

// ep is the entry of a discovered Service name in namespace ns with pod.
func ep(name, pod string) SourceEntry {
	return SourceEntry{Name: name, BaseURL: "https://" + ServiceDNSName(name, "ns", "") + ":1266", Pod: pod}
}

// entries is a fixed EntrySource (not a Source: entriesOf only needs the
// Source methods for the fallback, which it never reaches here).
type entries struct {
	Source
	list   []SourceEntry
	synced bool
}

func (e entries) SourceEntries() ([]SourceEntry, bool) { return slices.Clone(e.list), e.synced }

// TestSourceListFixture: the entries of the fixture, in any order, are
// served exactly as the fixture after the first pass.
func TestSourceListFixture(t *testing.T) {
	fix, err := os.ReadFile(sourcesFixture)
	if err != nil {
		t.Fatal(err)
	}
	var want Sources
	if err := json.Unmarshal(fix, &want); err != nil {
		t.Fatal(err)
	}
	l := NewSourceList(time.Hour, nil) // the first pass is served at once
	srv := httptest.NewServer(l)
	defer srv.Close()

	got := getSources(t, srv.URL+SourcesPath)
	if got.Ready || got.Generation != 0 || got.List == nil || len(got.List) != 0 {
		t.Fatalf("before the first pass: %+v, want not ready, generation 0, no sources", got)
	}
	rev := slices.Clone(want.List)
	slices.Reverse(rev)
	list, ok := entriesOf(entries{list: rev, synced: true})
	l.pass(time.Now(), list, ok)
	if got := getSources(t, srv.URL+SourcesPath); !reflect.DeepEqual(got, want) {
		t.Errorf("served %+v\nwant %+v", got, want)
	}
}

// TestEntriesOf: a source that is no EntrySource gives the key without its
// namespace, the URL and the pod; entries are sorted and never nil; an
// unsynced source is a failed pass.
func TestEntriesOf(t *testing.T) {
	st, err := NewStatic("t", []StaticEntry{
		{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266", PodName: "mat-b-0"},
		{Namespace: "ns", Name: "mat-a", URL: "https://mat-a.example:1266"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, ok := entriesOf(st)
	want := []SourceEntry{{"mat-a", "https://mat-a.example:1266", ""}, {"mat-b", "https://10.0.0.2:1266", "mat-b-0"}}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("static: %+v %v, want %+v", got, ok, want)
	}
	if got, ok := entriesOf(&gatedSource{StaticSource: st}); ok || got != nil {
		t.Errorf("unsynced: %+v %v, want a failed pass", got, ok)
	}
	if got, ok := entriesOf(entries{synced: true}); !ok || got == nil || len(got) != 0 {
		t.Errorf("no entries: %#v %v, want an empty list", got, ok)
	}
	sorted := []SourceEntry{{"a", "https://1", ""}, {"a", "https://2", ""}, {"b", "https://0", ""}}
	if got, _ := entriesOf(entries{list: []SourceEntry{sorted[2], sorted[1], sorted[0]}, synced: true}); !reflect.DeepEqual(got, sorted) {
		t.Errorf("sorted by name, then base_url: %+v", got)
	}
}

// TestSourceListPasses drives the pass rules with explicit times: the
// first pass at once, a change only once a pass at least the debounce
// after it was first seen confirms it, no flap served, generation only
// for (name, base_url) changes, failed passes change nothing, ready
// stays.
func TestSourceListPasses(t *testing.T) {
	const s = time.Second
	a, b, c := ep("mat-a", ""), ep("mat-b", ""), ep("mat-c", "")
	a1, a2 := ep("mat-a", "mat-a-1"), ep("mat-a", "mat-a-2")
	b1, b2 := ep("mat-b", "mat-b-1"), ep("mat-b", "mat-b-2")
	a9 := a
	a9.BaseURL = "https://mat-a.example:1266"
	type step struct {
		at     time.Duration // since the start
		failed bool
		list   []SourceEntry // seen by the pass
		gen    uint64        // served after it
		served []SourceEntry
	}
	for _, tc := range []struct {
		name     string
		debounce time.Duration
		steps    []step
	}{
		{"first pass at once after failed ones", 5 * s, []step{
			{at: 0, failed: true, gen: 0, served: []SourceEntry{}},
			{at: 1 * s, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}}}},
		{"an empty first pass is ready with generation 0", 5 * s, []step{
			{at: 0, list: []SourceEntry{}, gen: 0, served: []SourceEntry{}},
			{at: 1 * s, list: []SourceEntry{a}, gen: 0, served: []SourceEntry{}},
			{at: 6 * s, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}}}},
		{"a change is served once a pass a debounce later confirms it", 5 * s, []step{
			{at: 0, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 1 * s, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 5900 * time.Millisecond, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 6 * s, list: []SourceEntry{a, b}, gen: 2, served: []SourceEntry{a, b}},
			{at: 7 * s, list: []SourceEntry{a, b}, gen: 2, served: []SourceEntry{a, b}}}},
		{"a flap is never served; seen again it starts over", 5 * s, []step{
			{at: 0, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 1 * s, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 2 * s, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 6500 * time.Millisecond, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 11400 * time.Millisecond, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 11500 * time.Millisecond, list: []SourceEntry{a, b}, gen: 2, served: []SourceEntry{a, b}}}},
		{"a Service deleted and re-created within the debounce", 5 * s, []step{
			{at: 0, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a, b}},
			{at: 1 * s, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a, b}},
			{at: 1500 * time.Millisecond, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a, b}},
			{at: 10 * s, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a, b}}}},
		{"another set restarts the clock", 5 * s, []step{
			{at: 0, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 1 * s, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 4 * s, list: []SourceEntry{a, c}, gen: 1, served: []SourceEntry{a}},
			{at: 6 * s, list: []SourceEntry{a, c}, gen: 1, served: []SourceEntry{a}},
			{at: 9 * s, list: []SourceEntry{a, c}, gen: 2, served: []SourceEntry{a, c}}}},
		{"a changed base_url is a set change", 5 * s, []step{
			{at: 0, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 1 * s, list: []SourceEntry{a9}, gen: 1, served: []SourceEntry{a}},
			{at: 6 * s, list: []SourceEntry{a9}, gen: 2, served: []SourceEntry{a9}}}},
		{"a pod change in place is confirmed and served under the same generation", 5 * s, []step{
			{at: 0, list: []SourceEntry{a1}, gen: 1, served: []SourceEntry{a1}},
			{at: 1 * s, list: []SourceEntry{a2}, gen: 1, served: []SourceEntry{a1}},
			{at: 6 * s, list: []SourceEntry{a2}, gen: 1, served: []SourceEntry{a2}}}},
		{"a pod flap is never served", 5 * s, []step{
			{at: 0, list: []SourceEntry{a1}, gen: 1, served: []SourceEntry{a1}},
			{at: 1 * s, list: []SourceEntry{a2}, gen: 1, served: []SourceEntry{a1}},
			{at: 2 * s, list: []SourceEntry{a1}, gen: 1, served: []SourceEntry{a1}},
			{at: 5 * s, list: []SourceEntry{a2}, gen: 1, served: []SourceEntry{a1}},
			{at: 6 * s, list: []SourceEntry{a2}, gen: 1, served: []SourceEntry{a1}},
			{at: 10 * s, list: []SourceEntry{a2}, gen: 1, served: []SourceEntry{a2}}}},
		{"new pods of a pending set change keep its clock", 5 * s, []step{
			{at: 0, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 1 * s, list: []SourceEntry{a, b1}, gen: 1, served: []SourceEntry{a}},
			{at: 3 * s, list: []SourceEntry{a, b2}, gen: 1, served: []SourceEntry{a}},
			{at: 6 * s, list: []SourceEntry{a, b2}, gen: 2, served: []SourceEntry{a, b2}}}},
		{"failed passes keep the set, the ready flag and a pending change", 5 * s, []step{
			{at: 0, list: []SourceEntry{a}, gen: 1, served: []SourceEntry{a}},
			{at: 1 * s, failed: true, gen: 1, served: []SourceEntry{a}},
			{at: 2 * s, list: []SourceEntry{a, b}, gen: 1, served: []SourceEntry{a}},
			{at: 4 * s, failed: true, gen: 1, served: []SourceEntry{a}},
			{at: 7 * s, list: []SourceEntry{a, b}, gen: 2, served: []SourceEntry{a, b}},
			{at: 8 * s, failed: true, gen: 2, served: []SourceEntry{a, b}}}},
		{"no debounce: every pass at once", 0, []step{
			{at: 0, list: []SourceEntry{a1}, gen: 1, served: []SourceEntry{a1}},
			{at: 1 * time.Millisecond, list: []SourceEntry{a1, b}, gen: 2, served: []SourceEntry{a1, b}},
			{at: 2 * time.Millisecond, list: []SourceEntry{a2, b}, gen: 2, served: []SourceEntry{a2, b}},
			{at: 3 * time.Millisecond, list: []SourceEntry{}, gen: 3, served: []SourceEntry{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewSourceList(tc.debounce, nil)
			t0 := time.Unix(1_000_000, 0)
			ready := false
			for i, st := range tc.steps {
				l.pass(t0.Add(st.at), st.list, !st.failed)
				ready = ready || !st.failed
				got := l.Get()
				if got.Ready != ready || got.Generation != st.gen || !reflect.DeepEqual(got.List, st.served) {
					t.Fatalf("step %d (at %s): served %+v, want ready=%v generation %d %+v", i, st.at, got, ready, st.gen, st.served)
				}
			}
		})
	}
}

// TestSourcesHTTP: the paths and methods of the sources API on a real
// listener, which stops when its context ends.
func TestSourcesHTTP(t *testing.T) {
	l := NewSourceList(0, nil)
	l.pass(time.Now(), []SourceEntry{ep("mat-a", "")}, true)
	ctx, cancel := context.WithCancel(context.Background())
	addr, served, err := ServeSources(ctx, "127.0.0.1:0", l, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr.String()
	for _, tc := range []struct {
		method, path string
		code         int
		ctype, body  string // body "" for any
	}{
		{"GET", SourcesPath, 200, "application/json", ""},
		{"HEAD", SourcesPath, 200, "application/json", ""},
		{"GET", SourcesHealthPath, 200, "text/plain; charset=utf-8", "ok\n"},
		{"HEAD", SourcesHealthPath, 200, "text/plain; charset=utf-8", ""},
		{"POST", SourcesPath, 405, "", ""},
		{"PUT", SourcesPath, 405, "", ""},
		{"DELETE", SourcesHealthPath, 405, "", ""},
		{"GET", "/v1/other", 404, "", ""},
		{"GET", "/", 404, "", ""},
		{"GET", SourcesPath + "/", 404, "", ""},
		{"POST", "/v1/other", 404, "", ""},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
		if tc.ctype != "" && resp.Header.Get("Content-Type") != tc.ctype {
			t.Errorf("%s %s: Content-Type %q, want %q", tc.method, tc.path, resp.Header.Get("Content-Type"), tc.ctype)
		}
		if tc.code == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q", tc.method, tc.path, resp.Header.Get("Allow"))
		}
		if tc.method == "HEAD" && len(body) != 0 {
			t.Errorf("HEAD %s: a body %q", tc.path, body)
		}
		if tc.body != "" && string(body) != tc.body {
			t.Errorf("%s %s: body %q, want %q", tc.method, tc.path, body, tc.body)
		}
		if tc.method == "GET" && tc.path == SourcesPath {
			checkShape(t, body)
		}
	}
	cancel()
	<-served
	if _, err := http.Get(base + SourcesHealthPath); err == nil {
		t.Error("still served after the context ended")
	}
}

// TestPassInterval: the cadence of Run's passes.
func TestPassInterval(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{
		0: time.Second, 5 * time.Second: time.Second, 2 * time.Second: 400 * time.Millisecond,
		50 * time.Millisecond: 20 * time.Millisecond, time.Minute: time.Second,
	} {
		if got := NewSourceList(d, nil).PassInterval(); got != want {
			t.Errorf("debounce %s: pass interval %s, want %s", d, got, want)
		}
	}
}

// TestSharedSource: one underlying source, notifications to every
// subscriber until its context ends; Run before Start and a second Start
// are errors.
func TestSharedSource(t *testing.T) {
	st, err := NewStatic("t", []StaticEntry{{Namespace: "ns", Name: "mat-a", URL: "https://10.0.0.1:1266"}})
	if err != nil {
		t.Fatal(err)
	}
	sh := Share(st)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sh.Run(ctx, func() {}); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Run before Start: %v, want ErrNotStarted", err)
	}
	if err := sh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(ctx); err == nil {
		t.Fatal("a second Start succeeded")
	}
	var n1, n2 atomic.Int32
	ctx1, cancel1 := context.WithCancel(ctx)
	if err := sh.Run(ctx1, func() { n1.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := sh.Run(ctx, func() { n2.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := st.Set([]StaticEntry{{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both notified", func() bool { return n1.Load() == 1 && n2.Load() == 1 })
	cancel1()
	eventually(t, "the first unsubscribed", func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return len(sh.subs) == 1
	})
	if err := st.Set([]StaticEntry{{Namespace: "ns", Name: "mat-c", URL: "https://10.0.0.3:1266"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second notified again", func() bool { return n2.Load() == 2 })
	if n1.Load() != 1 {
		t.Errorf("an unsubscribed reader was notified: %d", n1.Load())
	}
	if insts, ok := sh.Instances(); !ok || len(insts) != 1 || insts[0].Key != "ns.mat-c" || sh.Scope() != st.Scope() {
		t.Errorf("Instances %+v %v, scope %q", insts, ok, sh.Scope())
	}
	if got, ok := sh.SourceEntries(); !ok || len(got) != 1 || got[0].Name != "mat-c" {
		t.Errorf("SourceEntries %+v %v", got, ok)
	}
}

// TestSourceListRun: Run's passes over a live source: not ready until it
// synced, then its entries; a change is not served before the debounce
// after it happened, then once, as one generation.
func TestSourceListRun(t *testing.T) {
	st, err := NewStatic("t", []StaticEntry{
		{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266", PodName: "mat-b-0"},
		{Namespace: "ns", Name: "mat-a", URL: "https://10.0.0.1:1266"},
	})
	if err != nil {
		t.Fatal(err)
	}
	src := &gatedSource{StaticSource: st}
	const debounce = 500 * time.Millisecond
	l := NewSourceList(debounce, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, src) }()
	time.Sleep(3 * l.PassInterval())
	if got := l.Get(); got.Ready || len(got.List) != 0 {
		t.Fatalf("before the source synced: %+v", got)
	}
	src.synced.Store(true)
	waitSources(t, l, func(s Sources) bool { return s.Ready })
	want := []SourceEntry{{"mat-a", "https://10.0.0.1:1266", ""}, {"mat-b", "https://10.0.0.2:1266", "mat-b-0"}}
	if got := l.Get(); got.Generation != 1 || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("served %+v, want generation 1 and %+v", got, want)
	}

	setAt := time.Now()
	if err := st.Set([]StaticEntry{
		{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266", PodName: "mat-b-0"},
		{Namespace: "ns", Name: "mat-c", URL: "https://10.0.0.3:1266"},
	}); err != nil {
		t.Fatal(err)
	}
	for {
		got := l.Get()
		if got.Generation != 1 {
			break
		}
		if time.Since(setAt) > 10*time.Second {
			t.Fatalf("change not served: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if el := time.Since(setAt); el < debounce {
		t.Errorf("change served %s after it was made, before the debounce %s", el, debounce)
	}
	want = []SourceEntry{{"mat-b", "https://10.0.0.2:1266", "mat-b-0"}, {"mat-c", "https://10.0.0.3:1266", ""}}
	if got := l.Get(); got.Generation != 2 || !got.Ready || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("served %+v, want generation 2 and %+v", got, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func waitSources(t *testing.T, l *SourceList, cond func(Sources) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(l.Get()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out; sources %+v", l.Get())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gatedSource is a StaticSource that reports itself unsynced until synced
// is set.
type gatedSource struct {
	*StaticSource
	synced atomic.Bool
}

func (g *gatedSource) Instances() ([]events.Instance, bool) {
	insts, _ := g.StaticSource.Instances()
	return insts, g.synced.Load()
}

// TestSourcesAPIBesidePublisher: the sources API and a Publisher share one
// source (as `matbus discovery` runs them): the publisher's instances keep
// their URLs, the API serves the source's entries, and it stays ready
// with its set after the publisher stops (lost the lead).
func TestSourcesAPIBesidePublisher(t *testing.T) {
	b := newBus(t)
	st, err := NewStatic("test", []StaticEntry{{Namespace: "ns", Name: "mat-a", URL: "https://10.0.0.1:1266"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sh := Share(st)
	if err := sh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	l := NewSourceList(100*time.Millisecond, nil)
	passes := make(chan struct{})
	go func() { defer close(passes); _ = l.Run(ctx, sh) }()
	pctx, stopPub := context.WithCancel(ctx)
	published := make(chan struct{})
	go func() {
		defer close(published)
		_ = NewPublisher(b, sh, PublisherConfig{SyncInterval: time.Hour}, nil, nil).Run(pctx)
	}()
	eventually(t, "mat-a published", present(b, "ns.mat-a"))
	waitSources(t, l, func(s Sources) bool { return s.Ready && len(s.List) == 1 })

	if err := st.Set([]StaticEntry{
		{Namespace: "ns", Name: "mat-a", URL: "https://10.0.0.1:1266"},
		{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266"},
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "mat-b published", present(b, "ns.mat-b"))
	rec, _, err := b.LastInstance(ctx, "ns.mat-b")
	if err != nil || rec.Instance.URL != "https://10.0.0.2:1266" {
		t.Fatalf("published mat-b %+v: %v", rec.Instance, err)
	}
	waitSources(t, l, func(s Sources) bool { return s.Generation == 2 })

	stopPub()
	<-published
	if got := l.Get(); !got.Ready || len(got.List) != 2 {
		t.Errorf("after the publisher stopped: %+v, want ready with both", got)
	}
	cancel()
	<-passes
}

// TestGatewayExitsWithoutSources: the test gateway gives up when no
// document is ready with at least one source within its start-up budget
// (so it can fail), and exits on a set change.
func TestGatewayExitsWithoutSources(t *testing.T) {
	l := NewSourceList(0, nil)
	srv := httptest.NewServer(l)
	defer srv.Close()
	g := testenv.StartGateway(t, srv.URL+SourcesPath, 5*time.Millisecond, 10)
	if code, _ := g.WaitExit(t, 10*time.Second); code != testenv.GatewayNoSources {
		t.Errorf("not ready: exit %d, want %d", code, testenv.GatewayNoSources)
	}
	l.pass(time.Now(), []SourceEntry{}, true) // ready, no sources
	g = testenv.StartGateway(t, srv.URL+SourcesPath, 5*time.Millisecond, 10)
	if code, _ := g.WaitExit(t, 10*time.Second); code != testenv.GatewayNoSources {
		t.Errorf("ready without sources: exit %d, want %d", code, testenv.GatewayNoSources)
	}
	l.pass(time.Now(), []SourceEntry{ep("mat-a", "")}, true)
	g = testenv.StartGateway(t, srv.URL+SourcesPath, 5*time.Millisecond, 10)
	g.WaitSet(t, 10*time.Second)
	l.pass(time.Now(), []SourceEntry{ep("mat-a", "pod")}, true) // pods are not compared
	time.Sleep(50 * time.Millisecond)
	g.AssertRunning(t, "after a pod change")
	l.pass(time.Now(), []SourceEntry{ep("mat-a", ""), ep("mat-b", "")}, true)
	if code, _ := g.WaitExit(t, 10*time.Second); code != testenv.GatewaySetChanged {
		t.Errorf("set changed: exit %d, want %d", code, testenv.GatewaySetChanged)
	}
}
