package storetest

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// WarmupLayeredFactory returns a new layered store whose shared bucket has
// the given rate, burst and warm-up, never used yet, with the layers.
type WarmupLayeredFactory func(t *testing.T, rate float64, burst int, warmup time.Duration, layers []limiter.Layer) LayeredClockedStore

// RunWarmupLayers runs the warm-up step table of layered takes: the shared
// bucket of RunWarmup (30/s, burst 30, warm-up 60s) under a keyed layer (1/s,
// burst 40). The shared part ramps exactly as a plain take does (the first
// four steps are RunWarmup's), a refund refills along the ramp in progress
// (a plain refill would have filled the bucket), and the layer's wait,
// when it is the longer, charges nothing.
func RunWarmupLayers(t *testing.T, newStore WarmupLayeredFactory) {
	s := newStore(t, 30, 30, time.Minute, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 40}})
	type wstep struct {
		at       time.Duration
		refund   int // refund the take of that step (1-based) instead of taking
		key      string
		cost     int
		maxWait  time.Duration
		granted  bool
		wait     time.Duration
		rem      float64 // the shared bucket's tokens after the step
		rate     float64
		limiting string
	}
	var (
		reqs []backend.LayerRequest
		ress []backend.LayerResult
	)
	for i, st := range []wstep{
		// First use: cold, a third of the burst and a third of the rate.
		{key: "a", cost: 1, granted: true, rem: 9, rate: 10},
		{key: "b", cost: 9, granted: true, rem: 0, rate: 10},
		{key: "c", cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, rem: -1, rate: 10},
		// −1 + 10.0373 tokens of the ramp's first second, as a plain take.
		{at: time.Second, key: "d", cost: 1, maxWait: time.Second, granted: true, rem: 8.037314, rate: 10.074907},
		// The refund at 2s adds the ramp's tokens from 1s to 2s (10.1131)
		// and the cost: 19.150384, where the plain rate would give 30.
		{at: 2 * time.Second, refund: 4, rem: 19.150384},
		{at: 2 * time.Second, key: "e", cost: 1, granted: true, rem: 18.150384, rate: 10.151524},
		// Half-way: capped at the burst; 30/√5.
		{at: 30 * time.Second, key: "f", cost: 30, maxWait: 10 * time.Second, granted: true, rem: 0, rate: 13.416408},
		// 13.507063 tokens of the ramp from 30s to 31s; the layer's key f
		// holds 11 and waits 1s for the 12th: the longer wait, so nothing
		// is charged and the take comes back then.
		{at: 31 * time.Second, key: "f", cost: 12, maxWait: 5 * time.Second, wait: time.Second, rem: 13.507063, rate: 13.598952, limiting: "per-key"},
		// The ramp is over at 60s: the full rate.
		{at: 60 * time.Second, key: "g", cost: 30, granted: true, rem: 0, rate: 30},
		// Idle for longer than the warm-up: cold again.
		{at: 180*time.Second + time.Microsecond, key: "h", cost: 1, granted: true, rem: 9, rate: 10},
	} {
		now := Base.Add(st.at)
		if st.refund > 0 {
			j := st.refund - 1
			if err := s.RefundLayersAt(now, reqs[j], ress[j]); err != nil {
				t.Fatalf("step %d: refund: %v", i, err)
			}
			got, err := s.StatusAt(now)
			if err != nil {
				t.Fatalf("step %d: status: %v", i, err)
			}
			if !near(got.Tokens, st.rem) {
				t.Fatalf("step %d: after the refund of step %d at +%v: tokens %v, want %v", i, st.refund, st.at, got.Tokens, st.rem)
			}
			reqs, ress = append(reqs, backend.LayerRequest{}), append(ress, backend.LayerResult{})
			continue
		}
		req := backend.LayerRequest{Cost: st.cost, MaxWait: st.maxWait, Keys: k(st.key)}
		res, err := s.TakeLayersAt(now, req)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if res.Granted != st.granted || res.Wait != st.wait || !near(res.Remaining, st.rem) || !near(res.Rate, st.rate) || res.Limiting != st.limiting {
			t.Fatalf("step %d: take(%d, key %s, maxWait %v) at +%v = %+v\nwant granted %v wait %v remaining %v rate %v limiting %q",
				i, st.cost, st.key, st.maxWait, st.at, res, st.granted, st.wait, st.rem, st.rate, st.limiting)
		}
		reqs, ress = append(reqs, req), append(ress, res)
	}
}

// WarmupStoreFactory returns a new bucket with the given rate, burst and
// warm-up, never used yet.
type WarmupStoreFactory func(t *testing.T, rate float64, burst int, warmup time.Duration) ClockedStore

// RunWarmupRefund checks that a plain refund refills along a ramp in
// progress, as RunWarmupLayers's layered refund does, and starts none: 30/s,
// burst 30, warm-up 60s.
func RunWarmupRefund(t *testing.T, newStore WarmupStoreFactory) {
	s := newStore(t, 30, 30, time.Minute)
	for i, st := range []struct {
		at     time.Duration
		refund int
		cost   int
		rem    float64
		rate   float64
	}{
		{cost: 11, rem: -1, rate: 10}, // cold: 10 tokens, reserves 1
		// The refund at 1s adds the ramp's 10.0373 tokens of the first
		// second and 1: 10.037314, where the plain rate would give 30.
		{at: time.Second, refund: 1, rem: 10.037314},
		{at: time.Second, cost: 1, rem: 9.037314, rate: 10.074907},
		// Idle for longer than the warm-up: the refund refills at the
		// plain rate and starts no ramp, so the take after it is warm.
		{at: 62 * time.Second, refund: 1, rem: 30},
		{at: 62 * time.Second, cost: 1, rem: 29, rate: 30},
	} {
		now := Base.Add(st.at)
		if st.refund > 0 {
			if err := s.RefundAt(now, st.refund); err != nil {
				t.Fatalf("step %d: refund: %v", i, err)
			}
			got, err := s.StatusAt(now)
			if err != nil {
				t.Fatalf("step %d: status: %v", i, err)
			}
			if !near(got.Tokens, st.rem) {
				t.Fatalf("step %d: after a refund of %d at +%v: tokens %v, want %v", i, st.refund, st.at, got.Tokens, st.rem)
			}
			continue
		}
		res, err := s.TakeAt(now, backend.TakeRequest{Cost: st.cost, MaxWait: time.Second})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !res.Granted || !near(res.Remaining, st.rem) || !near(res.Rate, st.rate) {
			t.Fatalf("step %d: take(%d) at +%v = %+v\nwant granted, remaining %v rate %v", i, st.cost, st.at, res, st.rem, st.rate)
		}
	}
}
