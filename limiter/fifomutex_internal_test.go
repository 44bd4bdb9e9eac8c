package limiter

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// parked waits until n goroutines wait for m.
func (m *fifoMutex) parked(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d goroutines parked on the lock", n), func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.waiters) >= n
	})
}

// TestFIFOMutexOrder: goroutines that ask for the lock one after another
// get it in that order.
func TestFIFOMutexOrder(t *testing.T) {
	var m fifoMutex
	m.Lock()
	got := make(chan int, 5)
	for i := range 5 {
		go func() {
			m.Lock()
			got <- i
			m.Unlock()
		}()
		m.parked(t, i+1)
	}
	m.Unlock()
	var order []int
	for range 5 {
		order = append(order, <-got)
	}
	if !slices.Equal(order, []int{0, 1, 2, 3, 4}) {
		t.Errorf("the lock went to %v, want 0 1 2 3 4 (the order they asked)", order)
	}
}

// TestFIFOMutexNoBarging: a goroutine that unlocks and locks again at
// once, as a caller spending leased tokens in a loop does, waits for the
// one already parked for the lock. sync.Mutex lets it take the lock again
// first (for up to 1 ms): a caller of a replica could spend a whole lease
// batch while another that asked before it stayed parked, and then wait
// for the next refill.
func TestFIFOMutexNoBarging(t *testing.T) {
	var m fifoMutex
	m.Lock()
	got := make(chan struct{}, 1)
	go func() {
		m.Lock()
		got <- struct{}{}
		m.Unlock()
	}()
	m.parked(t, 1)
	m.Unlock()
	m.Lock()
	select {
	case <-got:
	default:
		t.Fatal("Lock right after Unlock took the lock ahead of the goroutine parked for it")
	}
	m.Unlock()
}

// TestFIFOMutexUnlockUnlocked: unlocking an unlocked fifoMutex panics, as
// sync.Mutex fails.
func TestFIFOMutexUnlockUnlocked(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Unlock of an unlocked fifoMutex did not panic")
		}
	}()
	var m fifoMutex
	m.Unlock()
}
