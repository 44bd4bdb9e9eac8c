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
	s, err := limiter.NewLocalFairStore(10, 1, limiter.Fair{Horizon: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}, MaxReserve: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tenant := func(m consumer.Message) (string, error) { return m.Headers["x-tenant"], nil }
	if _, err := consumer.NewLimiter(b, consumer.LimitOptions{}); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Fatalf("NewLimiter without Tenant on a fair bucket: %v, want ErrInvalidConfig", err)
	}
	lim, err := consumer.NewLimiter(b, consumer.LimitOptions{Tenant: tenant, TenantWaiting: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msg := func(tn string) consumer.Message { return consumer.Message{Headers: map[string]string{"x-tenant": tn}} }
	// a takes the full bucket's token, then books its share of the
	// horizon (10 at 10/s), then one more waits for its share.
	for range 12 {
		go func() { _ = lim.WaitMessage(ctx, msg("a"), 1) }()
	}
	for deadline := time.Now().Add(5 * time.Second); b.Stats().Waiting < 11; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of a's messages waiting, want 11", b.Stats().Waiting)
		}
		time.Sleep(time.Millisecond)
	}
	err = lim.WaitMessage(ctx, msg("a"), 1)
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
