package limiter

import (
	"slices"
	"sync"
)

// fifoMutex is a mutual exclusion lock that goes to the goroutines waiting
// for it in the order they asked for it, except while its holder lets
// later callers barge (bargeOK). sync.Mutex lets a running goroutine take
// the lock ahead of one parked for it for up to 1 ms, and a caller that
// spends leased tokens in a loop can in that time spend a whole batch
// ahead of a caller that asked before it. Handing the lock over in order
// costs each contended Unlock the time the parked goroutine takes to run;
// where the order decides nothing (the lease holds tokens for every
// caller waiting), bargeOK lets the lock work as sync.Mutex does: Unlock
// frees it and wakes the first waiter, which takes it if no running
// goroutine took it first, and keeps its place otherwise.
//
// A contended Lock parks its goroutine on a channel from a pool; the zero
// value is unlocked and never barges.
type fifoMutex struct {
	// bargeOK, when set, reports whether, as the lock is released with
	// waiting goroutines waiting for it (the woken one included), a
	// running goroutine may take it ahead of them. Unlock calls it while
	// the caller still holds the lock.
	bargeOK func(waiting int) bool

	mu    sync.Mutex // guards the rest, for a few instructions
	held  bool
	woken bool // a waiter was woken to try for the lock, and has not yet
	// barging is bargeOK's answer at the last Unlock with goroutines
	// waiting: while a woken one has not tried yet, a Lock takes the
	// free lock ahead of it only when set.
	barging bool
	waiters []chan bool // true: the lock is handed over; false: try for it
}

// Lock locks m, after the goroutines already waiting for it unless the
// holder lets later callers barge.
func (m *fifoMutex) Lock() {
	m.mu.Lock()
	if !m.held && (!m.woken || m.barging) {
		m.held = true
		m.mu.Unlock()
		return
	}
	ch, _ := handoffs.Get().(chan bool)
	if ch == nil {
		ch = make(chan bool, 1)
	}
	m.waiters = append(m.waiters, ch)
	m.mu.Unlock()
	for {
		if <-ch { // handed over: held stays set
			handoffs.Put(ch)
			return
		}
		// Woken to try: the lock is free unless a running goroutine
		// took it meanwhile; then wait again, first in line.
		m.mu.Lock()
		m.woken = false
		if !m.held {
			m.held = true
			m.mu.Unlock()
			handoffs.Put(ch)
			return
		}
		m.waiters = slices.Insert(m.waiters, 0, ch)
		m.mu.Unlock()
	}
}

// handoffs holds the channels of fifoMutex's waiters, each with room for
// the one send that wakes it.
var handoffs sync.Pool

// Unlock unlocks m: it hands the lock to the first goroutine waiting, or,
// when bargeOK allows, frees it and wakes that goroutine to try for it.
func (m *fifoMutex) Unlock() {
	m.mu.Lock()
	if !m.held {
		m.mu.Unlock()
		panic("limiter: unlock of unlocked fifoMutex")
	}
	waiting := len(m.waiters)
	if m.woken {
		waiting++
	}
	if waiting == 0 {
		m.held = false
		m.mu.Unlock()
		return
	}
	m.barging = m.bargeOK != nil && m.bargeOK(waiting)
	switch {
	case m.woken:
		// The one woken before, first in line, takes it when it runs;
		// others only while barging.
		m.held = false
		m.mu.Unlock()
	case m.barging:
		m.held = false
		m.woken = true
		m.wakeLocked(false)
	default:
		m.wakeLocked(true)
	}
}

// wakeLocked sends handed to the first waiter, after it unlocks m.mu.
func (m *fifoMutex) wakeLocked(handed bool) {
	ch := m.waiters[0]
	m.waiters[0] = nil
	m.waiters = m.waiters[1:]
	if len(m.waiters) == 0 {
		m.waiters = m.waiters[:0:0]
	}
	m.mu.Unlock()
	ch <- handed
}
