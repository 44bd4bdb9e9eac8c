package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestFloorGateSteps: the callers of a class held back by a floor take
// their turns in order of arrival; one that gives up leaves the line, and
// one handed its turn as it gives up hands it on. Other classes are not
// held.
func TestFloorGateSteps(t *testing.T) {
	var g floorGate
	done := make(chan struct{})
	ctx := context.Background()
	if head, err := g.enter(ctx, done, PriorityHigh); head || err != nil {
		t.Fatalf("enter with no floor = %v, %v; want at once, not head", head, err)
	}
	if !g.hold(PriorityHigh) || g.hold(PriorityHigh) {
		t.Fatal("hold: want the first caller to hold the class and the second not")
	}
	type turn struct {
		name string
		head bool
		err  error
	}
	turns := make(chan turn, 4)
	queue := func(name string, ctx context.Context) {
		n := g.waiting(PriorityHigh)
		go func() {
			head, err := g.enter(ctx, done, PriorityHigh)
			turns <- turn{name, head, err}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for g.waiting(PriorityHigh) != n+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not queue", name)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	gone, cancel := context.WithCancel(ctx)
	queue("a", ctx)
	queue("b", gone)
	queue("c", ctx)
	if head, err := g.enter(ctx, done, PriorityNormal); head || err != nil {
		t.Fatalf("enter of another class = %v, %v; want at once", head, err)
	}
	cancel()
	if got := <-turns; got.name != "b" || got.head || !errors.Is(got.err, context.Canceled) {
		t.Fatalf("after cancelling b: %+v; want b out of the line", got)
	}
	for _, want := range []string{"a", "c"} {
		g.pass(PriorityHigh)
		if got := <-turns; got.name != want || !got.head || got.err != nil {
			t.Fatalf("turn %+v, want %s as head", got, want)
		}
	}
	g.pass(PriorityHigh)
	if head, err := g.enter(ctx, done, PriorityHigh); head || err != nil {
		t.Fatalf("enter after the line = %v, %v; want the class free", head, err)
	}
}

// waiting returns how many callers of class c wait for their turn.
func (g *floorGate) waiting(c Priority) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue[c].waiters)
}
