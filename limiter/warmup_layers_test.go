package limiter_test

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func TestLayeredMemoryWarmupSteps(t *testing.T) {
	storetest.RunWarmupLayers(t, func(t *testing.T, rate float64, burst int, warmup time.Duration, layers []limiter.Layer) storetest.LayeredClockedStore {
		shared, err := limiter.NewMemory(rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		if err := shared.SetWarmup(warmup); err != nil {
			t.Fatal(err)
		}
		m, err := limiter.NewLayeredMemory(shared, layers)
		if err != nil {
			t.Fatal(err)
		}
		return clockedLayered{m}
	})
}

func TestMemoryWarmupRefundSteps(t *testing.T) {
	storetest.RunWarmupRefund(t, func(t *testing.T, rate float64, burst int, warmup time.Duration) storetest.ClockedStore {
		m, err := limiter.NewMemory(rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetWarmup(warmup); err != nil {
			t.Fatal(err)
		}
		return clockedMemory{m}
	})
}
