package dispatch

import (
	"context"
	"sync"
)

// Slots is a counting semaphore of n slots that admits by the Rule: a
// waiter of a higher class goes first, lower classes leave the reserve
// free, and a class holding none is sure of one. The Kafka consumer
// bounds the messages fetched and not finished with it, so that a
// higher-class message is read while lower-class ones fill the window.
//
// Each slot is taken for a source (the Kafka consumer's partitions), and
// among the waiters of the class the Rule picks, a freed slot goes to the
// one whose source holds the fewest slots, the earliest first among
// equals: one source with a backlog does not fill the window while
// another, whose messages are handled one at a time, has none queued and
// its handler idles. A freed slot is handed to that one waiter; the
// others sleep on.
//
// It is safe for concurrent use.
type Slots struct {
	rule Rule

	mu      sync.Mutex
	held    [NumClasses]int
	waiting [NumClasses]int
	// waiters are the Acquire calls that wait, by class, in the order
	// they came.
	waiters [NumClasses][]*slotWaiter
	// bySource counts the slots each source holds.
	bySource []int
}

// slotWaiter is one Acquire call that waits for a slot.
type slotWaiter struct {
	source int
	// ready is closed when the waiter was given a slot (granted).
	ready   chan struct{}
	granted bool
}

// NewSlots returns the semaphore of rule's slots.
func NewSlots(rule Rule) *Slots {
	return &Slots{rule: rule}
}

// Acquire takes a slot for a message of class from source (a small
// non-negative number, such as the index of a partition), blocking until
// the rule admits it or ctx ends (then it returns ctx's error and holds
// nothing). Release the slot with the same class and source.
func (s *Slots) Acquire(ctx context.Context, class, source int) error {
	s.mu.Lock()
	for source >= len(s.bySource) {
		s.bySource = append(s.bySource, 0)
	}
	if s.admits(class) {
		s.take(class, source)
		s.mu.Unlock()
		return nil
	}
	w := &slotWaiter{source: source, ready: make(chan struct{})}
	s.waiters[class] = append(s.waiters[class], w)
	s.waiting[class]++
	s.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.granted {
		// Given a slot as ctx ended: pass it on.
		s.held[class]--
		s.bySource[source]--
	} else {
		i := 0
		for s.waiters[class][i] != w {
			i++
		}
		s.remove(class, i)
	}
	s.grant() // a lower class may go now
	return ctx.Err()
}

// admits reports whether a message of class may take a slot now, with
// the waiters counted: only the class Pick chooses goes, and not past a
// waiter of its own class. The caller holds mu.
func (s *Slots) admits(class int) bool {
	if s.waiting[class] > 0 {
		return false
	}
	w := s.waitingClasses()
	w[class] = true
	c, ok := s.rule.Pick(w, s.held)
	return ok && c == class
}

// Release gives back a slot that Acquire took for class and source.
func (s *Slots) Release(class, source int) {
	s.mu.Lock()
	s.held[class]--
	s.bySource[source]--
	s.grant()
	s.mu.Unlock()
}

// take counts a slot taken for class and source. The caller holds mu.
func (s *Slots) take(class, source int) {
	s.held[class]++
	s.bySource[source]++
}

// remove takes waiter i of class off the list. The caller holds mu.
func (s *Slots) remove(class, i int) {
	ws := s.waiters[class]
	copy(ws[i:], ws[i+1:])
	ws[len(ws)-1] = nil
	s.waiters[class] = ws[:len(ws)-1]
	s.waiting[class]--
}

// grant hands the slots the rule admits to waiters: of the class Pick
// chooses, the one whose source holds the fewest slots, the earliest
// among equals. The caller holds mu.
func (s *Slots) grant() {
	for {
		c, ok := s.rule.Pick(s.waitingClasses(), s.held)
		if !ok {
			return
		}
		ws := s.waiters[c]
		best := 0
		for i, w := range ws[1:] {
			if s.bySource[w.source] < s.bySource[ws[best].source] {
				best = i + 1
			}
		}
		w := ws[best]
		s.remove(c, best)
		s.take(c, w.source)
		w.granted = true
		close(w.ready)
	}
}

func (s *Slots) waitingClasses() [NumClasses]bool {
	var w [NumClasses]bool
	for c, n := range s.waiting {
		w[c] = n > 0
	}
	return w
}
