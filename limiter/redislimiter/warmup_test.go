package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func TestRedisWarmupSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunWarmup(t, func(t *testing.T, rate float64, burst int, warmup time.Duration) storetest.ClockedTaker {
		s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst, Warmup: warmup})
		if err != nil {
			t.Fatal(err)
		}
		return clocked{s}
	})
}

// TestWarmupKeepsTheStateForTheWarmup: with a warm-up the state key lives
// until the bucket has been full for the warm-up, so that a missing key
// still means "idle for longer than the warm-up".
func TestWarmupKeepsTheStateForTheWarmup(t *testing.T) {
	c := newClient(t)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 10, Burst: 10, Warmup: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(context.Background(), limiter.TakeRequest{Cost: 1}); err != nil {
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
