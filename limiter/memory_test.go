package limiter_test

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// newMemory returns a Memory store (rate, burst), failing the test on an
// error.
func newMemory(t *testing.T, rate float64, burst int) *limiter.Memory {
	t.Helper()
	m, err := limiter.NewMemory(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type clockedMemory struct{ *limiter.Memory }

func (m clockedMemory) RefundAt(now time.Time, n int) error {
	m.Memory.RefundAt(now, n)
	return nil
}

func (m clockedMemory) RefundPastAt(now time.Time, n int) error {
	m.Memory.RefundPastAt(now, n)
	return nil
}

func (m clockedMemory) PauseAt(now time.Time, d time.Duration) error {
	m.Memory.PauseAt(now, d)
	return nil
}

func (m clockedMemory) DrainAt(now time.Time, debt int) error {
	m.Memory.DrainAt(now, debt)
	return nil
}

func (m clockedMemory) StatusAt(now time.Time) (limiter.State, error) {
	return m.Memory.StatusAt(now), nil
}

func TestMemorySteps(t *testing.T) {
	storetest.Run(t, func(t *testing.T, rate float64, burst int) storetest.ClockedStore {
		return clockedMemory{newMemory(t, rate, burst)}
	})
}
