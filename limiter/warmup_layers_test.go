package limiter_test

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func TestLayeredMemoryWarmupSteps(t *testing.T) {
	storetest.RunWarmupLayers(t, func(t *testing.T, rate float64, burst int, warmup time.Duration, layers []limiter.Layer) storetest.LayeredClockedStore {
		m, err := limiter.NewLayeredMemory(newWarmMemory(t, rate, burst, warmup), layers)
		if err != nil {
			t.Fatal(err)
		}
		return clockedLayered{m}
	})
}

func TestMemoryWarmupRefundSteps(t *testing.T) {
	storetest.RunWarmupRefund(t, func(t *testing.T, rate float64, burst int, warmup time.Duration) storetest.ClockedStore {
		return clockedMemory{newWarmMemory(t, rate, burst, warmup)}
	})
}
