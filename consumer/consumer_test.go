package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

var fastRetry = consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

func TestProcessOutcomes(t *testing.T) {
	errFlaky := errors.New("503")
	cases := []struct {
		name         string
		failures     int // attempts that fail before success
		err          error
		wantAttempts int
		delivered    bool
		permanent    bool
	}{
		{"first try", 0, errFlaky, 1, true, false},
		{"retried then delivered", 2, errFlaky, 3, true, false},
		{"out of attempts", 99, errFlaky, 3, false, false},
		{"permanent is not retried", 99, consumer.Permanent(errors.New("400")), 1, false, true},
		{"wrapped sentinel is permanent", 99, fmt.Errorf("bad: %w", consumer.ErrPermanent), 1, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var attempts []int
			h := func(_ context.Context, m consumer.Message) error {
				attempts = append(attempts, m.Attempt)
				if len(attempts) <= tc.failures {
					return tc.err
				}
				return nil
			}
			o := fastRetry.Process(context.Background(), h, consumer.Message{}, nil)
			if o.Attempts != tc.wantAttempts || o.Delivered() != tc.delivered || o.Abandoned {
				t.Fatalf("outcome = %+v, want %d attempts, delivered %v", o, tc.wantAttempts, tc.delivered)
			}
			if got := consumer.IsPermanent(o.Err); got != tc.permanent {
				t.Fatalf("IsPermanent(%v) = %v", o.Err, got)
			}
			for i, a := range attempts {
				if a != i+1 {
					t.Fatalf("attempt numbers = %v", attempts)
				}
			}
		})
	}
}

func TestProcessRecoversPanics(t *testing.T) {
	h := func(context.Context, consumer.Message) error { panic("poison") }
	o := fastRetry.Process(context.Background(), h, consumer.Message{}, nil)
	if o.Attempts != 1 || !consumer.IsPermanent(o.Err) || !errors.Is(o.Err, consumer.ErrHandlerPanic) {
		t.Fatalf("outcome of a panicking handler = %+v", o)
	}
}

func TestProcessAbandonsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := func(context.Context, consumer.Message) error { cancel(); return errors.New("boom") }
	o := consumer.RetryPolicy{MaxAttempts: 5, Backoff: time.Hour}.Process(ctx, h, consumer.Message{}, nil)
	if !o.Abandoned || o.Delivered() {
		t.Fatalf("outcome after cancel = %+v, want abandoned", o)
	}
}

func TestDelayBackoffJitterAndRetryAfter(t *testing.T) {
	p := consumer.RetryPolicy{Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for attempt, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 5: time.Second, 30: time.Second} {
		for range 50 {
			d := p.Delay(attempt, errors.New("x"))
			if d < base/2 || d > base {
				t.Fatalf("Delay(%d) = %v, want in [%v, %v]", attempt, d, base/2, base)
			}
		}
	}
	if d := p.Delay(1, consumer.RetryAfter(errors.New("429"), 3*time.Second)); d != 3*time.Second {
		t.Fatalf("Delay with Retry-After 3s = %v", d)
	}
}

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

// recipientGone is an error that adds a dead-letter header, as a sink's
// status error does.
type recipientGone struct{}

func (recipientGone) Error() string { return "410 gone" }
func (recipientGone) DeadLetterHeaders() map[string]string {
	return map[string]string{"x-throttle-recipient-gone": "true", consumer.HeaderAttempts: "spoofed"}
}

func TestDeadLetterHeaders(t *testing.T) {
	pos := map[string]string{consumer.HeaderOriginalQueue: "sms", consumer.HeaderOriginalRoutingKey: "eu"}
	cases := []struct {
		name string
		o    consumer.Outcome
		want map[string]string
	}{
		{"reason and position", consumer.Outcome{Attempts: 5, Err: errors.New("400 bad number")}, map[string]string{
			consumer.HeaderError: "400 bad number", consumer.HeaderAttempts: "5",
			consumer.HeaderOriginalQueue: "sms", consumer.HeaderOriginalRoutingKey: "eu",
		}},
		{"headers from the error, the consumer's win", consumer.Outcome{Attempts: 1, Err: fmt.Errorf("sending: %w", recipientGone{})}, map[string]string{
			consumer.HeaderError: "sending: 410 gone", consumer.HeaderAttempts: "1", "x-throttle-recipient-gone": "true",
			consumer.HeaderOriginalQueue: "sms", consumer.HeaderOriginalRoutingKey: "eu",
		}},
	}
	for _, tc := range cases {
		h := tc.o.DeadLetterHeaders(pos)
		if len(h) != len(tc.want) {
			t.Errorf("%s: headers %v, want %v", tc.name, h, tc.want)
		}
		for k, v := range tc.want {
			if h[k] != v {
				t.Errorf("%s: header %s = %q, want %q", tc.name, k, h[k], v)
			}
		}
	}
}

func TestClosedLimiterAbandonsInsteadOfDeadLettering(t *testing.T) {
	b, err := limiter.NewLocal(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	calls := 0
	h := consumer.Chain(func(context.Context, consumer.Message) error { calls++; return nil }, consumer.Throttle(b, nil))
	o := fastRetry.Process(context.Background(), h, consumer.Message{}, nil)
	if !o.Abandoned || o.Attempts != 1 || calls != 0 {
		t.Fatalf("outcome with a closed limiter = %+v, handler calls %d; want abandoned at once", o, calls)
	}
}
