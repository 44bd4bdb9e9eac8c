package limiter_test

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// newWarmMemory returns a Memory store (rate, burst) with a warm-up of
// warmup, failing the test on an error.
func newWarmMemory(t *testing.T, rate float64, burst int, warmup time.Duration) *limiter.Memory {
	t.Helper()
	m := newMemory(t, rate, burst)
	if err := m.SetWarmup(warmup); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMemoryWarmupSteps(t *testing.T) {
	storetest.RunWarmup(t, func(t *testing.T, rate float64, burst int, warmup time.Duration) storetest.ClockedTaker {
		return newWarmMemory(t, rate, burst, warmup)
	})
}
