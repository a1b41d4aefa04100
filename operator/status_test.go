package operator

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// TestWriteStatusText: what is unknown is "-" and named on an unknown:
// line; an instance the sources API does not list says NO; a leader entry
// older than three refreshes is STALE; Services unknown is said in the
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
		LeaderStale: true, Unknown: []string{"Services: no kubeconfig", "sources API: connection refused"}}}
	var b bytes.Buffer
	if err := WriteStatusText(&b, st); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []struct {
		line int
		has  []string
	}{
		{1, []string{"ns.a", "OUT (probe 8s, 6 failed)", "never", "fetch 1m30s ago", "NO"}},
		{2, []string{"ns.b", "https://b:1266"}},
		{4, []string{"2 instances, unknown Services; consumers unknown; discovery leader discovery/p (leading 1h0m0s, written 1m0s ago) STALE"}},
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
	if f := strings.Fields(lines[2]); len(f) != 8 || f[2] != "-" || f[3] != "-" || f[4] != "-" || f[5] != "-" || f[6] != "-" || f[7] != "-" {
		t.Errorf("an instance without state, Services, error or sources answer: %q, want - in every column after the URL", lines[2])
	}
}
