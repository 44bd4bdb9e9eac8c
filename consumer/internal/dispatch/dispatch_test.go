package dispatch

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

const (
	high   = 0
	normal = 1
	low    = 2
)

func TestNewRule(t *testing.T) {
	for _, c := range []struct {
		n, reserve int
	}{{1, 0}, {2, 0}, {3, 1}, {5, 1}, {20, 1}, {21, 2}, {37, 2}, {1032, 52}} {
		if got := NewRule(c.n, true).Reserve(); got != c.reserve {
			t.Errorf("NewRule(%d) reserves %d, want %d", c.n, got, c.reserve)
		}
	}
	if got := NewRule(100, false).Reserve(); got != 0 {
		t.Errorf("without classes, reserves %d", got)
	}
}

// TestRulePick is a step table: who gets the next slot, given the classes
// waiting and the slots each holds.
func TestRulePick(t *testing.T) {
	w := func(cs ...int) (out [NumClasses]bool) {
		for _, c := range cs {
			out[c] = true
		}
		return out
	}
	h := func(high, normal, low int) [NumClasses]int { return [NumClasses]int{high, normal, low} }
	for _, c := range []struct {
		name    string
		rule    Rule
		waiting [NumClasses]bool
		held    [NumClasses]int
		want    int // -1: none
	}{
		{"low below its cap", NewRule(5, true), w(low), h(0, 0, 2), low},
		{"low at its cap: n-2 reserved", NewRule(5, true), w(low), h(0, 0, 3), -1},
		{"normal may take one more", NewRule(5, true), w(low, normal), h(0, 0, 3), normal},
		{"normal at its cap", NewRule(5, true), w(low, normal), h(0, 1, 3), -1},
		{"high takes the last slot", NewRule(5, true), w(low, normal, high), h(0, 1, 3), high},
		{"full", NewRule(5, true), w(low, normal, high), h(1, 1, 3), -1},
		{"high first", NewRule(5, true), w(low, high), h(1, 0, 1), high},
		{"a class holding none goes first", NewRule(5, true), w(low, high), h(4, 0, 0), low},
		{"then high again", NewRule(5, true), w(low, high), h(3, 0, 1), high},
		{"floors by class", NewRule(5, true), w(low, normal, high), h(0, 0, 0), high},
		{"normal's floor before low's", NewRule(5, true), w(low, normal, high), h(4, 0, 0), normal},
		{"one slot: high first", NewRule(1, true), w(low, high), h(0, 0, 0), high},
		{"one slot, taken", NewRule(1, true), w(low, high), h(0, 0, 1), -1},
		{"without classes: up to n", NewRule(5, false), w(normal), h(0, 4, 0), normal},
		{"without classes: full", NewRule(5, false), w(normal), h(0, 5, 0), -1},
		{"nothing waits", NewRule(5, true), w(), h(0, 0, 0), -1},
	} {
		got, ok := c.rule.Pick(c.waiting, c.held)
		if !ok {
			got = -1
		}
		if got != c.want {
			t.Errorf("%s: Pick = %d, want %d", c.name, got, c.want)
		}
	}
}

type msg struct {
	name  string
	class int
	lane  string // "" alone
}

// TestQueue: classes go first as far as their lanes allow; a lane's
// messages start one at a time, in order; Done readies a lane in its next
// message's class; Drain returns what waits.
func TestQueue(t *testing.T) {
	q := NewQueue[string, string](NewRule(5, true))
	push := func(ms ...msg) {
		for _, m := range ms {
			q.Push(m.name, m.class, m.lane, m.lane != "")
		}
	}
	type running = Started[string, string]
	pop := func() (string, running) {
		t.Helper()
		v, s, ok := q.Pop()
		if !ok {
			t.Fatal("Pop: nothing may start")
		}
		return v, s
	}
	push(msg{"a-low1", low, "a"}, msg{"a-high", high, "a"}, msg{"b-low", low, "b"},
		msg{"c-low", low, "c"}, msg{"d-low", low, "d"}, msg{"x-low", low, ""})
	var got []string
	var started []running
	for range 3 { // low's cap at 5 slots
		v, s := pop()
		got = append(got, v)
		started = append(started, s)
	}
	if want := []string{"a-low1", "b-low", "c-low"}; !slices.Equal(got, want) {
		t.Fatalf("started %v, want %v", got, want)
	}
	if q.CanPop() {
		t.Fatal("a low started beyond its cap")
	}
	push(msg{"e-high", high, "e"}, msg{"y-normal", normal, ""})
	if v, _ := pop(); v != "e-high" {
		t.Fatalf("started %s, want e-high", v)
	}
	if v, _ := pop(); v != "y-normal" {
		t.Fatalf("started %s, want y-normal (it may take the reserve of normal)", v)
	}
	// a's high waits behind a-low1, whose lane is running.
	if lanes, waiting := q.Len(); lanes != 5 || waiting != 3 {
		t.Fatalf("Len = %d lanes, %d waiting; want 5 (a b c d e) and 3 (a-high d-low x-low)", lanes, waiting)
	}
	if q.Done(started[0]) != true {
		t.Fatal("Done of a-low1 did not ready its lane")
	}
	if v, _ := pop(); v != "a-high" {
		t.Fatalf("after a-low1, started %s; want a-high", v)
	}
	var drained []string
	q.Drain(func(v string) { drained = append(drained, v) })
	slices.Sort(drained)
	if want := []string{"d-low", "x-low"}; !slices.Equal(drained, want) {
		t.Fatalf("Drain returned %v, want %v", drained, want)
	}
	if q.CanPop() {
		t.Fatal("something may start after Drain")
	}
	if q.Held() != 5 {
		t.Fatalf("Held = %d, want the 5 running", q.Held())
	}
}

// TestQueueWithoutClasses: every message in one class starts in the order
// pushed, lanes taking turns.
func TestQueueWithoutClasses(t *testing.T) {
	q := NewQueue[string, string](NewRule(1, false))
	for _, m := range []msg{{"a1", normal, "a"}, {"a2", normal, "a"}, {"b1", normal, "b"}, {"z", normal, ""}, {"a3", normal, "a"}} {
		q.Push(m.name, m.class, m.lane, m.lane != "")
	}
	var got []string
	for {
		v, s, ok := q.Pop()
		if !ok {
			break
		}
		got = append(got, v)
		q.Done(s)
	}
	if want := []string{"a1", "b1", "z", "a2", "a3"}; !slices.Equal(got, want) {
		t.Errorf("started %v, want %v", got, want)
	}
}

// TestSlots: lows stop at their cap while a high still gets a slot; a
// freed slot goes to the waiting high before the waiting low, which waits
// until fewer than its cap are taken; a cancelled wait holds nothing.
func TestSlots(t *testing.T) {
	s := NewSlots(NewRule(5, true), 0)
	ctx := context.Background()
	for range 3 {
		if err := s.Acquire(ctx, low, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Acquire(ctx, high, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, high, 0); err != nil {
		t.Fatal(err)
	}
	// Full: a low and a high wait.
	got := make(chan int, 2)
	for _, c := range []int{low, high} {
		go func() {
			if err := s.Acquire(ctx, c, 0); err == nil {
				got <- c
			}
		}()
	}
	waitWaiting(t, s, 1, 1)
	s.Release(high, 0)
	if c := <-got; c != high {
		t.Fatalf("a freed slot went to class %d, want high", c)
	}
	// The low waits until fewer than its cap of 3 are taken in all.
	s.Release(low, 0)
	s.Release(high, 0)
	select {
	case c := <-got:
		t.Fatalf("class %d took a slot with 3 of 5 taken, want none (the reserve)", c)
	case <-time.After(20 * time.Millisecond):
	}
	s.Release(high, 0)
	if c := <-got; c != low {
		t.Fatalf("then class %d took the slot, want low", c)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := s.Acquire(cctx, low, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a full semaphore returned %v, want the context's error", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != [NumClasses]int{0, 0, 3} || s.waiting != [NumClasses]int{} {
		t.Fatalf("held %v, waiting %v; want [0 0 3] and none", s.held, s.waiting)
	}
}

func waitWaiting(t *testing.T, s *Slots, high, low int) {
	t.Helper()
	var w [NumClasses]int
	if !testenv.Within(5*time.Second, func() bool {
		s.mu.Lock()
		w = s.waiting
		s.mu.Unlock()
		return w[0] == high && w[2] == low
	}) {
		t.Fatalf("waiting %v, want %d high and %d low", w, high, low)
	}
}
