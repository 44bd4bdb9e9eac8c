package limiter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// watchedMemory is a Memory store whose announced pushes a test reads.
type watchedMemory struct {
	clockedMemory
	mu     sync.Mutex
	pushes []limiter.Push
}

// watchMemory watches m until the test ends, and returns once the watch
// is in place.
func watchMemory(t *testing.T, m *limiter.Memory) *watchedMemory {
	t.Helper()
	w := &watchedMemory{clockedMemory: clockedMemory{m}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	changed := make(chan struct{}, 1)
	go func() {
		defer close(done)
		m.Watch(ctx, func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}, func(p limiter.Push) {
			w.mu.Lock()
			w.pushes = append(w.pushes, p)
			w.mu.Unlock()
		})
	}()
	// SetRate announces a change to every watcher in place: repeat it,
	// with the same limits, until the watch hears one.
	rate, burst := m.Limits()
	for {
		if err := m.SetRateAt(storetest.Base, rate, burst); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			return w
		case <-time.After(time.Millisecond):
		}
	}
}

// Pushes implements storetest.PriorityStore: Memory announces a take's
// pushes before the take returns.
func (w *watchedMemory) Pushes(*testing.T) []limiter.Push {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pushes
	w.pushes = nil
	return out
}

func (w *watchedMemory) RefundClassAt(now time.Time, tokens int, class limiter.Priority) error {
	w.Memory.RefundClassAt(now, tokens, class)
	return nil
}

func TestMemoryPrioritySteps(t *testing.T) {
	storetest.RunPriority(t, func(t *testing.T, rate float64, burst int) storetest.PriorityStore {
		return watchMemory(t, newMemory(t, rate, burst))
	})
}

func TestLayeredMemoryPrioritySteps(t *testing.T) {
	storetest.RunPriorityLayers(t, newClockedLayered)
}

// A take without watchers announces nothing and allocates nothing for it;
// a rank-normal take without lower reservations is today's take.
func TestMemoryPriorityWithoutWatchers(t *testing.T) {
	m := newMemory(t, 10, 1)
	at := storetest.Base
	for i, p := range []limiter.Priority{limiter.PriorityLow, limiter.PriorityLow, limiter.PriorityHigh} {
		if _, err := m.TakeAt(at, limiter.TakeRequest{Cost: 1, MaxWait: time.Second, Priority: p}); err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
	}
	if st := m.StatusAt(at); st.Pushed[limiter.PriorityLow] != 1 || st.Reserved[limiter.PriorityHigh] != 1 || st.Reserved[limiter.PriorityLow] != 1 {
		t.Fatalf("status = %+v; want low pushed by 1, one token reserved by high and by low", st)
	}
}
