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
