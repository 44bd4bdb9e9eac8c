package kit

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
)

// The events of a consumer span (consumer.Options.TracerProvider),
// named alike for every backend.
const (
	// EventRetry: a failed attempt is retried, with throttle.attempt,
	// throttle.retry.delay (seconds) and exception.message.
	EventRetry = "retry"
	// EventDeadLettered: the message was handed to the dead-letter
	// destination, with throttle.attempts, exception.message and
	// throttle.destination; the span's status is an error.
	EventDeadLettered = "dead-lettered"
	// EventSetAside: the message was set aside, with
	// throttle.set_aside.delay (seconds), throttle.set_aside.due and
	// throttle.destination.
	EventSetAside = "set aside"
	// EventAbandoned: the message was left for redelivery (the drain
	// deadline, a lost session, a closed limiter), with throttle.attempts.
	EventAbandoned = "abandoned"
)

var (
	attrAttempt     = attribute.Key("throttle.attempt")
	attrAttempts    = attribute.Key("throttle.attempts")
	attrRetryDelay  = attribute.Key("throttle.retry.delay")
	attrDestination = attribute.Key("throttle.destination")
	attrSetAside    = attribute.Key("throttle.set_aside.delay")
	attrDue         = attribute.Key("throttle.set_aside.due")
	attrException   = attribute.Key("exception.message")
)

// traceContext is the W3C Trace Context propagator: traceparent and
// tracestate.
var traceContext propagation.TraceContext

// ConsumerGroup tells the Processor the consumer group of its backend's
// spans (messaging.consumer.group.name): the Kafka group; for RabbitMQ,
// whose consumers share a queue, the queue.
func ConsumerGroup(name string) ProcessorOption { return func(p *Processor) { p.group = name } }

// StartSpan starts msg's consumer span when Options.TracerProvider is
// set, and returns ctx carrying it, for Process, and the span, which the
// backend ends once the message is settled (committed or acked, dead-
// lettered, set aside, or left for redelivery). The span continues the W3C
// traceparent and tracestate of msg's headers; without a valid one it is
// the root of a new trace (never a child of a span ctx may carry). It is
// named "process <destination>" (the Kafka topic, the RabbitMQ queue) and
// has the messaging semantic conventions' attributes. Without a
// TracerProvider it returns ctx and a span that does nothing, at no cost.
func (p *Processor) StartSpan(ctx context.Context, msg consumer.Message) (context.Context, trace.Span) {
	if p.tracer == nil {
		return ctx, noSpan
	}
	opts := newRoot
	if _, ok := msg.Headers[traceparentHeader]; ok {
		remote := trace.SpanContextFromContext(traceContext.Extract(context.Background(), propagation.MapCarrier(msg.Headers)))
		if remote.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, remote)
			opts = childOf
		}
	}
	dest := msg.Source.Topic
	if msg.Source.Broker != "kafka" {
		dest = msg.Source.Queue
	}
	// The attributes are set once the sampler decided, and only on a span
	// that records: an unsampled message costs none. (The SDK's samplers
	// do not read them.)
	ctx, span := p.tracer.Start(ctx, p.spanName(dest), opts...)
	if !span.IsRecording() {
		return ctx, span
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		semconv.MessagingSystemKey.String(msg.Source.Broker),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingMessageBodySize(len(msg.Body)),
	)
	if p.group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(p.group))
	}
	if msg.Source.Broker == "kafka" {
		attrs = append(attrs,
			semconv.MessagingDestinationName(msg.Source.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(msg.Source.Partition)),
			semconv.MessagingKafkaOffset(int(msg.Source.Offset)))
	} else {
		// RabbitMQ: the destination is the exchange ("" for the default
		// one); the span is named by the queue it was consumed from.
		attrs = append(attrs,
			semconv.MessagingDestinationName(msg.Source.Exchange),
			semconv.MessagingDestinationSubscriptionName(msg.Source.Queue),
			semconv.MessagingRabbitMQMessageDeliveryTag(int(msg.Source.DeliveryTag)))
		if len(msg.Key) > 0 {
			attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(string(msg.Key)))
		}
	}
	if msg.Source.MessageID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(msg.Source.MessageID))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// The start options of a consumer span, made once.
var (
	newRoot = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot()}
	childOf = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
)

// traceparentHeader is the W3C header a message's trace comes in.
const traceparentHeader = "traceparent"

// spanName returns "process "+dest, made once per destination.
func (p *Processor) spanName(dest string) string {
	if name, ok := p.spanNames.Load(dest); ok {
		return name.(string)
	}
	name := "process " + dest
	p.spanNames.Store(dest, name)
	return name
}

// noSpan is the span of a message without tracing.
var noSpan = trace.SpanFromContext(context.Background())

// spanRetried records a retry on ctx's span.
func spanRetried(ctx context.Context, attempt int, err error, delay time.Duration) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventRetry, trace.WithAttributes(attrAttempt.Int(attempt),
		attrRetryDelay.Float64(delay.Seconds()), attrException.String(err.Error())))
}

// SpanAbandoned records on ctx's span (StartSpan's) that the message is
// left for redelivery after attempts handler calls: Process records it for
// the outcomes it abandons, the backend for the writes it abandons (a dead
// letter, a copy set aside).
func SpanAbandoned(ctx context.Context, attempts int) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventAbandoned, trace.WithAttributes(attrAttempts.Int(attempts)))
}

// spanDeadLettered records the dead letter on ctx's span, and its error as
// the span's status.
func spanDeadLettered(ctx context.Context, o Outcome, dest string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attrAttempts.Int(o.Attempts)}
	if dest != "" {
		attrs = append(attrs, attrDestination.String(dest))
	}
	msg := "dead-lettered"
	if o.Err != nil {
		msg = o.Err.Error()
		attrs = append(attrs, attrException.String(msg), semconv.ErrorTypeKey.String(errorType(o.Err)))
	}
	span.AddEvent(EventDeadLettered, trace.WithAttributes(attrs...))
	span.SetStatus(codes.Error, msg)
}

// spanSetAside records on ctx's span that the message was set aside.
func spanSetAside(ctx context.Context, d time.Duration, due time.Time, dest string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attrSetAside.Float64(d.Seconds()), attrDue.String(due.UTC().Format(time.RFC3339Nano))}
	if dest != "" {
		attrs = append(attrs, attrDestination.String(dest))
	}
	span.AddEvent(EventSetAside, trace.WithAttributes(attrs...))
}

// errorType is the error.type of a dead letter: "permanent" or "retryable"
// (out of attempts).
func errorType(err error) string {
	if consumer.IsPermanent(err) {
		return "permanent"
	}
	return "retryable"
}
