package discovery

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// sourcesFixture is the shape of GET /v1/sources: two instances, the
// second of a multi-pod deployment.
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

// TestSourceListFixture: the instances of the fixture, reported in any
// order, are served exactly as the fixture (byte for byte after decoding).
func TestSourceListFixture(t *testing.T) {
	fix, err := os.ReadFile(sourcesFixture)
	if err != nil {
		t.Fatal(err)
	}
	var want Sources
	if err := json.Unmarshal(fix, &want); err != nil {
		t.Fatal(err)
	}
	l := NewSourceList(time.Hour) // the first report is visible at once
	srv := httptest.NewServer(l)
	defer srv.Close()

	got := getSources(t, srv.URL+SourcesPath)
	if got.Ready || got.Generation != 0 || len(got.List) != 0 {
		t.Fatalf("before the first report: %+v, want not ready, generation 0, no sources", got)
	}
	l.Report([]events.Instance{ // not sorted
		{Key: "mat-system.mat-1-bmc-mock", URL: "https://10.96.0.11:1266", PodName: "mat-1-7d9f8c6b5-x2x4z", Scope: "kube"},
		{Key: "mat-system.mat-0-bmc-mock", URL: "https://10.96.0.10:1266", Scope: "kube"},
	})
	if got := getSources(t, srv.URL+SourcesPath); !reflect.DeepEqual(got, want) {
		t.Errorf("served %+v\nwant %+v", got, want)
	}

	for _, tc := range []struct {
		method, path string
		code         int
	}{{"POST", SourcesPath, http.StatusMethodNotAllowed}, {"GET", "/v1/other", http.StatusNotFound}} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
	}
}

// TestSourceListGeneration: the generation counts changes of the set only;
// a burst of changes within the debounce window is one generation, and an
// unchanged report is none.
func TestSourceListGeneration(t *testing.T) {
	const debounce = 100 * time.Millisecond
	l := NewSourceList(debounce)
	a := events.Instance{Key: "ns.a", URL: "https://a"}
	b := events.Instance{Key: "ns.b", URL: "https://b"}
	c := events.Instance{Key: "ns.c", URL: "https://c"}
	l.Report(nil)
	if g := l.Get(); !g.Ready || g.Generation != 0 || g.List == nil {
		t.Fatalf("empty first report: %+v, want ready, generation 0, an empty list", g)
	}
	l.Report([]events.Instance{a})
	if g := l.Get(); g.Generation != 0 || len(g.List) != 0 {
		t.Fatalf("visible before the debounce window ended: %+v", g)
	}
	l.Report([]events.Instance{a, b})
	l.Report([]events.Instance{b, c})
	waitSources(t, l, func(s Sources) bool { return len(s.List) == 2 })
	if g := l.Get(); g.Generation != 1 || g.List[0].Name != "ns.b" || g.List[1].Name != "ns.c" {
		t.Fatalf("after a burst: %+v, want generation 1 with the last set", g)
	}
	l.Report([]events.Instance{c, b}) // the same set
	time.Sleep(3 * debounce)
	if g := l.Get(); g.Generation != 1 {
		t.Errorf("an unchanged set bumped the generation: %+v", g)
	}
	c.URL = "https://c2" // a changed URL is a change
	l.Report([]events.Instance{b, c})
	waitSources(t, l, func(s Sources) bool { return s.Generation == 2 })
	l.Unready()
	if g := l.Get(); g.Ready || len(g.List) != 2 {
		t.Errorf("after Unready: %+v, want not ready with the last set", g)
	}
	l.Report([]events.Instance{b})
	if g := l.Get(); !g.Ready || g.Generation != 3 || len(g.List) != 1 {
		t.Errorf("first report after Unready: %+v, want it visible at once", g)
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

// TestSourcesAPILive: the sources API of a running Publisher on real
// JetStream, over HTTP: not ready until the source synced, then the
// published instances; a live change shows as one new generation after
// the debounce window; once the publisher stops, not ready.
func TestSourcesAPILive(t *testing.T) {
	b := newBus(t)
	st, err := NewStatic("test", []StaticEntry{
		{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266", PodName: "mat-b-0"},
		{Namespace: "ns", Name: "mat-a", URL: "https://10.0.0.1:1266"},
	})
	if err != nil {
		t.Fatal(err)
	}
	src := &gatedSource{StaticSource: st}
	list := NewSourceList(200 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, served, err := ServeSources(ctx, "127.0.0.1:0", list, nil)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr.String() + SourcesPath

	pctx, stopPub := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = NewPublisher(b, src, PublisherConfig{SyncInterval: time.Hour, Sources: list}, nil, nil).Run(pctx)
	}()
	time.Sleep(300 * time.Millisecond)
	if got := getSources(t, url); got.Ready || len(got.List) != 0 {
		t.Fatalf("before the source synced: %+v", got)
	}
	src.synced.Store(true)
	eventually(t, "ready", func() bool { return getSources(t, url).Ready })
	want := []SourceEntry{{"ns.mat-a", "https://10.0.0.1:1266", ""}, {"ns.mat-b", "https://10.0.0.2:1266", "mat-b-0"}}
	if got := getSources(t, url); got.Generation != 1 || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("served %+v, want generation 1 and %+v", got, want)
	}

	// mat-a gone, mat-c new, two changes at once.
	if err := src.Set([]StaticEntry{
		{Namespace: "ns", Name: "mat-b", URL: "https://10.0.0.2:1266", PodName: "mat-b-0"},
		{Namespace: "ns", Name: "mat-c", URL: "https://10.0.0.3:1266"},
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new set", func() bool { return getSources(t, url).Generation > 1 })
	want = []SourceEntry{{"ns.mat-b", "https://10.0.0.2:1266", "mat-b-0"}, {"ns.mat-c", "https://10.0.0.3:1266", ""}}
	if got := getSources(t, url); got.Generation != 2 || !got.Ready || !reflect.DeepEqual(got.List, want) {
		t.Fatalf("served %+v, want generation 2 and %+v", got, want)
	}
	eventually(t, "mat-a gone in the stream", gone(b, "ns.mat-a"))

	stopPub()
	<-done
	if got := getSources(t, url); got.Ready {
		t.Errorf("after the publisher stopped: %+v, want not ready", got)
	}
	cancel()
	<-served
}
