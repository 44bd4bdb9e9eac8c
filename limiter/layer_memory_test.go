package limiter_test

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// newLayeredMemory returns a LayeredMemory of layers on a shared Memory
// (rate, burst), failing the test on an error.
func newLayeredMemory(t *testing.T, rate float64, burst int, layers []limiter.Layer) *limiter.LayeredMemory {
	t.Helper()
	m, err := limiter.NewLayeredMemory(newMemory(t, rate, burst), layers)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type clockedLayered struct{ *limiter.LayeredMemory }

// newClockedLayered is the storetest.LayeredFactory of LayeredMemory.
func newClockedLayered(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.LayeredClockedStore {
	return clockedLayered{newLayeredMemory(t, rate, burst, layers)}
}

func (m clockedLayered) StatusAt(now time.Time) (limiter.State, error) {
	return m.LayeredMemory.StatusAt(now), nil
}

func TestLayeredMemorySteps(t *testing.T) {
	storetest.RunLayers(t, newClockedLayered)
}

func (m clockedLayered) ChargeLayersAt(now time.Time, charges []limiter.LayerCharge) error {
	m.LayeredMemory.ChargeLayersAt(now, charges)
	return nil
}

func TestLayeredMemoryCharge(t *testing.T) {
	storetest.RunChargeLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.ChargeClockedStore {
		return clockedLayered{newLayeredMemory(t, rate, burst, layers)}
	})
}

func TestFairMemorySteps(t *testing.T) {
	storetest.RunFair(t, func(t *testing.T, rate float64, burst int, fair limiter.Fair) storetest.LayeredClockedStore {
		m := newLayeredMemory(t, rate, burst, nil)
		if err := m.SetFair(fair); err != nil {
			t.Fatal(err)
		}
		return clockedLayered{m}
	})
}

func TestLayeredMemoryPolicySteps(t *testing.T) {
	storetest.RunPolicyLayers(t, newClockedLayered)
}
