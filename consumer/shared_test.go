package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

func TestBackoffDelay(t *testing.T) {
	b := consumer.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for failures, ceiling := range map[int]time.Duration{0: 100 * time.Millisecond, 1: 200 * time.Millisecond, 3: 800 * time.Millisecond, 4: time.Second, 60: time.Second} {
		for range 100 {
			if d := b.Delay(failures); d < ceiling/2 || d > ceiling {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", failures, d, ceiling/2, ceiling)
			}
		}
	}
	if d := (consumer.Backoff{}).Delay(3); d != 0 {
		t.Fatalf("zero Backoff Delay = %v, want 0", d)
	}
}

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if err := consumer.Sleep(ctx, time.Millisecond); err != nil {
		t.Fatalf("Sleep = %v", err)
	}
	cancel()
	if err := consumer.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep after cancel = %v, want context.Canceled", err)
	}
}

func TestLifecycle(t *testing.T) {
	var l consumer.Lifecycle
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

	var fresh consumer.Lifecycle
	_ = fresh.Close()
	if _, _, err := fresh.Start(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Fatalf("Start after Close = %v, want ErrStopped", err)
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	o, err := consumer.Options{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.DrainTimeout != consumer.DefaultDrainTimeout || o.Ordering != consumer.OrderPartition || o.Logger == nil || o.OrderingKey != nil || o.Retry.MaxAttempts != 5 {
		t.Fatalf("defaults = %+v", o)
	}
	if o, err := (consumer.Options{Ordering: consumer.OrderKey}).WithDefaults(); err != nil || o.OrderingKey == nil {
		t.Fatalf("OrderKey defaults: %v, key function set %v", err, o.OrderingKey != nil)
	} else if _, err := o.WithDefaults(); err != nil {
		t.Fatalf("WithDefaults is not idempotent: %v", err)
	}
	bad := []struct {
		o     consumer.Options
		field string
	}{
		{consumer.Options{Cost: consumer.CostOne}, "Cost"},
		{consumer.Options{Retry: consumer.RetryPolicy{Backoff: 2 * time.Second, MaxBackoff: time.Second}}, "Retry.MaxBackoff"},
		{consumer.Options{DrainTimeout: -1}, "DrainTimeout"},
		{consumer.Options{Ordering: "random"}, "Ordering"},
		{consumer.Options{OrderingKey: consumer.KeyOf}, "OrderingKey"},
		{consumer.Options{Retry: consumer.RetryPolicy{MaxAttempts: -1}}, "Retry.MaxAttempts"},
	}
	for _, tc := range bad {
		_, err := tc.o.WithDefaults()
		if !errors.Is(err, consumer.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("WithDefaults(%s) = %v, want ErrInvalidOptions naming the field", tc.field, err)
		}
	}
}

func TestKeyQueue(t *testing.T) {
	var q consumer.KeyQueue[int]
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
	var q consumer.KeyQueue[int]
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

// TestProcessorLogsSinkTrouble checks the processor feeds its failure log:
// a sink that fails twice then recovers logs one failing line and one
// recovered line at info level; a permanent error logs neither.
func TestProcessorLogsSinkTrouble(t *testing.T) {
	var buf testenv.Buffer
	var deadAttempt int
	p, err := consumer.NewProcessor(consumer.Options{
		Retry:    consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Millisecond, MaxBackoff: time.Millisecond},
		Logger:   slog.New(slog.NewTextHandler(&buf, nil)),
		Observer: &consumer.MessageObserver{DeadLettered: func(m consumer.Message, _ error) { deadAttempt = m.Attempt }},
	}, func(_ context.Context, m consumer.Message) error {
		switch {
		case string(m.Body) == "bad":
			return consumer.Permanent(errors.New("400 bad number"))
		case m.Attempt < 3:
			return errors.New("503 Service Unavailable")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := p.Process(context.Background(), consumer.Message{}); !out.Delivered() || out.Attempts != 3 {
		t.Fatalf("outcome %+v, want delivered at the third attempt", out)
	}
	logs := buf.String()
	if !strings.Contains(logs, `level=INFO msg="sink failing: 503 Service Unavailable, retrying"`) ||
		!strings.Contains(logs, `level=INFO msg="sink recovered after`) || strings.Count(logs, "\n") != 2 {
		t.Fatalf("logs:\n%s\nwant one failing and one recovered line", logs)
	}
	out := p.Process(context.Background(), consumer.Message{Body: []byte("bad")})
	p.DeadLettered(consumer.Message{}, out, slog.String("queue", "sms"))
	logs = strings.TrimPrefix(buf.String(), logs)
	if deadAttempt != 1 || !strings.Contains(logs, `level=WARN msg="message dead-lettered" queue=sms attempts=1 err="400 bad number"`) || strings.Count(logs, "\n") != 1 {
		t.Fatalf("dead-letter: attempt %d, logs:\n%s", deadAttempt, logs)
	}
}

// TestSetAside checks both ways a handler's SetAside error ends: a plain
// RetryPolicy (a backend that cannot set aside) waits the delay and calls
// the handler again with the same attempt number, reporting no failure; a
// Processor made with SetsAside returns it at once for the backend.
func TestSetAside(t *testing.T) {
	var attempts []int
	h := func(_ context.Context, m consumer.Message) error {
		attempts = append(attempts, m.Attempt)
		if len(attempts) <= 2 {
			return consumer.SetAside(errors.New("limit per-recipient: no room"), 5*time.Millisecond)
		}
		return nil
	}
	var failed int
	obs := &consumer.MessageObserver{Failed: func(consumer.Message, error) { failed++ }}
	start := time.Now()
	out := fastRetry.Process(context.Background(), h, consumer.Message{}, obs)
	if !out.Delivered() || out.Attempts != 1 || failed != 0 || !slices.Equal(attempts, []int{1, 1, 1}) {
		t.Fatalf("in-handler wait: outcome %+v, attempts %v, failures %d; want delivered at attempt 1 after two waits", out, attempts, failed)
	}
	if took := time.Since(start); took < 10*time.Millisecond {
		t.Fatalf("in-handler wait took %v, want at least the two 5ms delays", took)
	}

	attempts = nil
	p, err := consumer.NewProcessor(consumer.Options{Retry: fastRetry}, h, consumer.SetsAside())
	if err != nil {
		t.Fatal(err)
	}
	out = p.Process(context.Background(), consumer.Message{})
	if out.SetAside != 5*time.Millisecond || out.Delivered() || out.Abandoned || out.Attempts != 0 || len(attempts) != 1 {
		t.Fatalf("SetsAside: outcome %+v after %d calls; want SetAside 5ms after one call", out, len(attempts))
	}
	if _, ok := consumer.SetAsideOf(consumer.Permanent(consumer.SetAside(errors.New("x"), time.Second))); ok {
		t.Fatal("a permanent error counts as set aside")
	}
}

type refusingLimiter struct{ err error }

func (l refusingLimiter) Wait(context.Context, int) error { return l.err }

// TestThrottleSetsAsideForADelayLayer checks that a layer refusing with
// on_exceed delay becomes a SetAside for the layer's wait, not a failure.
func TestThrottleSetsAsideForADelayLayer(t *testing.T) {
	le := &limiter.LimitError{Layer: "per-recipient", Action: limiter.ActionDelay, Reason: "5 per 1h", Wait: 2 * time.Second}
	h := consumer.Throttle(refusingLimiter{le}, nil)(func(context.Context, consumer.Message) error { return nil })
	err := h(context.Background(), consumer.Message{})
	if d, ok := consumer.SetAsideOf(err); !ok || d != 2*time.Second || !errors.As(err, &le) {
		t.Fatalf("Throttle error %v: set aside %v, %v; want 2s, wrapping the LimitError", err, d, ok)
	}
	le.Action = limiter.ActionDeadLetter
	if _, ok := consumer.SetAsideOf(h(context.Background(), consumer.Message{})); ok {
		t.Fatal("a dead_letter layer's refusal was set aside")
	}
}
