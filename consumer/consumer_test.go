package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

var fastRetry = consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

func TestCostFromHeader(t *testing.T) {
	cost := consumer.CostFromHeader("x-segments")
	cases := []struct {
		headers map[string]string
		want    int
		perm    bool
	}{
		{nil, 1, false},
		{map[string]string{"x-segments": "3"}, 3, false},
		{map[string]string{"x-segments": "0"}, 0, true},
		{map[string]string{"x-segments": "three"}, 0, true},
	}
	for _, tc := range cases {
		n, err := cost(consumer.Message{Headers: tc.headers})
		if n != tc.want || consumer.IsPermanent(err) != tc.perm {
			t.Errorf("cost(%v) = %d, %v; want %d, permanent %v", tc.headers, n, err, tc.want, tc.perm)
		}
		if tc.perm && err != nil && !contains(err.Error(), "x-segments") {
			t.Errorf("error %q does not name the header", err)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

type recordingPauser struct{ paused []time.Duration }

func (p *recordingPauser) Pause(_ context.Context, d time.Duration) error {
	p.paused = append(p.paused, d)
	return nil
}

func TestThrottleAndPushBack(t *testing.T) {
	b, err := limiter.NewLocal(1000, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := &recordingPauser{}
	calls := 0
	h := consumer.Chain(func(context.Context, consumer.Message) error {
		calls++
		return consumer.RetryAfter(errors.New("429"), 5*time.Second)
	}, consumer.Throttle(b, consumer.CostFromHeader("cost")), consumer.PushBack(p))

	err = h(context.Background(), consumer.Message{Headers: map[string]string{"cost": "2"}})
	if d, ok := consumer.RetryAfterOf(err); !ok || d != 5*time.Second || calls != 1 {
		t.Fatalf("handler error = %v (retry after %v), calls %d", err, d, calls)
	}
	if len(p.paused) != 1 || p.paused[0] != 5*time.Second {
		t.Fatalf("paused = %v, want [5s] (the Pauser caps it)", p.paused)
	}
	// A cost above the burst is dead-lettered, not waited for.
	err = h(context.Background(), consumer.Message{Headers: map[string]string{"cost": "3"}})
	if !consumer.IsPermanent(err) || !errors.Is(err, limiter.ErrCostExceedsBurst) || calls != 1 {
		t.Fatalf("cost 3 with burst 2: err = %v, calls %d", err, calls)
	}
}
