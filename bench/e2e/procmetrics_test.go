package main

import (
	"encoding/json"
	"testing"
)

func TestBucketBoundsAboveLargestBucket(t *testing.T) {
	const h = "matbus_worker_sync_job_delay_seconds_bucket"
	s := promSamples{
		h + `{stage="fetch",le="0.05"}`:    90,
		h + `{stage="fetch",le="10"}`:      98,
		h + `{stage="fetch",le="+Inf"}`:    100,
		h + `{stage="received",le="+Inf"}`: 7,
	}
	p99, top, over := bucketBounds(s, h, "fetch", 100)
	if p99 != 10 || top != 10 || !over {
		t.Fatalf("bucketBounds = %v, %v, %v; want 10, 10, true (both above the 10 s bucket)", p99, top, over)
	}
	d := &workerDelta{FetchDelayP99: p99, FetchDelayMax: top, FetchDelayOver: over}
	if _, err := json.Marshal(d); err != nil {
		t.Fatalf("a delay above the largest bucket must encode as JSON: %v", err)
	}
	if got := maxBound(d); got != "over 10000" {
		t.Errorf("maxBound = %q, want %q", got, "over 10000")
	}

	p99, top, over = bucketBounds(s, h, "fetch", 90)
	if p99 != 0.05 || top != 0.05 || over {
		t.Errorf("bucketBounds of 90 observations = %v, %v, %v; want 0.05, 0.05, false", p99, top, over)
	}
}

func TestParseProm(t *testing.T) {
	const text = `# HELP matbus_informer_events_total Events.
# TYPE matbus_informer_events_total counter
matbus_informer_events_total{informer="services",type="added"} 2000
matbus_informer_events_total{type="listed",informer="services"} 3
# TYPE matbus_worker_sync_job_delay_seconds histogram
matbus_worker_sync_job_delay_seconds_bucket{stage="fetch",le="0.05"} 9
matbus_worker_sync_job_delay_seconds_bucket{stage="fetch",le="10"} 10
matbus_worker_sync_job_delay_seconds_bucket{stage="fetch",le="+Inf"} 11
matbus_worker_sync_job_delay_seconds_sum{stage="fetch"} 12.5
matbus_worker_sync_job_delay_seconds_count{stage="fetch"} 11
# TYPE go_goroutines gauge
go_goroutines 42
`
	s, err := parseProm(text, "matbus_")
	if err != nil {
		t.Fatal(err)
	}
	want := promSamples{
		`matbus_informer_events_total{informer="services",type="added"}`:       2000,
		`matbus_informer_events_total{informer="services",type="listed"}`:      3,
		`matbus_worker_sync_job_delay_seconds_bucket{le="0.05",stage="fetch"}`: 9,
		`matbus_worker_sync_job_delay_seconds_bucket{le="10",stage="fetch"}`:   10,
		`matbus_worker_sync_job_delay_seconds_bucket{le="+Inf",stage="fetch"}`: 11,
		`matbus_worker_sync_job_delay_seconds_sum{stage="fetch"}`:              12.5,
		`matbus_worker_sync_job_delay_seconds_count{stage="fetch"}`:            11,
	}
	if len(s) != len(want) {
		t.Errorf("parsed %d series, want %d (go_goroutines left out): %v", len(s), len(want), s)
	}
	for k, v := range want {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
	if got := s.Sum("matbus_informer_events_total", "informer", "services"); got != 2003 {
		t.Errorf("Sum = %v, want 2003", got)
	}
	if _, err := parseProm("matbus_x{informer=\"a\" 1\n", "matbus_"); err == nil {
		t.Error("a broken sample line parsed")
	}
}
