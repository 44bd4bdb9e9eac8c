// Package storetest is the step-table suite that every limiter.Store
// implementation passes: the in-process Memory store and the Redis store run
// the same steps at the same fixed instants and must give the same answers.
package storetest

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// ClockedStore is a store driven at explicit instants.
type ClockedStore interface {
	TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error)
	RefundAt(now time.Time, tokens int) error
	RefundPastAt(now time.Time, tokens int) error
	PauseAt(now time.Time, d time.Duration) error
	DrainAt(now time.Time, debt int) error
	StatusAt(now time.Time) (limiter.State, error)
}

// Factory returns a new, full bucket with the given rate and burst.
type Factory func(t *testing.T, rate float64, burst int) ClockedStore

// Base is the fixed instant every step is measured from.
var Base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type op int

const (
	take op = iota
	refund
	refundPast
	pause
	status
	drain
)

// step is one call at Base+at, and what it must answer.
type step struct {
	at   time.Duration
	op   op
	cost int
	// extra, maxWait and hold for take; n for refund, refundPast and drain; d for
	// pause.
	extra   int
	maxWait time.Duration
	hold    time.Duration
	n       int
	d       time.Duration

	granted   bool
	tokens    int
	wait      time.Duration
	remaining float64
	rate      float64
	paused    time.Duration
	err       error
}

var cases = []struct {
	name  string
	rate  float64
	burst int
	steps []step
}{
	{"new bucket starts full", 10, 5, []step{
		{op: status, remaining: 5, rate: 10},
		{op: take, cost: 1, granted: true, tokens: 1, remaining: 4, rate: 10},
	}},
	{"drain then told the exact wait", 10, 5, []step{
		{op: take, cost: 5, granted: true, tokens: 5, remaining: 0, rate: 10},
		{op: take, cost: 1, wait: 100 * time.Millisecond, remaining: 0, rate: 10},
		{at: 40 * time.Millisecond, op: take, cost: 1, wait: 60 * time.Millisecond, remaining: 0.4, rate: 10},
		{at: 100 * time.Millisecond, op: take, cost: 1, granted: true, tokens: 1, remaining: 0, rate: 10},
	}},
	{"reservations queue in order", 10, 5, []step{
		{op: take, cost: 5, granted: true, tokens: 5, remaining: 0, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 200 * time.Millisecond, remaining: -2, rate: 10},
		{at: 150 * time.Millisecond, op: take, cost: 2, maxWait: time.Second, granted: true, tokens: 2, wait: 250 * time.Millisecond, remaining: -2.5, rate: 10},
	}},
	{"beyond the horizon: told when to come back", 10, 5, []step{
		{op: take, cost: 5, granted: true, tokens: 5, remaining: 0, rate: 10},
		{op: take, cost: 5, maxWait: time.Second, granted: true, tokens: 5, wait: 500 * time.Millisecond, remaining: -5, rate: 10},
		{op: take, cost: 5, maxWait: time.Second, granted: true, tokens: 5, wait: time.Second, remaining: -10, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, wait: 100 * time.Millisecond, remaining: -10, rate: 10},
		{at: 100 * time.Millisecond, op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: time.Second, remaining: -10, rate: 10},
	}},
	{"horizon stretches to the cost's own refill time", 0.5, 3, []step{
		{op: take, cost: 3, granted: true, tokens: 3, remaining: 0, rate: 0.5},
		{op: take, cost: 3, maxWait: time.Second, granted: true, tokens: 3, wait: 6 * time.Second, remaining: -3, rate: 0.5},
	}},
	{"long idle refills to burst and no further", 100, 7, []step{
		{op: take, cost: 7, granted: true, tokens: 7, remaining: 0, rate: 100},
		{at: 30 * time.Millisecond, op: status, remaining: 3, rate: 100},
		{at: 240 * time.Hour, op: status, remaining: 7, rate: 100},
		{at: 240 * time.Hour, op: take, cost: 7, granted: true, tokens: 7, remaining: 0, rate: 100},
		{at: 240 * time.Hour, op: take, cost: 1, wait: 10 * time.Millisecond, remaining: 0, rate: 100},
	}},
	{"cost above burst is an error, not a wait", 10, 5, []step{
		{op: take, cost: 6, maxWait: time.Hour, remaining: 5, rate: 10, err: limiter.ErrCostExceedsBurst},
		{op: status, remaining: 5, rate: 10},
	}},
	{"a multi-token message costs its tokens", 10, 5, []step{
		{op: take, cost: 3, granted: true, tokens: 3, remaining: 2, rate: 10},
		{op: take, cost: 3, wait: 100 * time.Millisecond, remaining: 2, rate: 10},
	}},
	{"extra tokens come only from what is there now", 10, 5, []step{
		{op: take, cost: 1, extra: 2, granted: true, tokens: 3, remaining: 2, rate: 10},
		{op: take, cost: 1, extra: 10, granted: true, tokens: 2, remaining: 0, rate: 10},
		{op: take, cost: 1, extra: 10, maxWait: time.Second, granted: true, tokens: 1, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
	}},
	{"refund returns tokens, capped at burst", 10, 5, []step{
		{op: take, cost: 4, granted: true, tokens: 4, remaining: 1, rate: 10},
		{op: refund, n: 3},
		{op: status, remaining: 4, rate: 10},
		{op: refund, n: 10},
		{op: status, remaining: 5, rate: 10},
	}},
	{"refund cancels a reservation", 10, 1, []step{
		{op: take, cost: 1, granted: true, tokens: 1, remaining: 0, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
		{op: refund, n: 1},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
	}},
	// Tokens past their slot (an unused lease) go back only into a bucket
	// with no reservation queued: the reservation due at +100 ms keeps its
	// instant, and the take after the refund queues behind it, at +200 ms,
	// not beside it. Without a queue they go back up to the burst.
	{"a refund past the slot waits for no queue", 10, 5, []step{
		{op: take, cost: 5, granted: true, tokens: 5, remaining: 0, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
		{op: refundPast, n: 3},
		{op: status, remaining: -1, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 200 * time.Millisecond, remaining: -2, rate: 10},
		{at: 300 * time.Millisecond, op: refundPast, n: 3},
		{at: 300 * time.Millisecond, op: status, remaining: 4, rate: 10},
		{at: 300 * time.Millisecond, op: refundPast, n: 3},
		{at: 300 * time.Millisecond, op: status, remaining: 5, rate: 10},
	}},
	// Tokens past their slot given back behind a queue are dropped, not
	// fitted in behind it up to the burst: the bucket at the queue's end
	// would then hold them plus the refill accrued toward the reservation
	// due there, and the take at +100 ms would go out at +300 ms beside
	// the reservation of 3, 8 tokens at one instant against a burst of 5.
	{"a refund past the slot behind a queue slots no take beside it", 10, 5, []step{
		{op: take, cost: 5, granted: true, tokens: 5, remaining: 0, rate: 10},
		{op: take, cost: 3, maxWait: time.Second, granted: true, tokens: 3, wait: 300 * time.Millisecond, remaining: -3, rate: 10},
		{op: refundPast, n: 5},
		{op: status, remaining: -3, rate: 10},
		{at: 100 * time.Millisecond, op: take, cost: 5, maxWait: time.Second, granted: true, tokens: 5, wait: 700 * time.Millisecond, remaining: -7, rate: 10},
	}},
	{"pause stops granting for every caller, then recovers", 10, 5, []step{
		{op: pause, d: 2 * time.Second},
		{op: status, remaining: 0, rate: 0, paused: 2 * time.Second},
		{at: time.Second, op: take, cost: 1, wait: 1100 * time.Millisecond, remaining: 0, rate: 0},
		{at: time.Second, op: pause, d: 500 * time.Millisecond},
		{at: time.Second, op: status, remaining: 0, rate: 0, paused: time.Second},
		{at: 2100 * time.Millisecond, op: take, cost: 1, granted: true, tokens: 1, remaining: 0, rate: 10},
		{at: 3 * time.Second, op: status, remaining: 5, rate: 10},
	}},
	{"pause keeps reservations already made", 10, 1, []step{
		{op: take, cost: 1, granted: true, tokens: 1, remaining: 0, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
		{op: pause, d: time.Second},
		{op: take, cost: 1, maxWait: 3 * time.Second, granted: true, tokens: 1, wait: 1200 * time.Millisecond, remaining: -2, rate: 0},
	}},
	{"drain empties the bucket and leaves the debt reserved ahead", 10, 5, []step{
		{op: drain, n: 3},
		{op: status, remaining: -3, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, tokens: 1, wait: 400 * time.Millisecond, remaining: -4, rate: 10},
	}},
	{"drains do not add up, and keep a deeper queue", 10, 5, []step{
		{op: drain, n: 3},
		{op: drain, n: 2},
		{op: status, remaining: -3, rate: 10},
		{at: 100 * time.Millisecond, op: drain, n: 3},
		{at: 100 * time.Millisecond, op: status, remaining: -3, rate: 10},
		{at: 100 * time.Millisecond, op: drain, n: 0},
		{at: 100 * time.Millisecond, op: status, remaining: -3, rate: 10},
	}},
	{"drain keeps a pause", 10, 5, []step{
		{op: pause, d: time.Second},
		{op: drain, n: 2},
		{op: status, remaining: -2, rate: 0, paused: time.Second},
	}},
	// A take with a hold (a lease, spent up to the hold after its grant)
	// is charged as of the hold's end: what the bucket would refill past
	// its burst by then is lost, as it would be if the tokens went out
	// then.
	{"a hold charges the take as of its end", 10, 5, []step{
		// Full: 5 + 1 refilled by +100 ms is 1 past the burst.
		{op: take, cost: 2, hold: 100 * time.Millisecond, granted: true, tokens: 2, remaining: 2, rate: 10},
		// 2 + 1 stays within it: nothing lost.
		{op: take, cost: 1, hold: 100 * time.Millisecond, granted: true, tokens: 1, remaining: 1, rate: 10},
		{at: 400 * time.Millisecond, op: status, remaining: 5, rate: 10},
		// Full again, a hold of 3 tokens' refill: 5 - 3 - 3 < 0, not now.
		{at: 400 * time.Millisecond, op: take, cost: 3, hold: 300 * time.Millisecond, wait: 100 * time.Millisecond, remaining: 5, rate: 10},
		{at: 400 * time.Millisecond, op: take, cost: 3, hold: 300 * time.Millisecond, maxWait: time.Second, granted: true, tokens: 3, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
		// Extra tokens come from what is left after the loss.
		{at: 1500 * time.Millisecond, op: take, cost: 1, extra: 10, hold: 100 * time.Millisecond, granted: true, tokens: 4, remaining: 0, rate: 10},
	}},
	{"fractional rate: one token every two seconds", 0.5, 1, []step{
		{op: take, cost: 1, granted: true, tokens: 1, remaining: 0, rate: 0.5},
		{op: take, cost: 1, wait: 2 * time.Second, remaining: 0, rate: 0.5},
		{at: 1500 * time.Millisecond, op: status, remaining: 0.75, rate: 0.5},
		{at: 2 * time.Second, op: take, cost: 1, granted: true, tokens: 1, remaining: 0, rate: 0.5},
	}},
}

// Run runs every step table against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, c.rate, c.burst)
			for i, st := range c.steps {
				now := Base.Add(st.at)
				switch st.op {
				case take:
					res, err := s.TakeAt(now, backend.TakeRequest{Cost: st.cost, Extra: st.extra, MaxWait: st.maxWait, Hold: st.hold})
					if st.err != nil {
						if !errors.Is(err, st.err) {
							t.Fatalf("step %d: err = %v, want %v", i, err, st.err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if res.Granted != st.granted || res.Tokens != st.tokens || res.Wait != st.wait ||
						!near(res.Remaining, st.remaining) || !near(res.Rate, st.rate) || res.Burst != c.burst {
						t.Fatalf("step %d: take(cost %d, extra %d, maxWait %v, hold %v) at +%v = %+v\nwant granted %v tokens %d wait %v remaining %v rate %v burst %d",
							i, st.cost, st.extra, st.maxWait, st.hold, st.at, res, st.granted, st.tokens, st.wait, st.remaining, st.rate, c.burst)
					}
				case refund:
					if err := s.RefundAt(now, st.n); err != nil {
						t.Fatalf("step %d: refund: %v", i, err)
					}
				case refundPast:
					if err := s.RefundPastAt(now, st.n); err != nil {
						t.Fatalf("step %d: refund past: %v", i, err)
					}
				case pause:
					if err := s.PauseAt(now, st.d); err != nil {
						t.Fatalf("step %d: pause: %v", i, err)
					}
				case drain:
					if err := s.DrainAt(now, st.n); err != nil {
						t.Fatalf("step %d: drain: %v", i, err)
					}
				case status:
					got, err := s.StatusAt(now)
					if err != nil {
						t.Fatalf("step %d: status: %v", i, err)
					}
					if !near(got.Tokens, st.remaining) || !near(got.Rate, st.rate) || got.Burst != c.burst || got.PausedFor != st.paused {
						t.Fatalf("step %d: status at +%v = tokens %v rate %v burst %d paused %v; want %v %v %d %v",
							i, st.at, got.Tokens, got.Rate, got.Burst, got.PausedFor, st.remaining, st.rate, c.burst, st.paused)
					}
				}
			}
		})
	}
}

// near compares token counts to the store's reply resolution of 1/1000.
func near(a, b float64) bool { return math.Abs(a-b) < 0.0015 }
