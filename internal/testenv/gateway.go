package testenv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// Exit codes of the MAT protocol gateway that Gateway reports.
const (
	// GatewaySetChanged: the (name, base_url) set differs from the one it
	// started with.
	GatewaySetChanged = 3
	// GatewayNoSources: no document with ready true and at least one
	// source within the start-up budget.
	GatewayNoSources = 1
)

// Gateway polls a sources API (GET /v1/sources) the way the MAT protocol
// gateway does and applies its exit rules: it takes the (name, base_url)
// set of the first document that is ready with at least one source, and
// "exits" with GatewaySetChanged at the first later ready document whose
// set differs (pods and generation are not compared), or with
// GatewayNoSources when it takes no set within startPolls polls (the real
// gateway: 150 polls 2 s apart). Failed requests and documents with ready
// false are skipped, as by a gateway that waits for its discovery sidecar.
// After an exit it stops polling.
type Gateway struct {
	url   string
	every time.Duration

	mu     sync.Mutex
	set    []string // "name base_url", sorted; nil until taken
	code   int      // 0 while running
	reason string
	exitAt time.Time
	polls  int

	stop chan struct{}
	done chan struct{}
}

// StartGateway starts polling url every interval; startPolls bounds the
// start-up (polls before a set is taken). It is stopped by t.Cleanup (or
// Stop).
func StartGateway(t testing.TB, url string, every time.Duration, startPolls int) *Gateway {
	g := RunGateway(url, every, startPolls)
	t.Cleanup(g.Stop)
	return g
}

// RunGateway is StartGateway outside a test: the caller stops it, or waits
// for Done. A program that stands in for the gateway in a pod uses it
// (deploytest/gatewaystandin).
func RunGateway(url string, every time.Duration, startPolls int) *Gateway {
	g := &Gateway{url: url, every: every, stop: make(chan struct{}), done: make(chan struct{})}
	go g.run(startPolls)
	return g
}

// Done is closed when the gateway stopped polling: after an exit (see
// Exit) or Stop.
func (g *Gateway) Done() <-chan struct{} { return g.done }

// gatewayDoc is the part of the document the gateway reads.
type gatewayDoc struct {
	Generation uint64 `json:"generation"`
	Ready      bool   `json:"ready"`
	Sources    []struct {
		Name    string `json:"name"`
		BaseURL string `json:"base_url"`
		Pod     string `json:"pod"`
	} `json:"sources"`
}

func (g *Gateway) run(startPolls int) {
	defer close(g.done)
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(g.every)
	defer tick.Stop()
	for {
		if g.poll(client, startPolls) {
			return
		}
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
	}
}

// poll makes one request; true when the gateway exited.
func (g *Gateway) poll(client *http.Client, startPolls int) bool {
	doc, err := g.get(client)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.polls++
	if err == nil && doc.Ready && (g.set != nil || len(doc.Sources) > 0) {
		set := make([]string, 0, len(doc.Sources))
		for _, s := range doc.Sources {
			set = append(set, s.Name+" "+s.BaseURL)
		}
		slices.Sort(set)
		switch {
		case g.set == nil:
			g.set = set
		case !slices.Equal(set, g.set):
			g.exitLocked(GatewaySetChanged, fmt.Sprintf("source set changed (generation %d): %v, started with %v", doc.Generation, set, g.set))
			return true
		}
	}
	if g.set == nil && g.polls >= startPolls {
		g.exitLocked(GatewayNoSources, fmt.Sprintf("no ready document with sources in %d polls (last error: %v)", g.polls, err))
		return true
	}
	return false
}

func (g *Gateway) exitLocked(code int, reason string) {
	g.code, g.reason, g.exitAt = code, reason, time.Now()
}

func (g *Gateway) get(client *http.Client) (gatewayDoc, error) {
	var doc gatewayDoc
	resp, err := client.Get(g.url)
	if err != nil {
		return doc, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return doc, fmt.Errorf("GET %s: %s", g.url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return doc, fmt.Errorf("GET %s: %w", g.url, err)
	}
	return doc, nil
}

// Set returns the set the gateway took ("name base_url", sorted), nil
// before it took one.
func (g *Gateway) Set() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.set)
}

// Exit returns the exit code (0 while running), why, and when.
func (g *Gateway) Exit() (code int, reason string, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.code, g.reason, g.exitAt
}

// Polls returns how many polls the gateway made.
func (g *Gateway) Polls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.polls
}

// WaitSet waits up to timeout for the gateway to take a set and returns
// it; it fails t if the gateway exits or times out first.
func (g *Gateway) WaitSet(t testing.TB, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if set := g.Set(); set != nil {
			return set
		}
		if code, reason, _ := g.Exit(); code != 0 {
			t.Fatalf("gateway on %s exited %d before taking a set: %s", g.url, code, reason)
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway on %s took no set within %s", g.url, timeout)
		}
		time.Sleep(g.every)
	}
}

// WaitExit waits up to timeout for the gateway to exit and returns its
// code and when it exited; it fails t on a timeout.
func (g *Gateway) WaitExit(t testing.TB, timeout time.Duration) (int, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if code, _, at := g.Exit(); code != 0 {
			return code, at
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway on %s did not exit within %s (set %v)", g.url, timeout, g.Set())
		}
		time.Sleep(g.every)
	}
}

// AssertRunning fails t if the gateway has exited.
func (g *Gateway) AssertRunning(t testing.TB, when string) {
	t.Helper()
	if code, reason, _ := g.Exit(); code != 0 {
		t.Fatalf("%s: gateway on %s exited %d: %s", when, g.url, code, reason)
	}
}

// Stop stops polling and waits for the poller to return.
func (g *Gateway) Stop() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}
