package consumer_test

import (
	"context"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// TestPlainPathAllocations holds the per-message path of a delivered
// message, the Throttle and PushBack middleware over NewLimiter's limiter
// on a bucket without layers, to no allocation of its own: no Held for a
// grant that holds no slot, no release closure, no errors.As target for
// an error that is nil.
func TestPlainPathAllocations(t *testing.T) {
	bucket, err := limiter.NewLocal(1e9, 1_000_000_000)
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	lim, err := consumer.NewLimiter(bucket, consumer.LimitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := consumer.Chain(func(context.Context, consumer.Message) error { return nil },
		consumer.Throttle(lim, nil), consumer.PushBack(bucket))
	ctx := context.Background()
	msg := consumer.Message{Body: []byte(`{"to":"+15550100"}`), Headers: map[string]string{"x-id": "1"}}
	if n := testing.AllocsPerRun(1000, func() {
		if err := h(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a delivered message allocates %v times in Throttle and PushBack, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { consumer.RetryAfterOf(nil) }); n != 0 {
		t.Errorf("RetryAfterOf(nil) allocates %v times, want 0", n)
	}
}
