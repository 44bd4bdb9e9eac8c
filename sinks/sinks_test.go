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
		permanent bool
		after     time.Duration // what RetryAfterOf reads, 0 for nothing
	}{
		{"delivered", nil, false, 0},
		{"permanent is not retried", consumer.Permanent(errors.New("400")), true, 0},
		{"retryable", errors.New("503"), false, 0},
		{"retry after is retryable, no sooner than its delay", consumer.RetryAfter(errors.New("429"), time.Second), false, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := sinks.Handler(sinkFunc(func(context.Context, consumer.Message) error { return tt.err }))
			err := h(context.Background(), consumer.Message{})
			after, _ := consumer.RetryAfterOf(err)
			if err != tt.err || consumer.IsPermanent(err) != tt.permanent || after != tt.after {
				t.Errorf("Handler's error = %v (permanent %v, retry after %v), want %v (permanent %v, retry after %v)",
					err, consumer.IsPermanent(err), after, tt.err, tt.permanent, tt.after)
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
