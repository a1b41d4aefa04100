package jobs

import (
	"context"
	"time"
)

// Grace returns the hard context of a shutdown: it carries ctx's values
// and ends grace after ctx ends, or when cancel is called. Jobs run under it (see Run) so that they may finish for up
// to grace once ctx asked them to stop. The goroutine it starts ends when
// cancel is called or hard ends.
func Grace(ctx context.Context, grace time.Duration) (hard context.Context, cancel context.CancelFunc) {
	hard, cancel = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-hard.Done():
			return
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-hard.Done():
		}
	}()
	return hard, cancel
}

// Sleep waits d. It returns false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
