package kafka

import (
	"sync"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/dispatch"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// work is one fetched message on its way to a handler: the message, as
// fetched and as the handler sees it, its partition's state, its sequence
// number in the partition's tracker, and its ordering key (OrderKey), or
// the error that computing the key returned, and its class
// (dispatch.ClassOf of kit.Processor.Class).
type work struct {
	m      kafkago.Message
	msg    consumer.Message
	p      *partState
	seq    uint64
	key    string
	keyErr error
	class  int
	// ahead is the message's dedupe claim made as it was fetched
	// (kit.Processor.ClaimAhead), or nil.
	ahead *kit.Ahead
}

// laneID names the messages that must be handled in order: a partition
// (of the topic or of the delay topic), or a key within a partition.
type laneID struct {
	topic     string
	partition int
	key       string
}

// scheduler hands fetched messages to handler goroutines in the order the
// Ordering demands and their classes allow (dispatch.Queue). Messages of
// one lane (a partition, or a key of a partition) run one at a time in the
// order they were enqueued; lanes take turns, one message each, within a
// class, so a busy lane does not starve the others; a lane or lone message
// (OrderNone) whose next message has a higher class goes first, and the
// lower classes leave the reserve of the rule free for the higher ones.
// Up to maxWorkers goroutines run messages; one is started when there is
// work that may start and no idle worker, and it stays, idle between
// messages, until stop, so that a busy consumer does not start a goroutine
// per message.
//
// A scheduler is safe for concurrent use.
type scheduler struct {
	ordering   consumer.Ordering
	maxWorkers int
	// newWorker returns the function a new worker goroutine runs each
	// message with, which may keep per-worker state, and the function
	// the goroutine calls when it ends.
	newWorker func() (run func(work), done func())

	mu      sync.Mutex
	cond    *sync.Cond // signalled when work may start, or at stop
	queue   *dispatch.Queue[laneID, work]
	workers int // goroutines started
	idle    int // of which waiting on cond and not yet signalled
	stopped bool
	wg      sync.WaitGroup
}

// newScheduler returns a scheduler of up to maxWorkers workers. With
// classes, messages start by their class (work.class) and each class
// leaves the rule's reserve of workers free for the classes above it.
func newScheduler(o consumer.Ordering, maxWorkers int, classes bool, newWorker func() (func(work), func())) *scheduler {
	s := &scheduler{ordering: o, maxWorkers: maxWorkers, newWorker: newWorker,
		queue: dispatch.NewQueue[laneID, work](dispatch.NewRule(maxWorkers, classes))}
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
	id := laneID{topic: w.m.Topic, partition: w.m.Partition}
	if s.ordering == consumer.OrderKey {
		id.key = w.key
	}
	inLane := s.ordering != consumer.OrderNone && w.keyErr == nil
	if s.queue.Push(w, w.class, id, inLane) && s.queue.CanPop() {
		s.wakeWorker()
	}
	return true
}

// wakeWorker gets a worker for work that may start: an idle one, or a new
// one while fewer than maxWorkers run. The caller holds mu.
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

// work runs messages until stop.
func (s *scheduler) work() {
	defer s.wg.Done()
	run, done := s.newWorker()
	defer done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		w, started, ok := s.queue.Pop()
		for !s.stopped && !ok {
			s.idle++ // wakeWorker takes it back when it signals
			s.cond.Wait()
			w, started, ok = s.queue.Pop()
		}
		if s.stopped {
			if ok {
				s.queue.Done(started)
			}
			return
		}
		if s.queue.CanPop() {
			// More may start: the slot this worker's last message freed
			// lets a class start beside the one it took.
			s.wakeWorker()
		}
		s.mu.Unlock()
		run(w)
		s.mu.Lock()
		s.queue.Done(started)
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
	s.queue.Drain(func(w work) { dropped = append(dropped, w) })
	return dropped
}

// wait waits for the workers to end. Call it after stop.
func (s *scheduler) wait() { s.wg.Wait() }
