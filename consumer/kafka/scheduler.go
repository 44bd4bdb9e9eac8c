package kafka

import (
	"sync"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
)

// work is one fetched message on its way to a handler: the message, as
// fetched and as the handler sees it, its partition's state, its sequence
// number in the partition's tracker, and its ordering key (OrderKey), or
// the error that computing the key returned.
type work struct {
	m      kafkago.Message
	msg    consumer.Message
	p      *partState
	seq    uint64
	key    string
	keyErr error
}

// fifo is a queue that reuses its backing array.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }
func (q *fifo[T]) push(v T) { q.items = append(q.items, v) }
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

// laneID names the messages that must be handled in order: a partition
// (of the topic or of the delay topic), or a key within a partition.
type laneID struct {
	topic     string
	partition int
	key       string
}

// lane holds the waiting messages of one laneID. It is in the scheduler's
// ready queue exactly when it has messages and none of them is running.
type lane struct {
	id      laneID
	queue   fifo[work]
	running bool
}

// ready is an entry of the ready queue: a lane, or a single message (with
// OrderNone, or a message whose key could not be computed).
type ready struct {
	lane *lane
	w    work
}

// scheduler hands fetched messages to handler goroutines in the order the
// Ordering demands. Messages of one lane run one at a time in the order
// they were enqueued; lanes take turns, one message each, so a busy lane
// does not starve the others. Up to maxWorkers goroutines run messages;
// one is started when there is work and no idle worker, and it stays,
// idle between messages, until stop, so that a busy consumer does not
// start a goroutine per message.
//
// A scheduler is safe for concurrent use.
type scheduler struct {
	ordering   consumer.Ordering
	maxWorkers int
	// newWorker returns the function a new worker goroutine runs each
	// message with; it may keep per-worker state.
	newWorker func() func(work)

	mu      sync.Mutex
	cond    *sync.Cond // signalled when ready work arrives, or at stop
	lanes   map[laneID]*lane
	ready   fifo[ready]
	workers int // goroutines started
	idle    int // of which waiting on cond and not yet signalled
	stopped bool
	wg      sync.WaitGroup
}

func newScheduler(o consumer.Ordering, maxWorkers int, newWorker func() func(work)) *scheduler {
	s := &scheduler{ordering: o, maxWorkers: maxWorkers, newWorker: newWorker, lanes: make(map[laneID]*lane)}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// enqueue queues w. It reports false, and queues nothing, after stop.
func (s *scheduler) enqueue(w work) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	if s.ordering == consumer.OrderNone || w.keyErr != nil {
		s.ready.push(ready{w: w})
	} else {
		id := laneID{topic: w.m.Topic, partition: w.m.Partition}
		if s.ordering == consumer.OrderKey {
			id.key = w.key
		}
		l := s.lanes[id]
		if l == nil {
			l = &lane{id: id}
			s.lanes[id] = l
		}
		l.queue.push(w)
		if l.running || l.queue.len() > 1 {
			return true // it is in the ready queue already, or running
		}
		s.ready.push(ready{lane: l})
	}
	s.wakeWorker()
	return true
}

// wakeWorker gets a worker for newly ready work: an idle one, or a new one
// while fewer than maxWorkers run. The caller holds mu.
func (s *scheduler) wakeWorker() {
	switch {
	case s.idle > 0:
		// The signalled worker is no longer idle from now on: counting it
		// until it runs would let the next enqueue signal the same worker
		// again instead of another, and the work would run one after the
		// other.
		s.idle--
		s.cond.Signal()
	case s.workers < s.maxWorkers:
		s.workers++
		s.wg.Add(1)
		go s.work()
	}
}

// work runs ready messages until stop.
func (s *scheduler) work() {
	defer s.wg.Done()
	run := s.newWorker()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for !s.stopped && s.ready.len() == 0 {
			s.idle++ // wakeWorker takes it back when it signals
			s.cond.Wait()
		}
		if s.stopped {
			return
		}
		r := s.ready.pop()
		w := r.w
		if r.lane != nil {
			w = r.lane.queue.pop()
			r.lane.running = true
		}
		s.mu.Unlock()
		run(w)
		s.mu.Lock()
		if l := r.lane; l != nil {
			l.running = false
			switch {
			case l.queue.len() == 0:
				delete(s.lanes, l.id)
			case !s.stopped:
				s.ready.push(ready{lane: l})
			}
		}
	}
}

// stop makes enqueue refuse messages and workers end after the message
// they run, and returns the messages that were queued and not started.
func (s *scheduler) stop() []work {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.cond.Broadcast()
	var dropped []work
	s.ready.each(func(r ready) {
		if r.lane == nil {
			dropped = append(dropped, r.w)
		}
	})
	s.ready.clear()
	for id, l := range s.lanes {
		l.queue.each(func(w work) { dropped = append(dropped, w) })
		l.queue.clear()
		if !l.running {
			delete(s.lanes, id)
		}
	}
	return dropped
}

// wait waits for the workers to end. Call it after stop.
func (s *scheduler) wait() { s.wg.Wait() }
