package kit

import (
	"context"
	"log/slog"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// The log messages that every backend writes for the same events, so that
// an operator's alert or query matches them on any broker. Each line also
// carries the backend's "broker" and the message's position in it (Kafka:
// topic, partition, offset; RabbitMQ: message_id, delivery_tag,
// redelivered). The connection events' lines are consumer/internal/
// connstate's; "message dead-lettered" and "message set aside" are
// Processor's (DeadLettered, ReportSetAside).
const (
	// LogWriteRetry, at warn level, with KeyDestination, attempt,
	// retry_in and err: the broker did not take a dead letter or a copy
	// set aside; the write is retried with backoff.
	LogWriteRetry = "write failed; retrying"
	// LogWriteAbandoned, at warn level, with KeyDestination and err: the
	// write of a dead letter or a copy set aside gave up, at the drain
	// deadline or with its session; the message is not committed or
	// acked, and the broker delivers it again.
	LogWriteAbandoned = "write abandoned; the message will be redelivered"
	// LogAbandoned, at warn level, with attempts and err: a message whose
	// handling did not finish (the drain deadline, a lost session, a
	// closed limiter) is left for redelivery.
	LogAbandoned = "message abandoned; it will be redelivered"
	// LogDrainTimeout, at warn level, with in_flight (when the backend
	// counts them) and drain_timeout: the handlers still running at the
	// drain deadline get a cancelled context, and their messages are
	// delivered again.
	LogDrainTimeout = "drain timeout reached; cancelling the handlers still running, their messages will be redelivered"
	// LogNoDelayDestination, at warn level, with KeyDestination and err:
	// the delay topic or queues cannot be used, and a message set aside
	// waits out its delay in its handler instead.
	LogNoDelayDestination = "the delay destination cannot be used; messages set aside wait out their delay in the handler"
	// LogStopped, at info level: Run drained and is returning.
	LogStopped = "consumer stopped"

	// KeyDestination names the topic, exchange or queue that a message
	// was written to: the dead-letter destination, or the delay
	// destination of a message set aside.
	KeyDestination = "destination"
)

// ReportSetAside reports a message that the backend set aside for d, due
// at due: it calls MessageObserver.SetAside, records the event on ctx's
// span (StartSpan's), and logs "message set aside" at debug level with
// delay, due and attrs, the backend's position of the message and its
// KeyDestination.
func (p *Processor) ReportSetAside(ctx context.Context, msg consumer.Message, d time.Duration, due time.Time, attrs ...slog.Attr) {
	ObserveSetAside(p.opts.Observer, msg, d)
	spanSetAside(ctx, d, due, destination(attrs))
	attrs = append(attrs, slog.String("delay", d.String()), slog.Time("due", due))
	p.opts.Logger.LogAttrs(context.Background(), slog.LevelDebug, "message set aside", attrs...)
}
