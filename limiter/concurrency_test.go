package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func (m clockedLayered) ReleaseSlotsAt(_ time.Time, slots []backend.SlotRelease) error {
	return m.ReleaseSlots(context.Background(), slots)
}

func TestLayeredMemoryConcurrencySteps(t *testing.T) {
	t.Parallel()
	storetest.RunConcurrency(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.SlotClockedStore {
		return clockedLayered{newLayeredMemory(t, rate, burst, layers)}
	})
}
