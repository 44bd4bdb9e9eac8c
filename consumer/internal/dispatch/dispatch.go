// Package dispatch is what the backends share to start the messages they
// hold by class (consumer.Options.Priority): the admission rule (Rule), a
// queue of ordered lanes that hands out the next message to start (Queue),
// and a counting semaphore with the same rule (Slots).
//
// The rule, for n slots and messages of the classes high, normal and low
// (ranks 0, 1, 2): each class leaves Reserve slots free per class above
// it (low may take n-2·Reserve, normal n-Reserve, high all n), so a
// higher-class message finds a slot at once although lower-class messages
// wait for tokens in all the others. When a slot frees, the highest class
// waiting gets it, except that a class with messages waiting and none
// holding a slot gets one first (higher classes first among those), so
// that a lower class is never shut out of the slots: the limiter's
// min_share then governs its share of the tokens. Without classes every
// message has one class, no slot is reserved and messages start in the
// order they were queued.
package dispatch

import (
	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// NumClasses is the number of classes; a message's class is its rank
// (limiter.Priority.Rank): 0 high, 1 normal, 2 low.
const NumClasses = limiter.NumPriorities

// Rule admits messages of NumClasses classes to n slots. It is a plain
// value.
type Rule struct {
	n       int
	reserve int
	floor   int
}

// NewRule returns the rule for n slots. With classes, each class leaves
// Reserve = ⌈n/20⌉ slots per class above it, less where n is too small
// for the lowest class to keep one (none below 3 slots), and each class
// with messages waiting is sure of one slot. Without classes it admits
// any message while fewer than n slots are taken.
func NewRule(n int, classes bool) Rule {
	if !classes {
		return Rule{n: n}
	}
	return Rule{n: n, reserve: min((n+19)/20, (n-1)/(NumClasses-1)), floor: 1}
}

// Reserve returns how many slots each class leaves free per class above
// it.
func (r Rule) Reserve() int { return r.reserve }

// Pick returns the class that gets the next slot: waiting[c] says whether
// class c has a message waiting, held[c] how many slots class c holds.
// It reports false when no waiting message may take a slot now.
func (r Rule) Pick(waiting [NumClasses]bool, held [NumClasses]int) (int, bool) {
	total := 0
	for _, h := range held {
		total += h
	}
	if total >= r.n {
		return 0, false
	}
	for c := range NumClasses {
		if waiting[c] && held[c] < r.floor {
			return c, true
		}
	}
	for c := range NumClasses {
		if waiting[c] && total < r.n-c*r.reserve {
			return c, true
		}
	}
	return 0, false
}

// ClassOf returns the class of p, a limiter.Priority, as Rule and Queue
// count it.
func ClassOf(p limiter.Priority) int { return backend.Rank(p) }
