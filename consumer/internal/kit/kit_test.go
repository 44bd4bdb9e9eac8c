package kit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

func TestBackoffDelay(t *testing.T) {
	b := kit.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for failures, ceiling := range map[int]time.Duration{0: 100 * time.Millisecond, 1: 200 * time.Millisecond, 3: 800 * time.Millisecond, 4: time.Second, 60: time.Second} {
		for range 100 {
			if d := b.Delay(failures); d < ceiling/2 || d > ceiling {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", failures, d, ceiling/2, ceiling)
			}
		}
	}
	if d := (kit.Backoff{}).Delay(3); d != 0 {
		t.Fatalf("zero Backoff Delay = %v, want 0", d)
	}
}

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if err := kit.Sleep(ctx, time.Millisecond); err != nil {
		t.Fatalf("Sleep = %v", err)
	}
	cancel()
	if err := kit.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep after cancel = %v, want context.Canceled", err)
	}
}

func TestLifecycle(t *testing.T) {
	var l kit.Lifecycle
	ctx, end, err := l.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Start(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Fatalf("second Start = %v, want ErrStopped", err)
	}
	returned := make(chan struct{})
	go func() { // Run
		defer end()
		defer close(returned) // Run's last act before end
		<-ctx.Done()          // Run stops when Close cancels it
	}()
	_ = l.Close()
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before Run")
	}
	_ = l.Close() // idempotent

	var fresh kit.Lifecycle
	_ = fresh.Close()
	if _, _, err := fresh.Start(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Fatalf("Start after Close = %v, want ErrStopped", err)
	}
}

func TestKeyQueue(t *testing.T) {
	var q kit.KeyQueue[int]
	steps := []struct {
		op    string // push or next
		key   string
		v     int
		owner bool // push: became owner; next: got an item
		want  int  // next: the item
	}{
		{"push", "a", 1, true, 0},
		{"push", "a", 2, false, 0},
		{"push", "b", 3, true, 0}, // another key proceeds
		{"push", "a", 4, false, 0},
		{"next", "a", 0, true, 2},
		{"next", "a", 0, true, 4},
		{"next", "a", 0, false, 0}, // releases a
		{"push", "a", 5, true, 0},  // a new owner
		{"next", "b", 0, false, 0},
		{"next", "a", 0, false, 0},
	}
	for i, s := range steps {
		switch s.op {
		case "push":
			if got := q.Push(s.key, s.v); got != s.owner {
				t.Fatalf("step %d: Push(%s, %d) = %v, want %v", i, s.key, s.v, got, s.owner)
			}
		case "next":
			v, ok := q.Next(s.key)
			if ok != s.owner || v != s.want {
				t.Fatalf("step %d: Next(%s) = %d, %v; want %d, %v", i, s.key, v, ok, s.want, s.owner)
			}
		}
	}
	if keys, queued := q.Len(); keys != 0 || queued != 0 {
		t.Fatalf("Len = %d, %d after every key was released", keys, queued)
	}
}

// TestKeyQueueConcurrent runs the protocol from many goroutines: each key's
// items are handled in push order, one at a time, and each exactly once.
func TestKeyQueueConcurrent(t *testing.T) {
	var q kit.KeyQueue[int]
	var mu sync.Mutex
	got := map[string][]int{}
	active := map[string]bool{}
	var wg sync.WaitGroup
	handle := func(key string, v int) {
		mu.Lock()
		if active[key] {
			t.Errorf("key %s handled twice at once", key)
		}
		active[key] = true
		got[key] = append(got[key], v)
		mu.Unlock()
		time.Sleep(10 * time.Microsecond)
		mu.Lock()
		active[key] = false
		mu.Unlock()
	}
	keys := []string{"a", "b", "c"}
	for i := range 300 {
		key := keys[i%3]
		if q.Push(key, i) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for v, ok := i, true; ok; v, ok = q.Next(key) {
					handle(key, v)
				}
			}()
		}
	}
	wg.Wait()
	for _, key := range keys {
		if len(got[key]) != 100 || !slices.IsSorted(got[key]) {
			t.Errorf("key %s handled %d items, in order %v", key, len(got[key]), slices.IsSorted(got[key]))
		}
	}
}
