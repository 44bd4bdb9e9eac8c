package storetest

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// WarmupFactory returns a new bucket with the given rate, burst and
// warm-up, never used yet.
type WarmupFactory func(t *testing.T, rate float64, burst int, warmup time.Duration) ClockedTaker

// ClockedTaker takes at explicit instants.
type ClockedTaker interface {
	TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error)
}

// RunWarmup runs the warm-up step table: 30/s, burst 30, warm-up 60s, so
// rate(t) = 30/√(9 − 8t/60s) and the ramp's tokens ∫rate from its start
// are 30·60s/4·(3 − √(9 − 8t/60s)).
func RunWarmup(t *testing.T, newStore WarmupFactory) {
	s := newStore(t, 30, 30, time.Minute)
	for i, st := range []astep{
		// First use: cold, a third of the burst and a third of the rate.
		{op: take, cost: 1, granted: true, remaining: 9, rate: 10},
		{op: take, cost: 9, granted: true, remaining: 0, rate: 10},
		{op: take, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, rate: 10},
		// −1 + 10.0373 tokens of the ramp's first second.
		{at: time.Second, op: take, cost: 1, maxWait: time.Second, granted: true, remaining: 8.037314, rate: 10.074907},
		// Half-way: capped at the burst; 30/√5.
		{at: 30 * time.Second, op: take, cost: 30, maxWait: 10 * time.Second, granted: true, remaining: 0, rate: 13.416408},
		{at: 31 * time.Second, op: take, cost: 1, granted: true, remaining: 12.507063, rate: 13.598952},
		// The ramp is over at 60s: the full rate.
		{at: 60 * time.Second, op: take, cost: 30, granted: true, remaining: 0, rate: 30},
		// Idle for exactly the warm-up: still warm.
		{at: 120 * time.Second, op: take, cost: 1, granted: true, remaining: 29, rate: 30},
		// Idle for longer than the warm-up: cold again.
		{at: 180*time.Second + time.Microsecond, op: take, cost: 1, granted: true, remaining: 9, rate: 10},
		// A refusal on a cold bucket records nothing: the next take is
		// cold too, from its own instant.
		{at: 300 * time.Second, op: take, cost: 20, remaining: 10, rate: 10, wait: time.Second},
	} {
		res, err := s.TakeAt(Base.Add(st.at), backend.TakeRequest{Cost: st.cost, MaxWait: st.maxWait})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if res.Granted != st.granted || res.Wait != st.wait || !near(res.Remaining, st.remaining) || !near(res.Rate, st.rate) {
			t.Fatalf("step %d: take(%d, maxWait %v) at +%v = %+v\nwant granted %v wait %v remaining %v rate %v",
				i, st.cost, st.maxWait, st.at, res, st.granted, st.wait, st.remaining, st.rate)
		}
	}
}
