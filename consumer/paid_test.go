package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/limiter"
)

// slotLimiter is a consumer.MessageLimiter on a layered store with one
// delay layer keyed by the message key, passing the paid slots as the
// binary's limiter does. It records the Paid of every request.
type slotLimiter struct {
	b *limiter.Bucket

	mu   sync.Mutex
	paid [][]limiter.PaidSlot
}

func newSlotLimiter(t *testing.T, rate float64) *slotLimiter {
	t.Helper()
	b, err := limiter.NewLocal(1e6, 1e6,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: rate, Burst: 1, OnExceed: limiter.ActionDelay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &slotLimiter{b: b}
}

func (l *slotLimiter) Wait(ctx context.Context, n int) error { return l.b.Wait(ctx, n) }

func (l *slotLimiter) WaitMessage(ctx context.Context, msg consumer.Message, n int) error {
	paid := setaside.PaidSlots(msg.Headers)
	l.mu.Lock()
	l.paid = append(l.paid, paid)
	l.mu.Unlock()
	return l.b.WaitN(ctx, limiter.Request{Cost: n, Keys: map[string]string{"per-key": string(msg.Key)}, Paid: paid})
}

// TestThrottleSetsAsideWithTheBookedSlot: a delay layer that books the
// message's slot makes Throttle set it aside until then with HeaderPaid
// naming the slot, keeping a slot of another layer the message still
// holds; back with it, the message passes the layer.
func TestThrottleSetsAsideWithTheBookedSlot(t *testing.T) {
	l := newSlotLimiter(t, 4) // slots 250 ms apart
	h := consumer.Throttle(l, nil)(func(context.Context, consumer.Message) error { return nil })
	ctx := context.Background()
	if err := h(ctx, consumer.Message{Key: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	old := `[{"layer":"other","key":"x","due":"2026-01-01T00:00:00Z"}]`
	msg := consumer.Message{Key: []byte("a"), Headers: map[string]string{setaside.HeaderPaid: old}}
	err := h(ctx, msg)
	d, ok := kit.SetAsideOf(err)
	if !ok || d <= 0 || d > 250*time.Millisecond {
		t.Fatalf("second message: %v (set aside %v, %v), want set aside for at most 250ms", err, d, ok)
	}
	out := kit.Outcome{Err: err, SetAside: d}
	var slots []limiter.PaidSlot
	if err := json.Unmarshal([]byte(out.SetAsideHeaders()[setaside.HeaderPaid]), &slots); err != nil {
		t.Fatalf("%s: %v", setaside.HeaderPaid, err)
	}
	var le *limiter.LimitError
	if !errors.As(err, &le) || len(slots) != 2 || slots[0].Layer != "other" || slots[1].Layer != "per-key" ||
		slots[1].Key != "a" || !slots[1].Due.Equal(le.RetryAt) {
		t.Fatalf("%s = %+v, want the other layer's slot and per-key's for key a at %v", setaside.HeaderPaid, slots, le)
	}
	back := out.Returned(msg)
	if msg.Headers[setaside.HeaderPaid] != old {
		t.Fatal("Returned changed the original message's headers")
	}
	// Early by more than a moment: set aside again, the limiter not asked.
	asked := len(l.paid)
	if d, ok := kit.SetAsideOf(h(ctx, back)); !ok || d <= 0 || len(l.paid) != asked {
		t.Fatalf("back early: set aside %v %v, limiter asked %d times, want set aside again without asking", d, ok, len(l.paid)-asked)
	}
	time.Sleep(time.Until(le.RetryAt))
	if err := h(ctx, back); err != nil {
		t.Fatalf("back at its slot: %v, want it through", err)
	}
	if got := l.paid[len(l.paid)-1]; len(got) != 2 || got[0].Layer != "other" || got[1].Layer != "per-key" || got[1].Key != "a" {
		t.Fatalf("the limiter was asked with Paid %+v, want other's slot and per-key's for key a", got)
	}
}

// TestProcessPaysOnceWaitingInTheHandler: without a backend that sets
// messages aside, Process waits out each slot in the handler and calls it
// again with the slot paid, so 5 messages of one key refused together are
// refused once each (not 1+2+3+4 times); a failed attempt's retry pays
// again.
func TestProcessPaysOnceWaitingInTheHandler(t *testing.T) {
	const n = 5
	l := newSlotLimiter(t, 20)
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
	)
	h := consumer.Throttle(l, nil)(func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[string(m.Body)]++
		if string(m.Body) == "0" && attempts["0"] == 1 {
			return errors.New("503 try again")
		}
		return nil
	})
	p := consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}
	var wg sync.WaitGroup
	outs := make([]kit.Outcome, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = kit.Process(context.Background(), p, h, consumer.Message{Key: []byte("a"), Body: []byte{byte('0' + i)}}, nil)
		}()
	}
	wg.Wait()
	for i, o := range outs {
		if !o.Delivered() {
			t.Fatalf("message %d: %+v, want delivered", i, o)
		}
	}
	paid, unpaid := 0, 0
	for _, p := range l.paid {
		if len(p) == 1 && p[0].Layer == "per-key" && p[0].Key == "a" {
			paid++
		} else {
			unpaid++
		}
	}
	// n first takes and the failed message's retry pay; each message
	// refused (at most n: the retry may be refused too) comes back paid.
	// A slot back late (a timer's lateness above backend.PaidLateness,
	// 25 ms here) is booked again: allow one.
	if unpaid != n+1 || paid > n+1 {
		t.Errorf("%d takes without a paid slot, %d with; want %d without (the first takes and the retry) and about %d with", unpaid, paid, n+1, n)
	}
	t.Logf("%d messages of one key at 20/s: %d takes, %d of them with a paid slot", n, len(l.paid), paid)
}
