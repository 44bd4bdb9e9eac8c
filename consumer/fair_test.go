package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// TestNewLimiterFairSetsAsideBeyondTenantWaiting: once a tenant holds its
// share and TenantWaiting of its messages wait for more, a further one is
// refused at once for the consumer to set aside (a delay refusal by
// limiter.FairLayer), while another tenant's message is granted.
func TestNewLimiterFairSetsAsideBeyondTenantWaiting(t *testing.T) {
	tenant := func(m consumer.Message) (string, error) { return m.Headers["x-tenant"], nil }
	msg := func(tn string) consumer.Message { return consumer.Message{Headers: map[string]string{"x-tenant": tn}} }
	// setUp builds the bucket (10/s, burst 1) and its limiter, and has a
	// take the full bucket's token, book its share of the horizon (10 at
	// 10/s), and one more wait for its share. It reports false when that
	// took 50 ms or more: a's first booking comes due 100 ms after the
	// start, and a's 13th message must ask before it does.
	setUp := func(ctx context.Context) (consumer.MessageLimiter, bool) {
		s, err := limiter.NewLocalFairStore(10, 1, limiter.Fair{Horizon: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		b, err := limiter.New(s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}, MaxReserve: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		if _, err := consumer.NewLimiter(b, consumer.LimitOptions{}); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Fatalf("NewLimiter without Tenant on a fair bucket: %v, want ErrInvalidConfig", err)
		}
		lim, err := consumer.NewLimiter(b, consumer.LimitOptions{Tenant: tenant, TenantWaiting: 1})
		if err != nil {
			t.Fatal(err)
		}
		begun := time.Now()
		for range 12 {
			go func() { _ = lim.WaitMessage(ctx, msg("a"), 1) }()
		}
		// Waiting counts a message from the moment it asks, before the
		// fair share counts it among a's waiting: all 12 must be in
		// (1 granted, 11 waiting) and still so a poll later.
		settled := 0
		for deadline := time.Now().Add(5 * time.Second); settled < 2; {
			if st := b.Stats(); st.Waiting == 11 && st.Granted == 1 {
				settled++
			} else {
				settled = 0
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of a's messages waiting, want 11", b.Stats().Waiting)
			}
			time.Sleep(time.Millisecond)
		}
		return lim, time.Since(begun) < 50*time.Millisecond
	}
	var (
		lim consumer.MessageLimiter
		ctx context.Context
	)
	for attempt := 1; ; attempt++ {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		var inTime bool
		if lim, inTime = setUp(ctx); inTime {
			break
		}
		if attempt == 5 {
			t.Fatal("a's 12 messages took 50 ms or more to start waiting, 5 times")
		}
		t.Logf("attempt %d: a's messages took 50 ms or more to start waiting; again", attempt)
		cancel()
	}
	err := lim.WaitMessage(ctx, msg("a"), 1)
	var le *limiter.LimitError
	if !errors.As(err, &le) || le.Layer != limiter.FairLayer || le.Action != limiter.ActionDelay || le.Wait <= 0 || le.Spacing <= 0 {
		t.Fatalf("a's 13th message: %v, want a delay refusal by %q with a wait and a spacing", err, limiter.FairLayer)
	}
	// b holds nothing: it books at once, behind a's share.
	start := time.Now()
	if err := lim.WaitMessage(ctx, msg("b"), 1); err != nil {
		t.Fatalf("b: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("b waited %v, want about a's share of the horizon (1 s)", d)
	}
}
