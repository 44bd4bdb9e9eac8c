package limiter

import (
	"testing"
	"time"
)

// TestLateFits: a reservation woken late, or a grant whose answer came
// back late, goes out while the spare tokens its grant left, its tokens
// and the refill since its slot fit in the burst; else it gives back what
// the bucket could have held.
func TestLateFits(t *testing.T) {
	for _, c := range []struct {
		late   time.Duration
		tokens int
		spare  float64
		rate   float64
		burst  int
		fits   bool
		refund int
		why    string
	}{
		{0, 1, 0, 1000, 100, true, 0, "on time"},
		{-time.Millisecond, 1, 0, 1000, 100, true, 0, "early"},
		{100 * time.Millisecond, 1, 0, 1000, 100, true, 0, "1 + 99 refilled (beyond the 1 ms slack) = the burst"},
		{time.Millisecond, 1, 0, 10, 1, true, 0, "within the slack"},
		{101*time.Millisecond + time.Microsecond, 1, 0, 1000, 100, false, 0, "1 + 100.001 refilled > the burst: nothing could be held"},
		{time.Second, 1, 0, 1000, 100, false, 0, "a start-up's answer, a second late"},
		{51 * time.Millisecond, 60, 0, 1000, 100, false, 50, "a batch of 60: 50 fit beside 50 refilled"},
		{41 * time.Millisecond, 60, 0, 1000, 100, true, 0, "60 + 40 = the burst"},
		{time.Hour, 5, 0, 0, 10, true, 0, "paused: nothing refills"},
		{150 * time.Millisecond, 1, 0, 10, 2, false, 0, "10/s, burst 2: 1 + 1.5 > 2"},
		{50 * time.Millisecond, 1, 0, 10, 2, true, 0, "10/s, burst 2: 1 + 0.5 ≤ 2"},
		// A grant for now leaves spare tokens in the bucket.
		{3 * time.Millisecond, 1, 99, 1000, 100, false, 0, "a full bucket's grant, 2 ms late beyond the slack: 99 + 1 + 2 > 100"},
		{time.Millisecond, 1, 99, 1000, 100, true, 0, "a full bucket's grant within the slack"},
		{31 * time.Millisecond, 1, 50, 1000, 100, true, 0, "50 spare + 1 + 30 ≤ 100"},
		{51 * time.Millisecond, 10, 50, 1000, 100, false, 0, "50 spare + 10 + 50 > 100, with nothing the bucket could hold"},
		{21 * time.Millisecond, 40, 50, 1000, 100, false, 30, "50 spare + 40 + 20 > 100: 30 fit"},
		{time.Hour, 5, 5, 0, 10, true, 0, "paused, with spare tokens"},
		{time.Second, 1, -3, 10, 20, true, 0, "a reservation's negative remainder counts as none: 1 + 10 ≤ 20"},
	} {
		fits, refund := lateFits(c.late, c.tokens, c.spare, c.rate, c.burst)
		if fits != c.fits || refund != c.refund {
			t.Errorf("%s: lateFits(%v, %d, %v, %v, %d) = %v, %d; want %v, %d", c.why, c.late, c.tokens, c.spare, c.rate, c.burst, fits, refund, c.fits, c.refund)
		}
	}
}

// TestSkewSpread: the skew's estimate is the least (arrival − store) seen,
// and its spread how much later than the store's clock it may place an
// instant: the estimate less the greatest (sending − store). A replica
// whose only answer took 500 ms (sent at 0, run at +250 ms, back at +500
// ms, on the same clock) places the store's instants up to 500 ms late; a
// quick answer later narrows it to 2 ms.
func TestSkewSpread(t *testing.T) {
	var m skewMeter
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	for _, step := range []struct {
		sent, store, arrived int // ms
		skew, spread         time.Duration
	}{
		{0, 250, 500, 250 * time.Millisecond, 500 * time.Millisecond},
		{1000, 1001, 1002, time.Millisecond, 2 * time.Millisecond},
		{2000, 2100, 2300, time.Millisecond, 2 * time.Millisecond}, // a slow one changes nothing
		// 10 s after the first, a new window: the last one's bounds
		// still count.
		{11000, 11050, 11100, time.Millisecond, 2 * time.Millisecond},
		// 10 s later again, the quick answer's window is gone: the
		// least (arrival − store) is 10 ms, the greatest (sending −
		// store) −10 ms.
		{21100, 21110, 21120, 10 * time.Millisecond, 20 * time.Millisecond},
	} {
		m.observeTrip(at(step.sent), at(step.arrived), at(step.store))
		skew, _ := m.get()
		if skew != step.skew || m.spread() != step.spread {
			t.Errorf("after %+v: skew %v, spread %v; want %v, %v", step, skew, m.spread(), step.skew, step.spread)
		}
	}
}
