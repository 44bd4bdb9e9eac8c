package limiter

import (
	"context"
	"slices"
	"sync"
)

// A take that would jump further ahead of a lower class's reservations
// than that class's MinShare allows is refused (TakeResult.Floor), with the
// exact wait until the floor lets it through. Every other caller of the
// same class on this replica would be refused alike. So they queue here, in
// order of arrival, behind one head: the head sleeps the wait and asks
// again, and the next in line asks only once the head has been granted (or
// has given up). A surge of a high class then costs this replica about one
// store call per grant, instead of one per waiting caller at each refill.

// floorGate queues the callers of each class that a floor holds back.
type floorGate struct {
	mu    sync.Mutex
	queue [NumPriorities]floorQueue
}

// floorQueue is one class's callers held back by a floor.
type floorQueue struct {
	held    bool            // a head is asking for the class
	waiters []chan struct{} // the callers behind it, in order; closed to hand over
}

// enter returns at once, not as head, when no caller of class c is held
// back by a floor. Else it queues the caller and returns when it is the
// head, which must then call pass once it is granted or gives up; or with
// the error of ctx or of the Bucket's end (done), not as head.
func (g *floorGate) enter(ctx context.Context, done <-chan struct{}, c Priority) (head bool, err error) {
	g.mu.Lock()
	q := &g.queue[c]
	if !q.held {
		g.mu.Unlock()
		return false, nil
	}
	turn := make(chan struct{})
	q.waiters = append(q.waiters, turn)
	g.mu.Unlock()
	select {
	case <-turn:
		return true, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-done:
		err = ErrClosed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(q.waiters, turn); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
	} else { // handed the turn while giving up: hand it on
		g.passLocked(c)
	}
	return false, err
}

// hold makes the caller the head of class c after a floor refused it, and
// reports whether it did: false when another caller holds the class, in
// which case the caller enters the queue.
func (g *floorGate) hold(c Priority) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := &g.queue[c]
	if q.held {
		return false
	}
	q.held = true
	return true
}

// pass ends the head's turn: the next caller in line becomes the head, or
// the class is free.
func (g *floorGate) pass(c Priority) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.passLocked(c)
}

func (g *floorGate) passLocked(c Priority) {
	q := &g.queue[c]
	if len(q.waiters) == 0 {
		q.held = false
		return
	}
	close(q.waiters[0])
	q.waiters = q.waiters[1:]
}
