package kit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/internal/testenv"
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
			o := kit.Process(context.Background(), fastRetry, h, consumer.Message{}, nil)
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
	o := kit.Process(context.Background(), fastRetry, h, consumer.Message{}, nil)
	if o.Attempts != 1 || !consumer.IsPermanent(o.Err) || !errors.Is(o.Err, kit.ErrHandlerPanic) {
		t.Fatalf("outcome of a panicking handler = %+v", o)
	}
}

func TestProcessAbandonsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := func(context.Context, consumer.Message) error { cancel(); return errors.New("boom") }
	o := kit.Process(ctx, consumer.RetryPolicy{MaxAttempts: 5, Backoff: time.Hour}, h, consumer.Message{}, nil)
	if !o.Abandoned || o.Delivered() {
		t.Fatalf("outcome after cancel = %+v, want abandoned", o)
	}
}

func TestDelayBackoffJitterAndRetryAfter(t *testing.T) {
	p := consumer.RetryPolicy{Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for attempt, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 5: time.Second, 30: time.Second} {
		for range 50 {
			d := kit.RetryDelay(p, attempt, errors.New("x"))
			if d < base/2 || d > base {
				t.Fatalf("Delay(%d) = %v, want in [%v, %v]", attempt, d, base/2, base)
			}
		}
	}
	if d := kit.RetryDelay(p, 1, consumer.RetryAfter(errors.New("429"), 3*time.Second)); d != 3*time.Second {
		t.Fatalf("Delay with Retry-After 3s = %v", d)
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
	pos := map[string]string{"x-throttle-original-queue": "sms", "x-throttle-original-routing-key": "eu"}
	cases := []struct {
		name string
		o    kit.Outcome
		want map[string]string
	}{
		{"reason and position", kit.Outcome{Attempts: 5, Err: errors.New("400 bad number")}, map[string]string{
			consumer.HeaderError: "400 bad number", consumer.HeaderAttempts: "5",
			"x-throttle-original-queue": "sms", "x-throttle-original-routing-key": "eu",
		}},
		{"headers from the error, the consumer's win", kit.Outcome{Attempts: 1, Err: fmt.Errorf("sending: %w", recipientGone{})}, map[string]string{
			consumer.HeaderError: "sending: 410 gone", consumer.HeaderAttempts: "1", "x-throttle-recipient-gone": "true",
			"x-throttle-original-queue": "sms", "x-throttle-original-routing-key": "eu",
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
	o := kit.Process(context.Background(), fastRetry, h, consumer.Message{}, nil)
	if !o.Abandoned || o.Attempts != 1 || calls != 0 {
		t.Fatalf("outcome with a closed limiter = %+v, handler calls %d; want abandoned at once", o, calls)
	}
}

// TestProcessorLogsSinkTrouble checks the processor feeds its failure log:
// a sink that fails twice then recovers logs one failing line and one
// recovered line at info level; a permanent error logs neither.
func TestProcessorLogsSinkTrouble(t *testing.T) {
	var buf testenv.Buffer
	var deadAttempt int
	p, err := kit.NewProcessor(consumer.Options{
		Retry:    consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Millisecond, MaxBackoff: time.Millisecond},
		Logger:   slog.New(slog.NewTextHandler(&buf, nil)),
		Observer: &consumer.MessageObserver{DeadLettered: func(m consumer.Message, _ error) { deadAttempt = m.Attempt }},
	}, func(_ context.Context, m consumer.Message) error {
		switch {
		case string(m.Body) == "bad":
			return consumer.Permanent(errors.New("400 bad number"))
		case m.Attempt < 3:
			return errors.New("503 Service Unavailable")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := p.Process(context.Background(), consumer.Message{}); !out.Delivered() || out.Attempts != 3 {
		t.Fatalf("outcome %+v, want delivered at the third attempt", out)
	}
	logs := buf.String()
	if !strings.Contains(logs, `level=INFO msg="sink failing: 503 Service Unavailable, retrying"`) ||
		!strings.Contains(logs, `level=INFO msg="sink recovered after`) || strings.Count(logs, "\n") != 2 {
		t.Fatalf("logs:\n%s\nwant one failing and one recovered line", logs)
	}
	out := p.Process(context.Background(), consumer.Message{Body: []byte("bad")})
	p.DeadLettered(context.Background(), consumer.Message{}, out, slog.String("queue", "sms"))
	logs = strings.TrimPrefix(buf.String(), logs)
	if deadAttempt != 1 || !strings.Contains(logs, `level=WARN msg="message dead-lettered" queue=sms attempts=1 err="400 bad number"`) || strings.Count(logs, "\n") != 1 {
		t.Fatalf("dead-letter: attempt %d, logs:\n%s", deadAttempt, logs)
	}
}

// TestSetAside checks both ways a handler's SetAside error ends: a plain
// RetryPolicy (a backend that cannot set aside) waits the delay and calls
// the handler again with the same attempt number, reporting no failure; a
// Processor made with SetsAside returns it at once for the backend.
func TestSetAside(t *testing.T) {
	var attempts []int
	h := func(_ context.Context, m consumer.Message) error {
		attempts = append(attempts, m.Attempt)
		if len(attempts) <= 2 {
			return consumer.SetAside(errors.New("limit per-recipient: no room"), 5*time.Millisecond)
		}
		return nil
	}
	var failed int
	obs := &consumer.MessageObserver{Failed: func(consumer.Message, error) { failed++ }}
	start := time.Now()
	out := kit.Process(context.Background(), fastRetry, h, consumer.Message{}, obs)
	if !out.Delivered() || out.Attempts != 1 || failed != 0 || !slices.Equal(attempts, []int{1, 1, 1}) {
		t.Fatalf("in-handler wait: outcome %+v, attempts %v, failures %d; want delivered at attempt 1 after two waits", out, attempts, failed)
	}
	if took := time.Since(start); took < 10*time.Millisecond {
		t.Fatalf("in-handler wait took %v, want at least the two 5ms delays", took)
	}

	attempts = nil
	p, err := kit.NewProcessor(consumer.Options{Retry: fastRetry}, h, kit.SetsAside())
	if err != nil {
		t.Fatal(err)
	}
	out = p.Process(context.Background(), consumer.Message{})
	if out.SetAside != 5*time.Millisecond || out.Delivered() || out.Abandoned || out.Attempts != 0 || len(attempts) != 1 {
		t.Fatalf("SetsAside: outcome %+v after %d calls; want SetAside 5ms after one call", out, len(attempts))
	}
	if _, ok := kit.SetAsideOf(consumer.Permanent(consumer.SetAside(errors.New("x"), time.Second))); ok {
		t.Fatal("a permanent error counts as set aside")
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	o, err := kit.WithDefaults(consumer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if o.DrainTimeout != kit.DefaultDrainTimeout || o.Ordering != consumer.OrderPartition || o.Logger == nil || o.OrderingKey != nil || o.Retry.MaxAttempts != 5 {
		t.Fatalf("defaults = %+v", o)
	}
	if o, err := kit.WithDefaults(consumer.Options{Ordering: consumer.OrderKey}); err != nil || o.OrderingKey == nil {
		t.Fatalf("OrderKey defaults: %v, key function set %v", err, o.OrderingKey != nil)
	} else if _, err := kit.WithDefaults(o); err != nil {
		t.Fatalf("WithDefaults is not idempotent: %v", err)
	}
	bad := []struct {
		o     consumer.Options
		field string
	}{
		{consumer.Options{Cost: consumer.CostFromHeader("x-cost")}, "Cost"},
		{consumer.Options{Retry: consumer.RetryPolicy{Backoff: 2 * time.Second, MaxBackoff: time.Second}}, "Retry.MaxBackoff"},
		{consumer.Options{DrainTimeout: -1}, "DrainTimeout"},
		{consumer.Options{Ordering: "random"}, "Ordering"},
		{consumer.Options{OrderingKey: func(m consumer.Message) (string, error) { return m.Headers["x-key"], nil }}, "OrderingKey"},
		{consumer.Options{Retry: consumer.RetryPolicy{MaxAttempts: -1}}, "Retry.MaxAttempts"},
	}
	for _, tc := range bad {
		_, err := kit.WithDefaults(tc.o)
		if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("WithDefaults(%s) = %v, want ErrInvalidConfig naming the field", tc.field, err)
		}
	}
}
