package testenv

import (
	"testing"
	"time"
)

// Within pauses pollMin after the first call of a condition and doubles
// the pause up to pollMax: a condition on in-process state (a fake clock's
// timers, a queue) is seen within microseconds, and a slow one (a broker
// round trip, an HTTP probe) costs little while it does not hold.
const (
	pollMin = 50 * time.Microsecond
	pollMax = 20 * time.Millisecond
)

// Eventually waits for the state that what names: it calls cond until it
// returns true, and fails t with "<what>: not within <timeout>" when
// timeout passes first. cond runs in the calling goroutine, so it may call
// t.Fatal itself. It is the one poll-until helper of the repository's
// tests; see Within for how often cond is called.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("%s: not within %v", what, timeout)
	}
}

// Within calls cond until it returns true and reports whether it did
// within timeout: 50 µs after the first call, then twice as long after
// each call up to every 20 ms, and once more at the deadline. It is
// Eventually for a test that reports the failure itself.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := pollMin
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pause, left))
		pause = min(2*pause, pollMax)
	}
	return true
}
