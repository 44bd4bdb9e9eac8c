package dispatch

// Queue holds the messages waiting to start and hands out the next one by
// the Rule. A message is either alone (it may start beside any other) or
// in a lane (the messages of a partition or of a key), whose messages
// start one at a time in the order they were pushed: a lane waits in the
// queue of the class of its first message, so a message never passes an
// earlier one of its lane. Within a class, lanes and lone messages take
// turns in the order they became ready, one message each, so a busy lane
// does not starve the others.
//
// A Queue is not safe for concurrent use: the backend guards it with its
// own lock. Its zero value is not usable; use NewQueue.
type Queue[L comparable, T any] struct {
	rule  Rule
	ready [NumClasses]fifo[entry[L, T]]
	held  [NumClasses]int
	lanes map[L]*lane[L, T]
	// free keeps up to maxFreeLanes emptied lanes for reuse: a partition's
	// lane empties and comes back all the time.
	free []*lane[L, T]
}

// maxFreeLanes bounds Queue.free.
const maxFreeLanes = 64

// Started is a message that Pop handed out; give it back to Done.
type Started[L comparable, T any] struct {
	class int
	lane  *lane[L, T]
}

type item[T any] struct {
	v     T
	class int
}

type lane[L comparable, T any] struct {
	id      L
	items   fifo[item[T]]
	running bool
}

// entry is an element of a ready queue: a lane or a lone message.
type entry[L comparable, T any] struct {
	lane *lane[L, T]
	it   item[T]
}

// NewQueue returns an empty Queue that starts messages by rule.
func NewQueue[L comparable, T any](rule Rule) *Queue[L, T] {
	return &Queue[L, T]{rule: rule, lanes: make(map[L]*lane[L, T])}
}

// Push queues v of class alone (inLane false) or at the end of lane id.
// It reports whether a message became ready to start: v, or v's lane.
func (q *Queue[L, T]) Push(v T, class int, id L, inLane bool) (ready bool) {
	it := item[T]{v: v, class: class}
	if !inLane {
		q.ready[class].push(entry[L, T]{it: it})
		return true
	}
	l := q.lanes[id]
	if l == nil {
		if n := len(q.free); n > 0 {
			l, q.free = q.free[n-1], q.free[:n-1]
			l.id = id
		} else {
			l = &lane[L, T]{id: id}
		}
		q.lanes[id] = l
	}
	l.items.push(it)
	if l.running || l.items.len() > 1 {
		return false // running, or in a ready queue already
	}
	q.ready[class].push(entry[L, T]{lane: l})
	return true
}

// CanPop reports whether Pop would hand out a message.
func (q *Queue[L, T]) CanPop() bool {
	_, ok := q.rule.Pick(q.waiting(), q.held)
	return ok
}

func (q *Queue[L, T]) waiting() [NumClasses]bool {
	var w [NumClasses]bool
	for c := range w {
		w[c] = q.ready[c].len() > 0
	}
	return w
}

// Pop returns the next message to start and takes a slot for it, or
// false when none may start now (none waits, or the rule holds those
// waiting back until a slot frees). Call Done when it finished.
func (q *Queue[L, T]) Pop() (T, Started[L, T], bool) {
	c, ok := q.rule.Pick(q.waiting(), q.held)
	if !ok {
		var zero T
		return zero, Started[L, T]{}, false
	}
	e := q.ready[c].pop()
	it := e.it
	if e.lane != nil {
		it = e.lane.items.pop()
		e.lane.running = true
	}
	q.held[c]++
	return it.v, Started[L, T]{class: c, lane: e.lane}, true
}

// Done gives back the slot of a message Pop returned. Its lane's next
// message, if any, becomes ready; it reports whether one did.
func (q *Queue[L, T]) Done(s Started[L, T]) (ready bool) {
	q.held[s.class]--
	l := s.lane
	if l == nil {
		return false
	}
	l.running = false
	if l.items.len() == 0 {
		q.release(l)
		return false
	}
	q.ready[l.items.peek().class].push(entry[L, T]{lane: l})
	return true
}

// Drain removes every message that waits to start and calls f for each.
// Messages running stay counted until their Done.
func (q *Queue[L, T]) Drain(f func(T)) {
	for c := range q.ready {
		q.ready[c].each(func(e entry[L, T]) {
			if e.lane == nil {
				f(e.it.v)
			}
		})
		q.ready[c].clear()
	}
	for _, l := range q.lanes {
		l.items.each(func(it item[T]) { f(it.v) })
		l.items.clear()
		if !l.running {
			q.release(l)
		}
	}
}

// release removes the empty lane l, which runs nothing, and keeps it for
// reuse.
func (q *Queue[L, T]) release(l *lane[L, T]) {
	delete(q.lanes, l.id)
	if len(q.free) < maxFreeLanes && cap(l.items.items) <= maxFreeLanes {
		var zero L
		l.id = zero
		q.free = append(q.free, l)
	}
}

// Len returns the number of lanes that have a message running or waiting,
// and the number of messages waiting to start.
func (q *Queue[L, T]) Len() (lanes, waiting int) {
	for c := range q.ready {
		q.ready[c].each(func(e entry[L, T]) {
			if e.lane == nil {
				waiting++
			}
		})
	}
	for _, l := range q.lanes {
		waiting += l.items.len()
	}
	return len(q.lanes), waiting
}

// Held returns the number of messages running, which Pop handed out and
// Done did not take back.
func (q *Queue[L, T]) Held() int {
	n := 0
	for _, h := range q.held {
		n += h
	}
	return n
}

// fifo is a queue that reuses its backing array.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }
func (q *fifo[T]) push(v T) { q.items = append(q.items, v) }
func (q *fifo[T]) peek() T  { return q.items[q.head] }
func (q *fifo[T]) clear()   { clear(q.items); q.items, q.head = q.items[:0], 0 }
func (q *fifo[T]) each(f func(T)) {
	for _, v := range q.items[q.head:] {
		f(v)
	}
}

func (q *fifo[T]) pop() T {
	var zero T
	v := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	switch {
	case q.head == len(q.items):
		q.items, q.head = q.items[:0], 0
	case q.head >= 32 && 2*q.head >= len(q.items):
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return v
}
