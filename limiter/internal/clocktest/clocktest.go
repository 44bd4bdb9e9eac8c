// Package clocktest is a fake backend.Clock: time stands still until the
// test advances it, and timers fire in order as it passes them.
package clocktest

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// Clock is a fake backend.Clock. It is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
	seq    int
	made   int // timers made or reset
	// changed is closed and replaced whenever a timer is added or stopped,
	// for WaitTimers.
	changed chan struct{}
}

// New returns a Clock set at start.
func New(start time.Time) *Clock { return &Clock{now: start, changed: make(chan struct{})} }

type timer struct {
	c    *Clock
	at   time.Time
	seq  int
	ch   chan time.Time
	f    func()
	live bool
}

// Now implements backend.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer implements backend.Clock.
func (c *Clock) NewTimer(d time.Duration) backend.Timer {
	t := &timer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// AfterFunc implements backend.Clock.
func (c *Clock) AfterFunc(d time.Duration, f func()) backend.Timer {
	t := &timer{c: c, f: f}
	t.Reset(d)
	return t
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.live
	t.c.removeLocked(t)
	return was
}

func (t *timer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.live
	c.removeLocked(t)
	t.at, t.live = c.now.Add(d), true
	c.made++
	c.seq++
	t.seq = c.seq
	c.timers = append(c.timers, t)
	c.signalLocked()
	return was
}

func (c *Clock) removeLocked(t *timer) {
	t.live = false
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			c.signalLocked()
			return
		}
	}
}

func (c *Clock) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Advance moves the time forward by d, firing every timer due on the way in
// order, each at its own instant.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool {
			if !c.timers[i].at.Equal(c.timers[j].at) {
				return c.timers[i].at.Before(c.timers[j].at)
			}
			return c.timers[i].seq < c.timers[j].seq
		})
		if len(c.timers) == 0 || c.timers[0].at.After(end) {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		t.live = false
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.signalLocked()
		c.mu.Unlock()
		if t.f != nil {
			go t.f()
		} else {
			select {
			case t.ch <- t.at:
			default:
			}
		}
	}
}

// Next returns the instant of the earliest timer pending, and false when
// none is.
func (c *Clock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	next := c.timers[0].at
	for _, t := range c.timers[1:] {
		if t.at.Before(next) {
			next = t.at
		}
	}
	return next, true
}

// Timers returns the number of timers pending.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Armed returns how many times a timer was made or reset so far.
func (c *Clock) Armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.made
}

// WaitArmed waits until timers were made or reset n times in all, so that a
// test knows goroutines it woke are asleep again. It fails the test after
// 10 s of real time.
func (c *Clock) WaitArmed(t testing.TB, n int) {
	t.Helper()
	c.waitFor(t, n, "timers armed", func() int { return c.made })
}

// WaitTimers waits until at least n timers are pending, so that a test
// advances the clock only once the goroutines it drives are asleep. It
// fails the test after 10 s of real time.
func (c *Clock) WaitTimers(t testing.TB, n int) {
	t.Helper()
	c.waitFor(t, n, "pending timers", func() int { return len(c.timers) })
}

// WaitSleepers waits until at least n goroutines sleep on the clock's
// timers (NewTimer's, not AfterFunc's), so that a test advances the clock
// only once they are asleep, whatever AfterFunc timers arm meanwhile. It
// fails the test after 10 s of real time.
func (c *Clock) WaitSleepers(t testing.TB, n int) {
	t.Helper()
	c.waitFor(t, n, "goroutines asleep on timers", func() int {
		k := 0
		for _, tm := range c.timers {
			if tm.f == nil {
				k++
			}
		}
		return k
	})
}

// waitFor waits until count, called with c.mu held, reaches n, waking
// whenever a timer is added or stopped; it fails t after 10 s of real
// time, naming what it counted.
func (c *Clock) waitFor(t testing.TB, n int, what string, count func() int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		k, ch := count(), c.changed
		c.mu.Unlock()
		if k >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waited 10s for %d %s, have %d", n, what, k)
		}
	}
}
