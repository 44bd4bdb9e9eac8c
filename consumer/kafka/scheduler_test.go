package kafka

import (
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
)

// TestSchedulerWakesAnotherWorker: work enqueued while the only idle
// worker has been signalled but not yet run goes to a new worker, so two
// lanes run at once. Counting the signalled worker as idle ran them one
// after the other: the barrier below never opened.
func TestSchedulerWakesAnotherWorker(t *testing.T) {
	var barrier sync.WaitGroup
	barrier.Add(2)
	opened := make(chan struct{})
	go func() {
		barrier.Wait()
		close(opened)
	}()
	s := newScheduler(consumer.OrderNone, 2, false, func() (func(work), func()) {
		return func(w work) {
			if w.m.Offset == 0 {
				return // the warm-up message
			}
			barrier.Done()
			select {
			case <-opened:
			case <-time.After(5 * time.Second):
			}
		}, func() {}
	})
	msg := func(o int64) work { return work{m: kafkago.Message{Offset: o}} }
	s.enqueue(msg(0))
	waitFor(t, "one idle worker", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.workers == 1 && s.idle == 1
	})
	s.enqueue(msg(1))
	s.enqueue(msg(2))
	select {
	case <-opened:
	case <-time.After(5 * time.Second):
		t.Error("the two messages did not run at once")
	}
	s.stop()
	s.wait()
}

// TestSchedulerLanes: a lane's messages run one at a time in order, lanes
// take turns, and stop returns what did not start.
func TestSchedulerLanes(t *testing.T) {
	var (
		mu      sync.Mutex
		order   []string
		release = make(chan struct{})
	)
	s := newScheduler(consumer.OrderKey, 1, false, func() (func(work), func()) {
		return func(w work) {
			mu.Lock()
			order = append(order, string(w.m.Key)+string(w.m.Value))
			mu.Unlock()
			<-release
		}, func() {}
	})
	enq := func(key, v string) {
		s.enqueue(work{m: kafkago.Message{Key: []byte(key), Value: []byte(v)}, key: key})
	}
	enq("a", "1")
	enq("a", "2")
	enq("b", "1")
	enq("a", "3")
	release <- struct{}{} // a1
	release <- struct{}{} // b1: lanes take turns
	release <- struct{}{} // a2
	waitFor(t, "a3 started", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 4
	})
	enq("c", "1")
	dropped := s.stop()
	close(release)
	s.wait()
	if want := []string{"a1", "b1", "a2", "a3"}; !equalStrings(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if len(dropped) != 1 || string(dropped[0].m.Key) != "c" {
		t.Errorf("stop returned %d messages, want c1", len(dropped))
	}
	if s.enqueue(work{}) {
		t.Error("enqueue after stop accepted a message")
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSchedulerClasses: with classes and 5 workers, low messages on free
// keys start on 3 workers only; a high one enqueued behind them starts at
// once on a fourth, while the lows still run; stop returns the lows that
// waited.
func TestSchedulerClasses(t *testing.T) {
	var (
		mu      sync.Mutex
		running []string
		release = make(chan struct{})
	)
	s := newScheduler(consumer.OrderKey, 5, true, func() (func(work), func()) {
		return func(w work) {
			mu.Lock()
			running = append(running, string(w.m.Key))
			mu.Unlock()
			<-release
		}, func() {}
	})
	enq := func(key string, class int) {
		s.enqueue(work{m: kafkago.Message{Key: []byte(key)}, key: key, class: class})
	}
	for _, k := range []string{"l1", "l2", "l3", "l4", "l5", "l6"} {
		enq(k, 2)
	}
	waitFor(t, "3 lows running", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(running) == 3
	})
	enq("h1", 0)
	waitFor(t, "the high running", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(running) == 4
	})
	mu.Lock()
	if running[3] != "h1" {
		t.Errorf("started %v, want h1 fourth", running)
	}
	mu.Unlock()
	dropped := s.stop()
	close(release)
	s.wait()
	if len(dropped) != 3 {
		t.Errorf("stop returned %d messages, want the 3 lows that waited", len(dropped))
	}
}
