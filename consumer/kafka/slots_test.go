package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// TestRevocableLimiterHoldsSlots: the limiter a Kafka consumer waits on
// passes a concurrency layer's slots through (consumer.SlotLimiter), so
// that Throttle acquires and releases them. Before it did, every message
// of a bucket with a concurrency layer failed with
// limiter.ErrNeedsAcquire and was dead-lettered.
func TestRevocableLimiterHoldsSlots(t *testing.T) {
	t.Parallel()
	bucket, err := limiter.NewLocal(1000, 1000, limiter.Layer{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	lim, err := consumer.NewLimiter(bucket, consumer.LimitOptions{
		Keys: func(m consumer.Message) (map[string]string, error) {
			return map[string]string{"conc": string(m.Key)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var l consumer.Limiter = revocableLimiter{lim}
	if _, ok := l.(consumer.SlotLimiter); !ok {
		t.Fatal("revocableLimiter is no consumer.SlotLimiter")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := consumer.Message{Key: []byte("k")}
	var held bool
	send := consumer.Throttle(l, nil)(func(ctx context.Context, _ consumer.Message) error {
		// The slot is held during the attempt: another message of the
		// key cannot take it.
		wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer wcancel()
		_, err := bucket.Acquire(wctx, limiter.Request{Cost: 1, Keys: map[string]string{"conc": "k"}})
		held = errors.Is(err, context.DeadlineExceeded)
		return nil
	})
	for range 3 { // with a lease of an hour, each would wait for it if not released
		if err := send(ctx, msg); err != nil {
			t.Fatalf("handler error = %v", err)
		}
		if !held {
			t.Fatal("the slot was free during the attempt")
		}
	}
}
