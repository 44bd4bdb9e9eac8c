package storetest

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// AdaptiveClockedStore is a store with an adaptive rate (backend.Adapter)
// driven at explicit instants.
type AdaptiveClockedStore interface {
	TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error)
	PauseAt(now time.Time, d time.Duration) error
	DecreaseAt(now time.Time, a limiter.Adaptive) (rate float64, decreased bool, err error)
	StatusAt(now time.Time) (limiter.State, error)
}

// AdaptiveFactory returns a new, full bucket with the given rate and burst.
type AdaptiveFactory func(t *testing.T, rate float64, burst int) AdaptiveClockedStore

const decrease op = 100

// astep is one call at Base+at and what it must answer.
type astep struct {
	at      time.Duration
	op      op
	cost    int
	maxWait time.Duration
	d       time.Duration // pause

	granted   bool
	decreased bool
	wait      time.Duration
	remaining float64 // take, status
	rate      float64 // take, status (0 while paused), decrease (the rate after it)
	paused    time.Duration
}

var adaptiveCases = []struct {
	name  string
	rate  float64
	burst int
	a     limiter.Adaptive
	steps []astep
}{
	{"AIMD: decrease, merge window, linear climb, floor and ceiling", 100, 100,
		limiter.Adaptive{MinRate: 10, Decrease: 0.5, Increase: 10, Interval: time.Second, MergeWindow: 300 * time.Millisecond},
		[]astep{
			{op: status, remaining: 100, rate: 100},
			{op: take, cost: 100, granted: true, remaining: 0, rate: 100},
			{op: decrease, decreased: true, rate: 50},
			// Another replica's report of the same push-back: merged.
			{at: 100 * time.Millisecond, op: decrease, rate: 51},
			// 50 + 10/s·0.1s; refill = 50·0.1 + 10·0.1²/2.
			{at: 100 * time.Millisecond, op: status, remaining: 5.05, rate: 51},
			{at: 299 * time.Millisecond, op: decrease, rate: 52.99},
			// Past the window: a new event. 54·0.5; tokens 50·0.4 + 10·0.4²/2 = 20.8.
			{at: 400 * time.Millisecond, op: decrease, decreased: true, rate: 27},
			{at: 400 * time.Millisecond, op: status, remaining: 20.8, rate: 27},
			// Reservation timed at the adaptive rate: 9.2 tokens at 27/s.
			{at: 400 * time.Millisecond, op: take, cost: 30, maxWait: 2 * time.Second, granted: true, wait: 340741 * time.Microsecond, remaining: -9.2, rate: 27},
			{at: 1400 * time.Millisecond, op: status, remaining: 22.8, rate: 37},
			{at: 1400 * time.Millisecond, op: decrease, decreased: true, rate: 18.5},
			{at: 1500 * time.Millisecond, op: decrease, rate: 19.5},
			{at: 2000 * time.Millisecond, op: decrease, decreased: true, rate: 12.25},
			// 18.25·0.5 = 9.125, floored at MinRate.
			{at: 2600 * time.Millisecond, op: decrease, decreased: true, rate: 10},
			{at: 3600 * time.Millisecond, op: status, remaining: 59.85, rate: 20},
			// The climb stops at the ceiling (10 + 10/s·9s = 100 at +11.6s).
			{at: 20 * time.Second, op: status, remaining: 100, rate: 100},
			{at: 20 * time.Second, op: take, cost: 1, granted: true, remaining: 99, rate: 100},
			{at: 20 * time.Second, op: decrease, decreased: true, rate: 50},
		}},
	{"AIMD under a pause: the climb starts when the pause ends; defaults", 10, 10,
		limiter.Adaptive{MinRate: 1}, // 0.7, +0.1/s per 1s (1% of 10/s), 500ms window
		[]astep{
			{op: take, cost: 10, granted: true, remaining: 0, rate: 10},
			{op: pause, d: 2 * time.Second},
			{op: decrease, decreased: true, rate: 7},
			{at: 400 * time.Millisecond, op: decrease, rate: 7},
			{at: time.Second, op: status, remaining: 0, rate: 0, paused: time.Second},
			// Due 1s after the pause ends plus one token at 7/s.
			{at: time.Second, op: take, cost: 1, maxWait: 5 * time.Second, granted: true, wait: 1142858 * time.Microsecond, remaining: -1, rate: 0},
			// 7 + 0.1; refill 7·1 + 0.1·1²/2.
			{at: 3 * time.Second, op: status, remaining: 6.05, rate: 7.1},
			{at: 3 * time.Second, op: decrease, decreased: true, rate: 4.97},
		}},
}

// RunAdaptive runs the adaptive-rate step tables against stores made by
// newStore.
func RunAdaptive(t *testing.T, newStore AdaptiveFactory) {
	for _, c := range adaptiveCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, c.rate, c.burst)
			for i, st := range c.steps {
				now := Base.Add(st.at)
				switch st.op {
				case take:
					res, err := s.TakeAt(now, backend.TakeRequest{Cost: st.cost, MaxWait: st.maxWait})
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if res.Granted != st.granted || res.Wait != st.wait || !near(res.Remaining, st.remaining) || !near(res.Rate, st.rate) {
						t.Fatalf("step %d: take(%d, maxWait %v) at +%v = %+v\nwant granted %v wait %v remaining %v rate %v",
							i, st.cost, st.maxWait, st.at, res, st.granted, st.wait, st.remaining, st.rate)
					}
				case pause:
					if err := s.PauseAt(now, st.d); err != nil {
						t.Fatalf("step %d: pause: %v", i, err)
					}
				case decrease:
					rate, dec, err := s.DecreaseAt(now, c.a)
					if err != nil {
						t.Fatalf("step %d: decrease: %v", i, err)
					}
					if dec != st.decreased || !near(rate, st.rate) {
						t.Fatalf("step %d: decrease at +%v = %v, decreased %v; want %v, %v", i, st.at, rate, dec, st.rate, st.decreased)
					}
				case status:
					got, err := s.StatusAt(now)
					if err != nil {
						t.Fatalf("step %d: status: %v", i, err)
					}
					if !near(got.Tokens, st.remaining) || !near(got.Rate, st.rate) || got.PausedFor != st.paused {
						t.Fatalf("step %d: status at +%v = tokens %v rate %v paused %v; want %v %v %v",
							i, st.at, got.Tokens, got.Rate, got.PausedFor, st.remaining, st.rate, st.paused)
					}
				}
			}
		})
	}
}
