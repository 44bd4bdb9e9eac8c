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
// It is safe for concurrent use.
type Slots struct {
	rule Rule

	mu      sync.Mutex
	held    [NumClasses]int
	waiting [NumClasses]int
	// changed is closed, and replaced, when a waiter may now proceed.
	changed chan struct{}
}

// NewSlots returns the semaphore of rule's slots.
func NewSlots(rule Rule) *Slots {
	return &Slots{rule: rule, changed: make(chan struct{})}
}

// Acquire takes a slot for a message of class, blocking until the rule
// admits it or ctx ends (then it returns ctx's error and holds nothing).
func (s *Slots) Acquire(ctx context.Context, class int) error {
	s.mu.Lock()
	if s.admits(class) {
		s.held[class]++
		s.mu.Unlock()
		return nil
	}
	s.waiting[class]++
	for {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			s.waiting[class]--
			s.notify() // a lower class may go now
			s.mu.Unlock()
			return ctx.Err()
		}
		s.mu.Lock()
		if c, ok := s.rule.Pick(s.waitingClasses(), s.held); ok && c == class {
			s.waiting[class]--
			s.held[class]++
			s.notify() // another slot may be free for another class
			s.mu.Unlock()
			return nil
		}
	}
}

// admits reports whether a message of class may take a slot now, with
// the waiters counted: only the class Pick chooses goes. The caller holds
// mu.
func (s *Slots) admits(class int) bool {
	w := s.waitingClasses()
	w[class] = true
	c, ok := s.rule.Pick(w, s.held)
	return ok && c == class
}

// Release gives back a slot of class.
func (s *Slots) Release(class int) {
	s.mu.Lock()
	s.held[class]--
	s.notify()
	s.mu.Unlock()
}

// notify wakes the waiters, if any. The caller holds mu.
func (s *Slots) notify() {
	if s.waiting == [NumClasses]int{} {
		return
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Slots) waitingClasses() [NumClasses]bool {
	var w [NumClasses]bool
	for c, n := range s.waiting {
		w[c] = n > 0
	}
	return w
}
