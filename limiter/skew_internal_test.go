package limiter

import (
	"testing"
	"time"
)

// TestLateFits: a reservation woken late goes out while its tokens and the
// refill since its slot fit in the burst; else it gives back what the
// bucket could have held.
func TestLateFits(t *testing.T) {
	for _, c := range []struct {
		late   time.Duration
		tokens int
		rate   float64
		burst  int
		fits   bool
		refund int
		why    string
	}{
		{0, 1, 1000, 100, true, 0, "on time"},
		{-time.Millisecond, 1, 1000, 100, true, 0, "early"},
		{100 * time.Millisecond, 1, 1000, 100, true, 0, "1 + 99 refilled (beyond the 1 ms slack) = the burst"}, {time.Millisecond, 1, 10, 1, true, 0, "within the slack"},
		{101*time.Millisecond + time.Microsecond, 1, 1000, 100, false, 0, "1 + 100.001 refilled > the burst: nothing could be held"},
		{time.Second, 1, 1000, 100, false, 0, "a start-up's answer, a second late"},
		{51 * time.Millisecond, 60, 1000, 100, false, 50, "a batch of 60: 50 fit beside 50 refilled"},
		{41 * time.Millisecond, 60, 1000, 100, true, 0, "60 + 40 = the burst"},
		{time.Hour, 5, 0, 10, true, 0, "paused: nothing refills"},
		{150 * time.Millisecond, 1, 10, 2, false, 0, "10/s, burst 2: 1 + 1.5 > 2"},
		{50 * time.Millisecond, 1, 10, 2, true, 0, "10/s, burst 2: 1 + 0.5 ≤ 2"},
	} {
		fits, refund := lateFits(c.late, c.tokens, c.rate, c.burst)
		if fits != c.fits || refund != c.refund {
			t.Errorf("%s: lateFits(%v, %d, %v, %d) = %v, %d; want %v, %d", c.why, c.late, c.tokens, c.rate, c.burst, fits, refund, c.fits, c.refund)
		}
	}
}
