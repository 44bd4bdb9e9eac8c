// Package sinktrace is the client span of a sink's Send, one
// implementation for every sink of this module: a Send whose context
// carries a span that records (a consumer's, see
// consumer.Options.TracerProvider) is a child span of kind client, from
// the same provider, named and described by the sink. Without such a span
// it does nothing, at no cost.
package sinktrace

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
)

// TracerName is the instrumentation scope of the sinks' spans.
const TracerName = "github.com/throttlehq/throttle/sinks"

// Start starts the client span of one Send under ctx's span when that span
// records, and returns ctx carrying it and the span; otherwise ctx and nil.
// attrs is called only for a span that records.
func Start(ctx context.Context, name string, attrs func() []attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	ctx, span := parent.TracerProvider().Tracer(TracerName).Start(ctx, name, clientKind)
	if attrs != nil {
		span.SetAttributes(attrs()...)
	}
	return ctx, span
}

// clientKind is the start option of a sink's span, made once.
var clientKind trace.SpanStartOption = trace.WithSpanKind(trace.SpanKindClient)

// End ends span, which may be nil, with Send's error: a failed Send sets
// the span's status to an error, with error.type "permanent" or
// "retryable" (consumer.IsPermanent) unless the sink set one.
func End(span trace.Span, err error, attrs ...attribute.KeyValue) {
	if span == nil {
		return
	}
	if err != nil {
		kind := "retryable"
		if consumer.IsPermanent(err) {
			kind = "permanent"
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(kind))
		span.SetStatus(codes.Error, err.Error())
	}
	span.SetAttributes(attrs...)
	span.End()
}
