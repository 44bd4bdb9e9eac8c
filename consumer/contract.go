package consumer

import "context"

// Consumer is the contract of every backend's Consumer (consumer/kafka,
// consumer/rabbitmq): a program, or the binary, runs any of them the same
// way, and consumer/consumertest checks that a backend keeps it.
//
// Beyond these methods, the contract is what Options means, the same for
// every backend: Concurrency bounds the messages handled at once;
// SetAside opts in to setting messages aside; Observer receives the same
// events (MessageObserver), the connection events included; the Logger
// gets the same messages with the same keys for the same events; New
// rejects a configuration with an error wrapping ErrInvalidConfig; and
// the headers of a message dead-lettered or set aside are those this
// package names (HeaderError, HeaderAttempts, HeaderDue,
// HeaderSetAsideReason) and the paid-slot header x-throttle-paid.
type Consumer interface {
	// Run consumes until ctx ends or Close is called, then drains:
	// in-flight handlers finish within Options.DrainTimeout, what
	// finished is committed or acked, and Run returns nil. It runs once:
	// a second call, or a call after Close, returns ErrStopped. Broker
	// failures are retried (Connected says meanwhile that the consumer
	// is not connected); Run returns an error only for one that retrying
	// cannot fix before it ever consumed, such as ErrAccessRefused.
	Run(ctx context.Context) error
	// Close stops a running Run as if its context had ended and waits
	// for it to return. It is idempotent and returns nil.
	Close() error
	// Connected returns nil while the consumer has a live broker
	// session, and otherwise an error wrapping ErrNotConnected that says
	// why (the last connection error), for a readiness probe. It is safe
	// for concurrent use and does not block on the network.
	Connected() error
	// Backlog returns what waits at the broker for the consumer, ready
	// or set aside: the sum of BacklogParts.
	Backlog(ctx context.Context) (int64, error)
	// BacklogParts returns the same, in its two parts.
	BacklogParts(ctx context.Context) (Backlog, error)
}
