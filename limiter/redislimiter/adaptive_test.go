package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func (c clocked) DecreaseAt(now time.Time, a limiter.Adaptive) (float64, bool, error) {
	return c.s.decrease(context.Background(), now.UnixMicro(), a)
}

func TestRedisAdaptiveSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunAdaptive(t, func(t *testing.T, rate float64, burst int) storetest.AdaptiveClockedStore {
		s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst})
		if err != nil {
			t.Fatal(err)
		}
		return clocked{s}
	})
}

// TestAdaptiveSharedAndOverridden: two replicas' stores report the same
// push-back within the merge window and the rate drops once; the fields
// expire when the climb is back at the ceiling; an operator's override
// starts again from its own rate.
func TestAdaptiveSharedAndOverridden(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := uniqueBucket(t, c)
	a, err := New(c, Config{Bucket: name, Rate: 100, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(c, Config{Bucket: name, Rate: 100, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	ad := limiter.Adaptive{MinRate: 5} // 0.7, +1/s per s, 500ms window
	r1, d1, err := a.Decrease(ctx, ad)
	if err != nil {
		t.Fatal(err)
	}
	r2, d2, err := b.Decrease(ctx, ad)
	if err != nil {
		t.Fatal(err)
	}
	if !d1 || d2 || r1 != 70 || r2 < 70 || r2 > 70.5 {
		t.Fatalf("two replicas' reports: (%v %v), (%v %v); want one decrease to 70", r1, d1, r2, d2)
	}
	// The hash lives as long as the climb from 70 back to 100 (30 s) + 1 s.
	ttl := c.PTTL(ctx, a.allKeys[1]).Val()
	if ttl < 29*time.Second || ttl > 31*time.Second {
		t.Errorf("override hash PTTL = %v, want ~31s", ttl)
	}
	st, err := a.Admin().Adaptive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.On || st.Rate < 70 || st.Rate > 71 || st.Ceiling != 100 || st.SinceDecrease < 0 || st.SinceDecrease > 5*time.Second {
		t.Errorf("Adaptive() = %+v", st)
	}
	res, err := b.Take(ctx, backend.TakeRequest{Cost: 1})
	if err != nil || res.Rate < 70 || res.Rate > 71 {
		t.Errorf("take: rate %v (%v), want the adaptive ~70", res.Rate, err)
	}
	if bs, err := a.Admin().Status(ctx); err != nil || bs.Override != nil {
		t.Errorf("Status().Override = %+v (%v): the adaptive fields are no override", bs.Override, err)
	}
	if err := a.Admin().SetOverride(ctx, 50, 0, 0); err != nil {
		t.Fatal(err)
	}
	st, err = a.Admin().Adaptive(ctx)
	if err != nil || st.On || st.Rate != 50 || st.Ceiling != 50 {
		t.Errorf("after SetOverride(50): %+v %v, want the override's rate", st, err)
	}
	// Under a permanent override the adaptive fields keep its (absent) TTL.
	if _, d, err := a.Decrease(ctx, ad); err != nil || !d {
		t.Fatal(d, err)
	}
	if ttl := c.PTTL(ctx, a.allKeys[1]).Val(); ttl != -1 {
		t.Errorf("override PTTL after a decrease = %v, want none (-1)", ttl)
	}
	st, _ = a.Admin().Adaptive(ctx)
	if st.Rate < 35 || st.Rate > 36 {
		t.Errorf("decrease under the override: rate %v, want 35", st.Rate)
	}
}
