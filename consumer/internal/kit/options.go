package kit

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// The defaults of consumer.Options that a backend also needs by name.
const (
	// DefaultDrainTimeout is the default of Options.DrainTimeout.
	DefaultDrainTimeout = 30 * time.Second
	// DefaultMaxSetAside is the default of Options.MaxSetAside.
	DefaultMaxSetAside = time.Minute
)

// WithDefaults validates o (consumer.Options.Validate) and returns it with
// every default its field docs name filled in: OrderingKey only under
// consumer.OrderKey, Priority from a Limiter made by consumer.NewLimiter.
// Its errors wrap consumer.ErrInvalidConfig and the *consumer.FieldError of
// each problem. It is idempotent. Backends call it from their
// constructors (NewProcessor does).
func WithDefaults(o consumer.Options) (consumer.Options, error) {
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("%w: %w", consumer.ErrInvalidConfig, err)
	}
	if o.Ordering == "" {
		o.Ordering = consumer.OrderPartition
	}
	if o.OrderingKey == nil && o.Ordering == consumer.OrderKey {
		o.OrderingKey = keyOf
	}
	if o.Priority == nil {
		// NewLimiter's limiter says the classes it waits in, so that the
		// consumer orders its messages by the same ones.
		if pl, ok := o.Limiter.(interface{ MessagePriority() consumer.PriorityFunc }); ok {
			o.Priority = pl.MessagePriority()
		}
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.MaxSetAside == 0 {
		o.MaxSetAside = DefaultMaxSetAside
	}
	o.Retry = retryDefaults(o.Retry)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// retryDefaults returns p with the defaults that consumer.RetryPolicy's
// field docs name.
func retryDefaults(p consumer.RetryPolicy) consumer.RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = consumer.DefaultMaxAttempts
	}
	if p.Backoff <= 0 {
		p.Backoff = 200 * time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = 30 * time.Second
	}
	if p.MaxBackoff < p.Backoff {
		p.MaxBackoff = p.Backoff
	}
	return p
}

// keyOf is the default ordering key: the message's Key.
func keyOf(m consumer.Message) (string, error) { return string(m.Key), nil }

// middleware returns the Throttle, dedupe and PushBack middleware that o
// asks for, in that order: a message is claimed once the limiter granted
// it, right before its send.
func middleware(o consumer.Options, d *deduper) []consumer.Middleware {
	var mw []consumer.Middleware
	if o.Limiter != nil {
		mw = append(mw, consumer.Throttle(o.Limiter, o.Cost))
	}
	if d != nil {
		mw = append(mw, d.middleware)
	}
	if o.Pauser != nil {
		mw = append(mw, consumer.PushBack(o.Pauser))
	}
	return mw
}
