package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// Webhooks of a customer take 2 requests at a time: a concurrency layer
// keyed by the endpoint holds a slot from the grant until the handler
// returns, failed or not.
func ExampleSlotLimiter() {
	bucket, _ := limiter.NewLocal(1000, 1000, limiter.Layer{
		Name: "per-endpoint", Keyed: true, Concurrency: 2,
	})
	defer bucket.Close()
	lim, _ := consumer.NewLimiter(bucket, consumer.LimitOptions{
		Keys: func(m consumer.Message) (map[string]string, error) {
			return map[string]string{"per-endpoint": string(m.Key)}, nil
		},
	})
	var inFlight, most atomic.Int32
	send := consumer.Throttle(lim, nil)(func(context.Context, consumer.Message) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(10 * time.Millisecond) // the customer's endpoint
		return nil
	})
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { _ = send(context.Background(), consumer.Message{Key: []byte("https://hooks.example/a")}) })
	}
	wg.Wait()
	fmt.Println("at most", most.Load(), "at once")
	// Output:
	// at most 2 at once
}

// TestThrottleReleasesSlots: Throttle releases a message's slot when its
// attempt ends, whatever the outcome: a failure, a panic-free abandon at
// shutdown; a limiter refusal holds none.
func TestThrottleReleasesSlots(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := consumer.Message{Key: []byte("k")}
	fail := consumer.Throttle(lim, nil)(func(context.Context, consumer.Message) error { return errors.New("503") })
	for range 3 { // with a lease of an hour, each would wait for it if not released
		if err := fail(ctx, msg); err == nil || err.Error() != "503" {
			t.Fatalf("handler error = %v, want 503", err)
		}
	}
	// A handler cut short by its context gives its slot back too.
	hctx, hcancel := context.WithCancel(ctx)
	started := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- consumer.Throttle(lim, nil)(func(ctx context.Context, _ consumer.Message) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})(hctx, msg)
	}()
	<-started
	hcancel()
	<-done
	ok := consumer.Throttle(lim, nil)(func(context.Context, consumer.Message) error { return nil })
	if err := ok(ctx, msg); err != nil {
		t.Fatalf("after releases: %v", err)
	}
	// A bucket with a concurrency layer cannot be a consumer's Limiter
	// as it is: its slots need a release.
	unkeyed, err := limiter.NewLocal(1000, 1000, limiter.Layer{Name: "conc", Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer unkeyed.Close()
	if err := (consumer.Options{Limiter: unkeyed}).Validate(); err == nil || !strings.Contains(err.Error(), "concurrency layer") {
		t.Errorf("Options.Validate of a *limiter.Bucket with a concurrency layer = %v, want it refused", err)
	}
}
