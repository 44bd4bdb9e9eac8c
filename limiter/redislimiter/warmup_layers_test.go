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
		l, err := newWarmStore(t, c, uniqueBucket(t, c), rate, burst, warmup).WithLayers(layers)
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
		return clocked{newWarmStore(t, c, uniqueBucket(t, c), rate, burst, warmup)}
	})
}
