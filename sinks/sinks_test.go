package sinks_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/stdout"
)

type sinkFunc func(context.Context, consumer.Message) error

func (f sinkFunc) Send(ctx context.Context, m consumer.Message) error { return f(ctx, m) }

func TestHandlerKeepsClassification(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		delivered bool
		attempts  int
	}{
		{"delivered", nil, true, 1},
		{"permanent is not retried", consumer.Permanent(errors.New("400")), false, 1},
		{"retryable uses all attempts", errors.New("503"), false, 3},
		{"retry after is retryable", consumer.RetryAfter(errors.New("429"), time.Millisecond), false, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			h := sinks.Handler(sinkFunc(func(context.Context, consumer.Message) error { calls++; return tt.err }))
			out := consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Millisecond}.Process(context.Background(), h, consumer.Message{}, nil)
			if out.Delivered() != tt.delivered || out.Attempts != tt.attempts || calls != tt.attempts {
				t.Errorf("Process = %+v after %d calls, want delivered=%v after %d", out, calls, tt.delivered, tt.attempts)
			}
		})
	}
}

// Any sink becomes a consumer.Handler, to be wrapped with middleware.
func ExampleHandler() {
	var sink sinks.Sink = stdout.New(nil)
	h := consumer.Chain(sinks.Handler(sink))
	err := h(context.Background(), consumer.Message{Body: []byte(`{"hello":"world"}`), Attempt: 1})
	fmt.Println("error:", err)
	// Output:
	// {"key":"","body":{"hello":"world"},"headers":{},"source":{},"attempt":1}
	// error: <nil>
}
