package kit_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/limiter"
)

const (
	tid         = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + tid + "-" + parentSpan + "-01"
)

// tracedProcessor returns a Processor that waits on a bucket with a keyed
// layer of 20 messages/s per recipient (burst 1) and traces into the
// returned recorder.
func tracedProcessor(t *testing.T, h consumer.Handler) (*kit.Processor, *tracetest.SpanRecorder) {
	t.Helper()
	b, err := limiter.NewLocal(1000, 100, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 20, Burst: 1, OnExceed: limiter.ActionWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	lim, err := consumer.NewLimiter(b, consumer.LimitOptions{Keys: func(m consumer.Message) (map[string]string, error) {
		return map[string]string{"per-recipient": m.Headers["to"]}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p, err := kit.NewProcessor(consumer.Options{Limiter: lim, TracerProvider: tp, Retry: fastRetry,
		Logger: slog.New(slog.DiscardHandler)}, h, kit.ConsumerGroup("senders"))
	if err != nil {
		t.Fatal(err)
	}
	return p, rec
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestSpanOfAMessage: a message with a traceparent gets one consumer span
// in that trace, under the publisher's span, with the messaging
// attributes; each attempt's limiter wait is a child span naming the
// layer that set the wait; the retry is an event; the handler's context
// carries the consumer span (for a sink's client span).
func TestSpanOfAMessage(t *testing.T) {
	var handlerTraces []trace.SpanContext
	p, rec := tracedProcessor(t, func(ctx context.Context, m consumer.Message) error {
		handlerTraces = append(handlerTraces, trace.SpanContextFromContext(ctx))
		if m.Attempt == 1 {
			return errors.New("503 Service Unavailable")
		}
		return nil
	})
	msg := consumer.Message{Body: []byte("hi"), Headers: map[string]string{"traceparent": traceparent, "to": "+15550100"},
		Source: consumer.Source{Broker: "kafka", Topic: "sms", Partition: 2, Offset: 7}}
	ctx, span := p.StartSpan(context.Background(), msg)
	out := p.Process(ctx, msg)
	span.End()
	if !out.Delivered() || out.Attempts != 2 {
		t.Fatalf("outcome %+v, want delivered at the second attempt", out)
	}

	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the consumer span and two waits", len(spans))
	}
	cs := spans[2]
	if cs.Name() != "process sms" || cs.SpanKind() != trace.SpanKindConsumer ||
		cs.SpanContext().TraceID().String() != tid || cs.Parent().SpanID().String() != parentSpan || !cs.Parent().IsRemote() {
		t.Fatalf("consumer span %q kind %v trace %s parent %s, want process sms, consumer, in trace %s under %s",
			cs.Name(), cs.SpanKind(), cs.SpanContext().TraceID(), cs.Parent().SpanID(), tid, parentSpan)
	}
	a := attrs(cs)
	for k, want := range map[attribute.Key]string{"messaging.system": "kafka", "messaging.destination.name": "sms",
		"messaging.consumer.group.name": "senders", "messaging.operation.type": "process", "messaging.destination.partition.id": "2"} {
		if got := a[k].Emit(); got != want {
			t.Errorf("attribute %s = %q, want %q", k, got, want)
		}
	}
	if a["messaging.kafka.offset"].AsInt64() != 7 {
		t.Errorf("offset %v", a["messaging.kafka.offset"])
	}
	for i, h := range handlerTraces {
		if h.SpanID() != cs.SpanContext().SpanID() {
			t.Errorf("attempt %d: the handler's context carries span %s, want the consumer span %s", i+1, h.SpanID(), cs.SpanContext().SpanID())
		}
	}
	layers := []string{"bucket", "per-recipient"} // the second attempt waits ~50 ms for the recipient's layer
	for i, w := range spans[:2] {
		if w.Name() != consumer.WaitSpanName || w.Parent().SpanID() != cs.SpanContext().SpanID() {
			t.Fatalf("span %d: %q under %s, want a wait under the consumer span", i, w.Name(), w.Parent().SpanID())
		}
		wa := attrs(w)
		if got := wa["throttle.wait.layer"].AsString(); got != layers[i] {
			t.Errorf("wait %d set by %q, want %q", i+1, got, layers[i])
		}
		if i == 1 && wa["throttle.wait.duration"].AsFloat64() < 0.02 {
			t.Errorf("the second wait is %vs, want about 0.05", wa["throttle.wait.duration"].AsFloat64())
		}
	}
	ev := cs.Events()
	if len(ev) != 1 || ev[0].Name != kit.EventRetry {
		t.Fatalf("events %v, want one retry", ev)
	}
}

// TestSpanOfADeadLetter: a dead letter is an event of the span, whose
// status is the error; a message without a traceparent starts a trace of
// its own, even when the context passed in carries a span.
func TestSpanOfADeadLetter(t *testing.T) {
	p, rec := tracedProcessor(t, func(context.Context, consumer.Message) error {
		return consumer.Permanent(errors.New("400 bad number"))
	})
	outer := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	msg := consumer.Message{Headers: map[string]string{"to": "+15550101", "traceparent": "garbage"},
		Source: consumer.Source{Broker: "rabbitmq", Queue: "sms", Exchange: "in", MessageID: "m-1", DeliveryTag: 3}}
	ctx, span := p.StartSpan(outer, msg)
	out := p.Process(ctx, msg)
	p.DeadLettered(ctx, msg, out, slog.String(kit.KeyDestination, "dlx"))
	span.End()

	spans := rec.Ended()
	cs := spans[len(spans)-1]
	if cs.Parent().IsValid() || cs.SpanContext().TraceID() == (trace.TraceID{1}) {
		t.Fatalf("consumer span's parent %v, want a new root", cs.Parent())
	}
	a := attrs(cs)
	if cs.Name() != "process sms" || a["messaging.message.id"].AsString() != "m-1" || a["messaging.destination.name"].AsString() != "in" ||
		a["messaging.consumer.group.name"].AsString() != "senders" {
		t.Fatalf("span %q attributes %v", cs.Name(), a)
	}
	ev := cs.Events()
	if len(ev) != 1 || ev[0].Name != kit.EventDeadLettered || cs.Status().Code != codes.Error || cs.Status().Description != "400 bad number" {
		t.Fatalf("events %v status %v, want dead-lettered with the error", ev, cs.Status())
	}
}

// TestNoTracerProvider: without a TracerProvider, StartSpan leaves the
// context alone and records nothing, and the handler sees no span.
func TestNoTracerProvider(t *testing.T) {
	var sc trace.SpanContext
	p, err := kit.NewProcessor(consumer.Options{}, func(ctx context.Context, _ consumer.Message) error {
		sc = trace.SpanContextFromContext(ctx)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := consumer.Message{Headers: map[string]string{"traceparent": traceparent}}
	ctx := context.Background()
	sctx, span := p.StartSpan(ctx, msg)
	if sctx != ctx || span.IsRecording() {
		t.Fatal("StartSpan without a TracerProvider changed the context or records")
	}
	p.Process(sctx, msg)
	span.End()
	if sc.IsValid() {
		t.Fatalf("the handler's context carries %v without tracing", sc)
	}
	if n := testing.AllocsPerRun(100, func() { _, s := p.StartSpan(ctx, msg); s.End() }); n != 0 {
		t.Fatalf("StartSpan without tracing allocates %v times", n)
	}
}

// BenchmarkProcessTracing is the per-message cost of tracing in the
// consumer's path: StartSpan, a limiter wait (a bucket out of reach) and
// the handler's call, off and at two sample ratios, with the SDK's batch
// processor in front of an exporter that discards. The messages carry no
// traceparent, as in the end-to-end benchmark.
//
//	go test -run '^$' -bench BenchmarkProcessTracing -benchmem ./consumer/internal/kit/
func BenchmarkProcessTracing(b *testing.B) {
	for _, c := range []struct {
		name  string
		ratio float64 // -1: off
	}{{"off", -1}, {"ratio=1", 1}, {"ratio=0.01", 0.01}} {
		b.Run(c.name, func(b *testing.B) {
			bucket, err := limiter.NewLocal(1e9, 1_000_000_000)
			if err != nil {
				b.Fatal(err)
			}
			defer bucket.Close()
			o := consumer.Options{Limiter: bucket, Logger: slog.New(slog.DiscardHandler)}
			if c.ratio >= 0 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
					sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.ratio))))
				defer func() { _ = tp.Shutdown(context.Background()) }()
				o.TracerProvider = tp
			}
			p, err := kit.NewProcessor(o, func(context.Context, consumer.Message) error { return nil }, kit.ConsumerGroup("g"))
			if err != nil {
				b.Fatal(err)
			}
			msg := consumer.Message{Body: []byte(`{"to":"+15550100"}`), Headers: map[string]string{"x-id": "1"},
				Source: consumer.Source{Broker: "kafka", Topic: "sms", Partition: 1, Offset: 42}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				sctx, span := p.StartSpan(ctx, msg)
				p.Process(sctx, msg)
				span.End()
			}
		})
	}
}
