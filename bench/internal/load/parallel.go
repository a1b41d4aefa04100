package load

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Timed is one bulk operation: how long it took and how many of its
// calls failed. TimedOut is set when the deadline ended it.
type Timed struct {
	Seconds  float64 `json:"seconds"`
	Calls    int     `json:"calls"`
	Failed   int     `json:"failed"`
	TimedOut bool    `json:"timed_out,omitempty"`
}

// InParallel runs call(0..n-1) with at most k calls in flight until all
// returned or ctx ends, and times it. Calls not started when ctx ends
// count as failed.
func InParallel(ctx context.Context, k, n int, call func(ctx context.Context, i int) error) Timed {
	start := time.Now()
	var failed atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(k, n) {
		wg.Add(1)
		go func() { // ends when the indexes run out or ctx ends
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if ctx.Err() != nil || call(ctx, i) != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return Timed{Seconds: time.Since(start).Seconds(), Calls: n, Failed: int(failed.Load()), TimedOut: ctx.Err() != nil}
}
