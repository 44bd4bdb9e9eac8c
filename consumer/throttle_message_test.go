package consumer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

// messageLimiter records what Throttle asked of it.
type messageLimiter struct {
	waits int
	seen  []string
	err   error
}

func (l *messageLimiter) Wait(context.Context, int) error { l.waits++; return nil }

func (l *messageLimiter) WaitMessage(_ context.Context, msg consumer.Message, cost int) error {
	l.seen = append(l.seen, string(msg.Key))
	return l.err
}

func TestThrottleHandsTheMessageToAMessageLimiter(t *testing.T) {
	l := &messageLimiter{}
	called := 0
	h := consumer.Throttle(l, nil)(func(context.Context, consumer.Message) error { called++; return nil })
	if err := h(context.Background(), consumer.Message{Key: []byte("k1")}); err != nil {
		t.Fatal(err)
	}
	if l.waits != 0 || len(l.seen) != 1 || l.seen[0] != "k1" || called != 1 {
		t.Fatalf("Wait calls %d, WaitMessage saw %v, handler calls %d; want 0, [k1], 1", l.waits, l.seen, called)
	}
	l.err = consumer.Permanent(errors.New("limit per-recipient exceeded"))
	if err := h(context.Background(), consumer.Message{Key: []byte("k2")}); !consumer.IsPermanent(err) || called != 1 {
		t.Fatalf("refused message: err %v (permanent %v), handler calls %d; want a permanent error and no call", err, consumer.IsPermanent(err), called)
	}
}
