package discovery

import (
	"testing"
	"time"
)

// PollMaxInterval: a given value is taken as it is; the default is
// raised to a longer --poll-interval (no stretch, no usage error for an
// older configuration) and cut to --sync-interval.
func TestPollMaxInterval(t *testing.T) {
	for _, c := range []struct {
		poll, v time.Duration
		given   bool
		sync    time.Duration
		want    time.Duration
	}{
		{time.Second, DefaultPollMaxInterval, false, 30 * time.Second, 1500 * time.Millisecond},
		{2 * time.Second, DefaultPollMaxInterval, false, 30 * time.Second, 2 * time.Second},
		{time.Second, DefaultPollMaxInterval, false, time.Second, time.Second},
		{time.Second, time.Second, true, 30 * time.Second, time.Second},
		{time.Second, 5 * time.Second, true, 30 * time.Second, 5 * time.Second},
	} {
		got, err := PollMaxInterval(c.poll, c.v, c.given, c.sync)
		if err != nil || got != c.want {
			t.Errorf("PollMaxInterval(%v, %v, %v, %v) = %v, %v; want %v", c.poll, c.v, c.given, c.sync, got, err, c.want)
		}
	}
}

// A given value outside [poll, sync] is an error naming both bounds.
func TestPollMaxIntervalOutOfRange(t *testing.T) {
	for _, v := range []time.Duration{500 * time.Millisecond, time.Minute} {
		if _, err := PollMaxInterval(time.Second, v, true, 30*time.Second); err == nil {
			t.Errorf("PollMaxInterval(1s, %v, given, 30s): no error", v)
		}
	}
}
