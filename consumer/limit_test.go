package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/limiter"
)

// layeredBucket returns a Bucket on the in-process store with a keyed
// per-recipient layer.
func layeredBucket(t *testing.T, layer limiter.Layer) *limiter.Bucket {
	t.Helper()
	b, err := limiter.NewLocal(1000, 100, layer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func toKeys(m consumer.Message) (map[string]string, error) {
	return map[string]string{"per-recipient": m.Headers["to"]}, nil
}

// TestThrottleDeadLettersALayersRefusal: a dead_letter layer's refusal,
// from NewLimiter or from a MessageLimiter of the user's own, is
// dead-lettered at once with the layer and the reason. It used to be
// retried: three messages took 7 failed attempts, none dead-lettered, and
// all three were sent in the end.
func TestThrottleDeadLettersALayersRefusal(t *testing.T) {
	b := layeredBucket(t, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 1.0 / 3600, Burst: 1, OnExceed: limiter.ActionDeadLetter})
	l, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys})
	if err != nil {
		t.Fatal(err)
	}
	own := refusingLimiter{&limiter.LimitError{Layer: "mine", Action: limiter.ActionDeadLetter, Reason: "no"}}
	for _, c := range []struct {
		name      string
		l         consumer.Limiter
		sends     int
		wantLayer string
	}{
		{"NewLimiter", l, 1, "per-recipient"},
		{"a MessageLimiter of one's own", own, 0, "mine"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sent := 0
			h := consumer.Throttle(c.l, nil)(func(context.Context, consumer.Message) error { sent++; return nil })
			attempts := 0
			for range 3 {
				o := kit.Process(context.Background(), fastRetry, h, consumer.Message{Headers: map[string]string{"to": "+15550100"}}, nil)
				attempts += o.Attempts
				if o.Delivered() {
					continue
				}
				hd := o.DeadLetterHeaders(nil)
				if !consumer.IsPermanent(o.Err) || hd[consumer.HeaderLimit] != c.wantLayer || hd[consumer.HeaderLimitReason] == "" {
					t.Errorf("outcome %+v, headers %v: want a permanent failure naming layer %q and a reason", o, hd, c.wantLayer)
				}
			}
			if sent != c.sends || attempts != 3 {
				t.Errorf("%d sent in %d attempts, want %d sent in 3 (no retries)", sent, attempts, c.sends)
			}
		})
	}
}

// TestNewLimiterSetsAsideForADelayLayer: a delay layer's refusal sets the
// message aside for the layer's wait, with the slot it booked.
func TestNewLimiterSetsAsideForADelayLayer(t *testing.T) {
	b := layeredBucket(t, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 1, Burst: 1, OnExceed: limiter.ActionDelay})
	l, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys})
	if err != nil {
		t.Fatal(err)
	}
	h := consumer.Throttle(l, nil)(func(context.Context, consumer.Message) error { return nil })
	msg := consumer.Message{Headers: map[string]string{"to": "+15550100"}}
	if err := h(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	err = h(context.Background(), msg)
	d, ok := kit.SetAsideOf(err)
	if !ok || d <= 900*time.Millisecond || d > time.Second {
		t.Fatalf("second message: %v (set aside %v, %v), want set aside for about 1s", err, d, ok)
	}
}

// TestConsumerRefusesAKeyedBucket: a *limiter.Bucket with a keyed layer
// cannot name a message's keys; given directly as Options.Limiter it is a
// configuration error that names consumer.NewLimiter. It used to be taken
// as it was, and the layer silently skipped: 5 messages of one recipient
// at 1/s went out 0–1 ms apart. NewLimiter without Keys fails too.
func TestConsumerRefusesAKeyedBucket(t *testing.T) {
	b := layeredBucket(t, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 1, Burst: 1})
	_, err := kit.WithDefaults(consumer.Options{Limiter: b})
	var fe *consumer.FieldError
	if !errors.Is(err, consumer.ErrInvalidConfig) || !errors.As(err, &fe) || fe.Field != "Limiter" || !contains(err.Error(), "consumer.NewLimiter") {
		t.Errorf("Options with a keyed bucket: %v, want an ErrInvalidConfig naming Limiter and consumer.NewLimiter", err)
	}
	if _, err := consumer.NewLimiter(b, consumer.LimitOptions{}); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("NewLimiter without Keys on a keyed layer: %v, want ErrInvalidConfig", err)
	}
	l, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kit.WithDefaults(consumer.Options{Limiter: l}); err != nil {
		t.Errorf("Options with NewLimiter's limiter: %v", err)
	}
}

// TestNewLimiterWaitTimeout: a wait longer than WaitTimeout fails the
// attempt with a retryable error wrapping ErrWaitTimeout.
func TestNewLimiterWaitTimeout(t *testing.T) {
	// One token per 100 s per recipient: the second wait cannot be granted
	// within the timeout, which leaves the first, granted at once, room on
	// a loaded machine.
	b := layeredBucket(t, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 0.01, Burst: 1})
	var waiting, granted int
	l, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys, WaitTimeout: 500 * time.Millisecond,
		Waiting: func(d int) { waiting += d }, Granted: func(n int) { granted += n }})
	if err != nil {
		t.Fatal(err)
	}
	msg := consumer.Message{Headers: map[string]string{"to": "+15550100"}}
	if err := l.WaitMessage(context.Background(), msg, 1); err != nil {
		t.Fatal(err)
	}
	err = l.WaitMessage(context.Background(), msg, 1)
	if !errors.Is(err, consumer.ErrWaitTimeout) || consumer.IsPermanent(err) {
		t.Errorf("a wait of 100 s with WaitTimeout 500 ms: %v, want a retryable ErrWaitTimeout", err)
	}
	if waiting != 0 || granted != 1 {
		t.Errorf("Waiting sums to %d, Granted to %d; want 0 and 1", waiting, granted)
	}
}

// TestOptionsPriorityFromNewLimiter: a consumer waiting on NewLimiter's
// limiter orders its messages by the limiter's LimitOptions.Priority
// unless Options.Priority is set, so that a program sets the class once;
// without one it keeps one class.
func TestOptionsPriorityFromNewLimiter(t *testing.T) {
	b := layeredBucket(t, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 1, Burst: 1})
	fromHeader := consumer.PriorityFromHeader("x-priority", limiter.PriorityLow)
	l, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys, Priority: fromHeader})
	if err != nil {
		t.Fatal(err)
	}
	high := consumer.Message{Headers: map[string]string{"x-priority": "high"}}
	o, err := kit.WithDefaults(consumer.Options{Limiter: l})
	if err != nil || o.Priority == nil {
		t.Fatalf("WithDefaults = %v, Priority set %v; want the limiter's", err, o.Priority != nil)
	}
	if p, err := o.Priority(high); p != limiter.PriorityHigh || err != nil {
		t.Errorf("class of a high message = %v, %v", p, err)
	}
	mine := func(consumer.Message) (limiter.Priority, error) { return limiter.PriorityNormal, nil }
	if o, _ := kit.WithDefaults(consumer.Options{Limiter: l, Priority: mine}); o.Priority == nil {
		t.Error("Options.Priority was dropped")
	} else if p, _ := o.Priority(high); p != limiter.PriorityNormal {
		t.Errorf("Options.Priority lost to the limiter's: class %v", p)
	}
	plain, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys})
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := kit.WithDefaults(consumer.Options{Limiter: plain}); o.Priority != nil {
		t.Error("a limiter without Priority gave the consumer classes")
	}
	if _, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: toKeys, WaitTimeout: -time.Second}); !errors.Is(err, consumer.ErrInvalidConfig) || !contains(err.Error(), "WaitTimeout") {
		t.Errorf("a negative WaitTimeout: %v", err)
	}
}
