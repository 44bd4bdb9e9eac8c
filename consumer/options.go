package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Options are the settings that every backend shares. Each backend's Config
// embeds them and adds only what is its own (brokers, queue, prefetch...),
// so that the same field means the same thing for Kafka and RabbitMQ. The
// zero value of every field uses the documented default. Options is a plain
// value, safe to copy.
type Options struct {
	// Limiter, when set, is waited on for each message's cost before every
	// handler attempt (Throttle), so retries are throttled like first
	// attempts. Default: no throttling. Close the limiter only after Run
	// returned: a wait on a closed limiter abandons the message for
	// redelivery.
	Limiter Limiter
	// Cost gives a message's cost in tokens. Default: one token for every
	// message. It requires Limiter.
	Cost CostFunc
	// Pauser, when set, is paused for every replica when a handler returns
	// an error made with RetryAfter (PushBack), for the delay the error
	// carries: the Pauser caps it (a *limiter.Bucket at its
	// limiter.Options.MaxPause). It is usually the same bucket as
	// Limiter.
	Pauser Pauser
	// Concurrency is the most messages handled at once: the handler, with
	// the limiter wait before each attempt, runs in up to Concurrency
	// goroutines. Ordering may keep fewer busy: OrderPartition handles the
	// messages of a Kafka partition one at a time, so at most one per
	// partition owned; OrderKey those of a key. A backend also bounds what
	// it holds beyond that (consumer/kafka's QueueSize,
	// consumer/rabbitmq's Prefetch). Default: the backend's
	// (consumer/kafka: 1 under OrderPartition, else 1000;
	// consumer/rabbitmq: its Prefetch).
	Concurrency int
	// SetAside, when true, makes the backend set aside the messages whose
	// handler asks for it (SetAside, as a layer with on_exceed delay does
	// through Throttle) in its delay topic or queues, then commit or ack
	// them: the handler is free meanwhile, and the copy comes back when it
	// is due (HeaderDue), to be throttled and handled again. It costs a
	// destination of its own: consumer/kafka's delay topic, which Run
	// creates and the group consumes; consumer/rabbitmq's delay queues,
	// declared each time Run connects. Default false: the handler
	// waits out the delay itself, holding its slot, and is called again.
	SetAside bool
	// MaxSetAside caps how long a message stays in a backend's delay
	// topic or queue at a time (see SetAside). Both deliver a message only
	// after the ones set aside before it in the same partition or queue,
	// so this is also the longest that one message set aside far ahead
	// (a delay layer's slot booked behind a hot key's backlog) holds up
	// the others. A message whose booked slot is further ahead is
	// set aside again when it comes back, as often as needed: a slot d
	// ahead costs about d/MaxSetAside + 1 writes. Default 1m.
	MaxSetAside time.Duration
	// Retry is the retry policy for failed handlers. The zero value uses
	// RetryPolicy's defaults.
	Retry RetryPolicy
	// DrainTimeout bounds how long in-flight handlers may run after Run's
	// context ends or Close is called; then their context is cancelled and
	// their messages are left for redelivery. Default 30s.
	DrainTimeout time.Duration
	// Ordering says which messages are handled in order. Default
	// OrderPartition. See Ordering for what each value means per backend.
	Ordering Ordering
	// OrderingKey gives a message's key for OrderKey. Default: the
	// Message's Key (the Kafka message key, the AMQP routing key). A key
	// function that fails makes the message fail permanently: it is
	// dead-lettered with that error. Setting it requires OrderKey.
	OrderingKey KeyFunc
	// Priority gives each message's class (limiter.Priority: high, normal
	// or low), for the order in which the backend starts the messages it
	// holds: a message of a higher class goes ahead of those of lower
	// classes waiting for a handler, as far as Ordering allows, and the
	// lower classes leave a few handler slots free for the higher ones
	// (see Ordering for what each ordering allows). It orders the
	// consumer only; the limiter needs the same class. An error counts as
	// the class returned with it; the limiter decides what the message's
	// class error means. Default: the LimitOptions.Priority of a Limiter
	// made by NewLimiter, so that the class is set once; else nil: one
	// class, the broker's order.
	Priority PriorityFunc
	// Dedupe, when set, keeps a message whose key was already sent from
	// being sent again: a copy published twice, or one redelivered after
	// a replica died between the send and the commit (see Dedupe).
	// Default: none, every delivery is handled.
	Dedupe *Dedupe
	// Observer receives message and connection events, for metrics.
	// Default: none.
	Observer *MessageObserver
	// TracerProvider, when set, traces each message (docs/tracing.md): a
	// consumer span "process <topic or queue>" per message, with the
	// messaging semantic conventions' attributes, that continues the W3C
	// traceparent (and tracestate) of the message's headers, or starts a
	// trace without one; under it a "throttle wait" span for each limiter
	// wait (Throttle), with the layer that set the wait; the handler's
	// context carries the span, so that a sink's client span and the
	// traceparent it sends on belong to the message's trace; retries,
	// dead letters, set-asides and abandonments are events of the consumer
	// span. The span ends when the message is settled. Sampling is the
	// provider's. Default nil: no spans, and nothing is read from the
	// headers.
	TracerProvider trace.TracerProvider
	// Logger receives connection events, dead-letters, and the rate-bounded
	// summary of handler failures: while a sink fails, at most one "sink
	// failing: 503 ×120 in the last 10s, retrying" line per 10s, then one
	// "sink recovered after 40s" line. Message bodies are never logged.
	// Default slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig is wrapped by every error that rejects a
// configuration: those of a backend's New (with a *FieldError naming each
// field at fault, read them with FieldErrors) and of NewLimiter.
// Retrying cannot help.
var ErrInvalidConfig = errors.New("invalid consumer config")

// Validate returns nil or every problem of o, each a *FieldError naming
// the Go field at fault ("DrainTimeout", "Retry.MaxAttempts"), joined with
// errors.Join (read them with FieldErrors).
func (o Options) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if o.Cost != nil && o.Limiter == nil {
		bad("Cost", "is set but Limiter is nil")
	}
	if err := keyedLayerError(o.Limiter); err != nil {
		bad("Limiter", "%w", err)
	}
	if o.Concurrency < 0 {
		bad("Concurrency", "%d must not be negative", o.Concurrency)
	}
	if o.DrainTimeout < 0 {
		bad("DrainTimeout", "%v must not be negative", o.DrainTimeout)
	}
	if o.MaxSetAside < 0 {
		bad("MaxSetAside", "%v must not be negative", o.MaxSetAside)
	}
	if o.Retry.MaxAttempts < 0 {
		bad("Retry.MaxAttempts", "%d must not be negative", o.Retry.MaxAttempts)
	}
	if o.Retry.Backoff < 0 {
		bad("Retry.Backoff", "%v must not be negative", o.Retry.Backoff)
	}
	if o.Retry.MaxBackoff < 0 {
		bad("Retry.MaxBackoff", "%v must not be negative", o.Retry.MaxBackoff)
	} else if o.Retry.MaxBackoff > 0 && o.Retry.MaxBackoff < o.Retry.Backoff {
		bad("Retry.MaxBackoff", "%v must not be below the backoff, %v", o.Retry.MaxBackoff, o.Retry.Backoff)
	}
	if err := o.Ordering.validate(); err != nil {
		bad("Ordering", "%w", err)
	} else if o.OrderingKey != nil && o.Ordering != OrderKey {
		bad("OrderingKey", "requires ordering %q, got %q", OrderKey, o.Ordering)
	}
	if o.Dedupe != nil {
		errs = append(errs, o.Dedupe.validate()...)
	}
	return errors.Join(errs...)
}
