package testenv

import (
	"testing"
	"time"
)

// Wait polls cond every 50 ms until it holds, failing t after d with
// what and cond's last description of the state.
func Wait(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last state: %s", d, what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
