package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func TestRedisWarmupSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunWarmup(t, func(t *testing.T, rate float64, burst int, warmup time.Duration) storetest.ClockedTaker {
		return clocked{newWarmStore(t, c, uniqueBucket(t, c), rate, burst, warmup)}
	})
}

// TestWarmupKeepsTheStateForTheWarmup: with a warm-up the state key lives
// until the bucket has been full for the warm-up, so that a missing key
// still means "idle for longer than the warm-up".
func TestWarmupKeepsTheStateForTheWarmup(t *testing.T) {
	c := newClient(t)
	s := newWarmStore(t, c, uniqueBucket(t, c), 10, 10, time.Minute)
	if _, err := s.Take(context.Background(), backend.TakeRequest{Cost: 1}); err != nil {
		t.Fatal(err)
	}
	// A third of the burst minus 1 left, refilling at ~10/3 per second:
	// ~2s to full, plus the warm-up, plus 1s.
	if ttl := c.PTTL(context.Background(), s.stateKeys[0]).Val(); ttl < 62*time.Second || ttl > 64*time.Second {
		t.Errorf("state PTTL = %v, want ~63s", ttl)
	}
	if _, err := New(c, Config{Bucket: "x", Rate: 10, Warmup: -time.Second}); err == nil {
		t.Error("New accepted a negative Warmup")
	}
}

func TestAdminWarmupStatus(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s := newWarmStore(t, c, uniqueBucket(t, c), 30, 30, time.Minute)
	at := func(d time.Duration) int64 { return storetest.Base.Add(d).UnixMicro() }
	if st, err := s.Admin().warmup(ctx, at(0)); err != nil || !st.Cold || st.Ramping {
		t.Errorf("new bucket: %+v %v, want cold", st, err)
	}
	if _, err := s.take(ctx, at(0), backend.TakeRequest{Cost: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Admin().warmup(ctx, at(15*time.Second))
	if err != nil || !st.Ramping || st.Cold || st.Left != 45*time.Second || st.Period != time.Minute || st.Factor < 0.3779 || st.Factor > 0.3780 {
		t.Errorf("15s into the ramp: %+v %v, want ramping at 1/√7 of the rate, 45s left", st, err)
	}
	if st, err := s.Admin().warmup(ctx, at(30*time.Second)); err != nil || !st.Ramping || st.Left != 30*time.Second {
		t.Errorf("30s into the ramp: %+v %v, want ramping, 30s left", st, err)
	}
	if st, err := s.Admin().warmup(ctx, at(61*time.Second)); err != nil || !st.Cold || st.Ramping {
		t.Errorf("idle for longer than the warm-up: %+v %v, want cold", st, err)
	}
}
