package consumer

import "time"

// RetryPolicy decides how often and how long apart a failed handler is
// retried (Options.Retry): each delay is the backoff of the attempt, with
// equal jitter (between half and all of it) so that replicas that failed
// together do not retry together, and at least what the error asked for
// with RetryAfter. The zero value uses the documented defaults. A
// RetryPolicy is a plain value and safe for concurrent use.
type RetryPolicy struct {
	// MaxAttempts is the number of handler calls before a message is
	// dead-lettered, counting the first. Default DefaultMaxAttempts (5);
	// 1 disables retries.
	MaxAttempts int
	// Backoff is the delay before the second attempt. It doubles with each
	// further attempt. Default 200ms.
	Backoff time.Duration
	// MaxBackoff caps the delay; set with Backoff, it must not be below
	// it (Options.Validate). Default 30s, or Backoff when that is longer.
	MaxBackoff time.Duration
}

// DefaultMaxAttempts is RetryPolicy.MaxAttempts when none is given.
const DefaultMaxAttempts = 5

// Header names that the consumers add to a dead-lettered message, the same
// for every backend: why it was dead-lettered. Each backend adds the
// message's original position too (consumer/kafka's HeaderOriginalTopic,
// consumer/rabbitmq's HeaderOriginalQueue, and their siblings), and an
// error that has, or wraps an error that has, a method DeadLetterHeaders()
// map[string]string adds those headers (a sink's "recipient gone", a
// layer's refusal: HeaderLimit); the consumer's own take precedence.
const (
	// HeaderError is the last handler error's text.
	HeaderError = "x-throttle-error"
	// HeaderAttempts is the number of handler calls made.
	HeaderAttempts = "x-throttle-attempts"
)
