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

type refusingLimiter struct{ err error }

func (l refusingLimiter) Wait(context.Context, int) error { return l.err }

// TestThrottleSetsAsideForADelayLayer checks that a layer refusing with
// on_exceed delay becomes a SetAside for the layer's wait, not a failure.
func TestThrottleSetsAsideForADelayLayer(t *testing.T) {
	le := &limiter.LimitError{Layer: "per-recipient", Action: limiter.ActionDelay, Reason: "5 per 1h", Wait: 2 * time.Second}
	h := consumer.Throttle(refusingLimiter{le}, nil)(func(context.Context, consumer.Message) error { return nil })
	err := h(context.Background(), consumer.Message{})
	if d, ok := kit.SetAsideOf(err); !ok || d != 2*time.Second || !errors.As(err, &le) {
		t.Fatalf("Throttle error %v: set aside %v, %v; want 2s, wrapping the LimitError", err, d, ok)
	}
	le.Action = limiter.ActionDeadLetter
	if _, ok := kit.SetAsideOf(h(context.Background(), consumer.Message{})); ok {
		t.Fatal("a dead_letter layer's refusal was set aside")
	}
}
