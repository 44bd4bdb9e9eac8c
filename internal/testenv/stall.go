package testenv

import (
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// Stalls measures how late this process's goroutines wake up while a test
// runs: the longest overshoot of a 5 ms sleep, which on a loaded CI machine
// is the longest time everything stood still. Timing bounds of a test may
// be widened by what it measured, and only by that. Start it with
// MeasureStalls; it stops when the test ends.
type Stalls struct {
	max   atomic.Int64 // time.Duration
	total atomic.Int64 // time.Duration: the overshoots above 1 ms, summed
	done  chan struct{}
}

// MeasureStalls starts measuring until t ends.
func MeasureStalls(t testing.TB) *Stalls {
	return measure(t, func(done <-chan struct{}) (time.Duration, bool) {
		start := time.Now()
		select {
		case <-done:
			return 0, false
		case <-time.After(5 * time.Millisecond):
		}
		return time.Since(start) - 5*time.Millisecond, true
	}, nil)
}

// measure records what probe returns, again and again until t ends (probe
// reports false once done is closed), and then calls stop, if not nil.
func measure(t testing.TB, probe func(done <-chan struct{}) (time.Duration, bool), stop func()) *Stalls {
	s := &Stalls{done: make(chan struct{})}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			d, ok := probe(s.done)
			if !ok {
				return
			}
			if d > time.Duration(s.max.Load()) {
				s.max.Store(int64(d))
			}
			if d > time.Millisecond {
				s.total.Add(int64(d))
			}
		}
	}()
	t.Cleanup(func() {
		close(s.done)
		<-stopped
		if stop != nil {
			stop()
		}
	})
	return s
}

// Max returns the longest stall measured so far.
func (s *Stalls) Max() time.Duration { return time.Duration(s.max.Load()) }

// Total returns the stalls measured so far summed: each measure above a
// millisecond (for MeasureStalls, an overshoot of its 5 ms sleep beyond a
// timer's own lateness). A limiter whose callers stood still that long
// may have handed out that much less.
func (s *Stalls) Total() time.Duration { return time.Duration(s.total.Load()) }

// WindowBound returns the most events a limiter at rate may show in any
// window, given bound for a machine that never stalls: a stall longer
// than one event's interval releases the events held up during it
// together, so the bound grows by the events due in the stall.
func WindowBound(bound int, rate float64, stall time.Duration) int {
	if stall <= time.Duration(float64(time.Second)/rate) {
		return bound
	}
	return bound + int(math.Ceil(rate*stall.Seconds()))
}
