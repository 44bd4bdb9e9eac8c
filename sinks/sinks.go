package sinks

import (
	"context"

	"github.com/throttlehq/throttle/consumer"
)

// Sink delivers messages to one destination. Send returns nil when msg was
// delivered, and otherwise an error classified as described in the package
// documentation. Send must return when ctx ends. Implementations must be
// safe for concurrent use.
type Sink interface {
	Send(ctx context.Context, msg consumer.Message) error
}

// Handler adapts s to a consumer.Handler, so that a sink can be wrapped with
// the consumer's middleware and retry policy.
func Handler(s Sink) consumer.Handler {
	return s.Send
}
