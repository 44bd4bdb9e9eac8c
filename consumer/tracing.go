package consumer

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer/internal/grant"
	"github.com/throttlehq/throttle/limiter"
)

// TracerName is the instrumentation scope of the spans of this module's
// consumers (Options.TracerProvider): the consumer span of each message
// and its throttle wait spans.
const TracerName = "github.com/throttlehq/throttle/consumer"

// WaitSpanName is the name of the span of a limiter wait (see Throttle).
const WaitSpanName = "throttle wait"

// The attributes of the throttle wait span (docs/tracing.md).
const (
	attrCost        = attribute.Key("throttle.cost")
	attrWaitLayer   = attribute.Key("throttle.wait.layer")
	attrWaitSeconds = attribute.Key("throttle.wait.duration")
	attrLimitLayer  = attribute.Key("throttle.limit.layer")
	attrLimitAction = attribute.Key("throttle.limit.action")
)

// sharedLayer names the shared bucket where a layer's name goes, as the
// binary's metrics do: limiter.Grant.Layer is "" for it.
const sharedLayer = "bucket"

// waitSpan is the span of one limiter wait, or nil when the message's span
// does not record (no TracerProvider, or not sampled): then nothing is
// measured and Throttle waits exactly as without tracing.
type waitSpan struct {
	span  trace.Span
	start time.Time
}

// startWait starts the wait span under ctx's span, from the same provider,
// when that span records.
func startWait(ctx context.Context, cost int) *waitSpan {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil
	}
	_, span := parent.TracerProvider().Tracer(TracerName).Start(ctx, WaitSpanName, waitKind)
	span.SetAttributes(attrCost.Int(cost))
	return &waitSpan{span: span, start: time.Now()}
}

// waitKind is the start option of a wait span, made once.
var waitKind trace.SpanStartOption = trace.WithSpanKind(trace.SpanKindInternal)

// wait waits on l for cost tokens as Throttle does, on a context that
// asks the limiter how the wait was granted (consumer/internal/grant):
// NewLimiter's limiter and a *limiter.Bucket say it, also through a
// wrapper of a backend (consumer/kafka's) that passes the context on.
func (w *waitSpan) wait(ctx context.Context, l Limiter, msg Message, cost int) (release func(), err error) {
	gctx, rec := grant.With(ctx)
	switch lim := l.(type) {
	case SlotLimiter:
		release, err = lim.AcquireMessage(gctx, msg, cost)
	case MessageLimiter:
		err = lim.WaitMessage(gctx, msg, cost)
	default:
		err = grant.Wait(gctx, l, cost)
	}
	w.end(rec.Grant, rec.Set, err)
	return release, err
}

// end records how the wait ended and ends the span: the wait and the layer
// that set it, or the layer that refused the message, or the error.
func (w *waitSpan) end(g limiter.Grant, known bool, err error) {
	span := w.span
	var le *limiter.LimitError
	switch {
	case err == nil:
		waited := time.Since(w.start)
		if known {
			waited = g.Waited
			layer := g.Layer
			if layer == "" {
				layer = sharedLayer
			}
			span.SetAttributes(attrWaitLayer.String(layer))
		}
		span.SetAttributes(attrWaitSeconds.Float64(waited.Seconds()))
	case errors.As(err, &le):
		span.SetAttributes(attrLimitLayer.String(le.Layer), attrLimitAction.String(string(le.Action)))
		if le.Action == limiter.ActionDelay && !errors.Is(err, limiter.ErrCostExceedsBurst) {
			// Set aside, not failed: the consumer span says for how long.
			break
		}
		span.SetStatus(codes.Error, err.Error())
	default:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
