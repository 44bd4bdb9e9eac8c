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
// Each slot is taken for a source (the Kafka consumer's partitions). A
// source may hold up to a bound of its own (NewSlots), and among the
// waiters of the class the Rule picks, a freed slot goes to the one whose
// source holds the fewest slots, the earliest first among equals: one
// source with a backlog, or whose message is stuck, does not fill the
// window while another, whose messages are handled one at a time, has
// none queued and its handler idles. A freed slot is handed to that one
// waiter; the others sleep on.
//
// It is safe for concurrent use.
type Slots struct {
	rule Rule
	// perSource bounds the slots one source holds; 0 for no bound.
	perSource int

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
	// ready receives once, when the waiter was given a slot (granted).
	ready   chan struct{}
	granted bool
}

// waiterPool keeps the waiters between Acquire calls: a fetcher waits for
// nearly every message while the window is full.
var waiterPool = sync.Pool{New: func() any { return &slotWaiter{ready: make(chan struct{}, 1)} }}

// NewSlots returns the semaphore of rule's slots, of which one source
// holds at most perSource; 0 for no bound but the rule's.
func NewSlots(rule Rule, perSource int) *Slots {
	return &Slots{rule: rule, perSource: perSource}
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
	if s.admits(class, source) {
		s.take(class, source)
		s.mu.Unlock()
		return nil
	}
	w := waiterPool.Get().(*slotWaiter)
	w.source, w.granted = source, false
	s.waiters[class] = append(s.waiters[class], w)
	s.waiting[class]++
	s.mu.Unlock()
	select {
	case <-w.ready:
		waiterPool.Put(w)
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.granted {
		// Given a slot as ctx ended: pass it on.
		<-w.ready
		s.held[class]--
		s.bySource[source]--
	} else {
		i := 0
		for s.waiters[class][i] != w {
			i++
		}
		s.remove(class, i)
	}
	waiterPool.Put(w)
	s.grant() // a lower class may go now
	return ctx.Err()
}

// admits reports whether a message of class from source may take a slot
// now, with the waiters counted: only the class Pick chooses goes, not
// beyond the source's bound. A waiter of its class that may take a slot
// would have had it (grant), so Pick refuses then: no message passes a
// waiter. The caller holds mu.
func (s *Slots) admits(class, source int) bool {
	if !s.below(source) {
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

// below reports whether source holds fewer slots than its bound. The
// caller holds mu.
func (s *Slots) below(source int) bool {
	return s.perSource == 0 || s.bySource[source] < s.perSource
}

// grant hands the slots the rule admits to waiters: of the class Pick
// chooses, the one whose source holds the fewest slots, the earliest
// among equals; a waiter whose source holds its bound waits on. The
// caller holds mu.
func (s *Slots) grant() {
	for {
		c, ok := s.rule.Pick(s.waitingClasses(), s.held)
		if !ok {
			return
		}
		ws := s.waiters[c]
		best := -1
		for i, w := range ws {
			if s.below(w.source) && (best < 0 || s.bySource[w.source] < s.bySource[ws[best].source]) {
				best = i
			}
		}
		w := ws[best]
		s.remove(c, best)
		s.take(c, w.source)
		w.granted = true
		w.ready <- struct{}{}
	}
}

// waitingClasses reports, by class, whether a waiter below its source's
// bound waits. The caller holds mu.
func (s *Slots) waitingClasses() [NumClasses]bool {
	var w [NumClasses]bool
	for c, ws := range s.waiters {
		for _, x := range ws {
			if s.below(x.source) {
				w[c] = true
				break
			}
		}
	}
	return w
}
