package limiter_test

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

type clockedLayered struct{ *limiter.LayeredMemory }

func (m clockedLayered) StatusAt(now time.Time) (limiter.State, error) {
	return m.LayeredMemory.StatusAt(now), nil
}

func TestLayeredMemorySteps(t *testing.T) {
	storetest.RunLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.LayeredClockedStore {
		shared, err := limiter.NewMemory(rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		m, err := limiter.NewLayeredMemory(shared, layers)
		if err != nil {
			t.Fatal(err)
		}
		return clockedLayered{m}
	})
}
