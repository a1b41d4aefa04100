package kuberate

import "time"

// minWindow is a sliding-window minimum of latencies: the least value
// added within window of the newest addition. Time with no additions
// does not age it (a quiet API server keeps the baseline it had). It keeps
// a monotonic queue, so each addition costs O(1) amortized and the memory
// is bounded by the additions in one window.
type minWindow struct {
	window  time.Duration
	entries []minEntry // times ascending, values strictly ascending
}

type minEntry struct {
	at time.Time
	d  time.Duration
}

// add records d, seen at at (not before the previous addition's time).
func (w *minWindow) add(at time.Time, d time.Duration) {
	for len(w.entries) > 0 && w.entries[len(w.entries)-1].d >= d {
		w.entries = w.entries[:len(w.entries)-1]
	}
	w.entries = append(w.entries, minEntry{at, d})
	i := 0
	for i < len(w.entries)-1 && at.Sub(w.entries[i].at) > w.window {
		i++
	}
	w.entries = w.entries[i:]
}

// current is the window's minimum; false when nothing was added.
func (w *minWindow) current() (time.Duration, bool) {
	if len(w.entries) == 0 {
		return 0, false
	}
	return w.entries[0].d, true
}

// min is the window's minimum with d counted as well.
func (w *minWindow) min(d time.Duration) time.Duration {
	if c, ok := w.current(); ok && c < d {
		return c
	}
	return d
}
