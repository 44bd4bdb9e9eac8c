package limiter

import (
	"testing"
	"time"
)

// TestRetimeDuringPauseUsesTheAdaptiveRate: a reservation re-timed while
// the bucket is paused is spaced at the adaptive rate, not the configured
// one. (Before BaseRate it was spaced at the configured 100/s, so the
// fleet's waiters went out at the ceiling when the pause ended and hit the
// provider's limit again.)
func TestRetimeDuringPauseUsesTheAdaptiveRate(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := reservation{due: at.Add(time.Second), pos: 3, rate: 30}
	st := State{At: at, PausedFor: time.Second, BaseRate: 30, ConfiguredRate: 100}
	got := r.retime(st)
	if want := at.Add(time.Second + 100*time.Millisecond); !got.due.Equal(want) || got.rate != 0 {
		t.Errorf("retime = due %v rate %v, want due %v (3 tokens at 30/s after the 1s pause) rate 0", got.due.Sub(at), got.rate, want.Sub(at))
	}
}
