package limiter

import (
	"sync"
	"time"
)

// skewMeter estimates where an instant of the store's clock falls on the
// Bucket's, from the shared bucket's answers: each answer carries the
// store's clock when it ran (TakeResult.At) and arrives at some local
// instant; their difference is the clocks' offset plus the time the answer
// took to come back. The least difference seen over the last one to two
// skewWindow is the offset plus the quickest return, so that a reservation
// timed from it wakes at its slot, where timing it from a slow answer's
// arrival would wake it as late as that answer was slow. The windows
// follow a drift of either clock. Safe for concurrent use.
type skewMeter struct {
	mu        sync.Mutex
	start     time.Time     // of the current window
	cur, prev time.Duration // least difference in each window
	have      int           // windows with a sample: 0, 1 or 2
}

const skewWindow = 10 * time.Second

// observe records an answer that ran at store (the store's clock) and
// arrived at local.
func (m *skewMeter) observe(local, store time.Time) {
	if store.IsZero() {
		return
	}
	d := local.Sub(store)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.have == 0:
		m.start, m.cur, m.prev, m.have = local, d, d, 1
		return
	case local.Sub(m.start) >= skewWindow:
		m.prev, m.cur, m.start, m.have = m.cur, d, local, 2
		return
	}
	m.cur = min(m.cur, d)
}

// get returns the estimated offset: a store instant t is local t+skew.
func (m *skewMeter) get() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.have == 0 {
		return 0, false
	}
	return min(m.cur, m.prev), true
}
