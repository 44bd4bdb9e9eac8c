package limiter

import "sync"

// fifoMutex is a mutual exclusion lock that goes to the goroutines waiting
// for it in the order they asked for it. sync.Mutex lets a running
// goroutine take the lock ahead of one parked for it for up to 1 ms, and
// a caller that spends leased tokens in a loop can in that time spend a
// whole batch ahead of a caller that asked before it. The lease pool
// serves its callers first come, first served under it. A contended Lock
// parks its goroutine until the lock is handed to it, on a channel from a
// pool; the zero value is unlocked.
type fifoMutex struct {
	mu      sync.Mutex // guards held and waiters, for a few instructions
	held    bool
	waiters []chan struct{}
}

// Lock locks m, after the goroutines already waiting for it.
func (m *fifoMutex) Lock() {
	m.mu.Lock()
	if !m.held {
		m.held = true
		m.mu.Unlock()
		return
	}
	ch, _ := handoffs.Get().(chan struct{})
	if ch == nil {
		ch = make(chan struct{}, 1)
	}
	m.waiters = append(m.waiters, ch)
	m.mu.Unlock()
	<-ch // the lock is handed over: held stays set
	handoffs.Put(ch)
}

// handoffs holds the channels of fifoMutex's waiters, each with room for
// the one send that hands it the lock.
var handoffs sync.Pool

// Unlock unlocks m, handing it to the first goroutine waiting, if any.
func (m *fifoMutex) Unlock() {
	m.mu.Lock()
	if !m.held {
		m.mu.Unlock()
		panic("limiter: unlock of unlocked fifoMutex")
	}
	if len(m.waiters) == 0 {
		m.held = false
		m.mu.Unlock()
		return
	}
	ch := m.waiters[0]
	m.waiters[0] = nil
	m.waiters = m.waiters[1:]
	if len(m.waiters) == 0 {
		m.waiters = m.waiters[:0:0]
	}
	m.mu.Unlock()
	ch <- struct{}{}
}
