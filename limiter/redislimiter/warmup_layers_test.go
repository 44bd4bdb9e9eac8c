package redislimiter

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func TestRedisLayeredWarmupSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunWarmupLayers(t, func(t *testing.T, rate float64, burst int, warmup time.Duration, layers []limiter.Layer) storetest.LayeredClockedStore {
		s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst, Warmup: warmup})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.WithLayers(layers)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteLayerKeys(t, c, l) })
		return clockedLayers{l}
	})
}

func TestRedisWarmupRefundSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunWarmupRefund(t, func(t *testing.T, rate float64, burst int, warmup time.Duration) storetest.ClockedStore {
		s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst, Warmup: warmup})
		if err != nil {
			t.Fatal(err)
		}
		return clocked{s}
	})
}
