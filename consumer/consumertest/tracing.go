package consumertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// testTracing: with Options.TracerProvider, each message published with a
// traceparent gets one consumer span in that trace, under the publisher's
// span, named "process ..." with messaging.system the message's broker;
// its limiter wait is a child span naming the layer that set the wait
// (the shared bucket here); the handler's context carries the
// consumer span; a dead letter is an event of the span, whose status is
// the error. (The recording provider is the SDK's, in this test package
// only: the consumer itself needs the API alone.)
func testTracing(t *testing.T, src Source) {
	const n = 3 // message 1 is dead-lettered
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	lim, err := limiter.NewLocal(1000, 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	var obs observed
	var mu sync.Mutex
	handled := map[string]trace.SpanContext{}
	brokers := map[string]string{}
	c := src.NewConsumer(t, consumer.Options{Limiter: lim, TracerProvider: tp, Retry: fastRetry, Observer: obs.observer()},
		func(ctx context.Context, m consumer.Message) error {
			mu.Lock()
			handled[idOf(m)] = trace.SpanContextFromContext(ctx)
			brokers[idOf(m)] = m.Source.Broker
			mu.Unlock()
			if idOf(m) == "tr-001" {
				return consumer.Permanent(errors.New("400 bad number"))
			}
			return nil
		})
	in := msgs("tr", n, 1)
	parents := map[string]trace.SpanContext{}
	for i := range in {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{0xab, byte(i + 1)}, SpanID: trace.SpanID{0xcd, byte(i + 1)}, TraceFlags: trace.FlagsSampled})
		in[i].Headers["traceparent"] = fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
		parents[idOf(in[i])] = sc
	}
	src.Publish(t, in...)
	start(t, c)
	testenv.Eventually(t, timeout, "every message delivered or dead-lettered", func() bool {
		return obs.get(&obs.delivered) == n-1 && obs.get(&obs.dead) == 1
	})
	consumerSpans := func() map[trace.TraceID]sdktrace.ReadOnlySpan {
		out := map[trace.TraceID]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				out[s.SpanContext().TraceID()] = s
			}
		}
		return out
	}
	testenv.Eventually(t, timeout, "a consumer span per message", func() bool { return len(consumerSpans()) >= n })
	spans := consumerSpans()
	ended := rec.Ended()
	mu.Lock()
	defer mu.Unlock()
	for _, m := range in {
		id := idOf(m)
		parent := parents[id]
		cs := spans[parent.TraceID()]
		if cs == nil {
			t.Errorf("%s: no consumer span in its trace %s", id, parent.TraceID())
			continue
		}
		if cs.Parent().SpanID() != parent.SpanID() || !cs.Parent().IsRemote() || !strings.HasPrefix(cs.Name(), "process ") {
			t.Errorf("%s: span %q under %s, want process ... under the publisher's %s", id, cs.Name(), cs.Parent().SpanID(), parent.SpanID())
		}
		system := ""
		for _, kv := range cs.Attributes() {
			if kv.Key == "messaging.system" {
				system = kv.Value.AsString()
			}
		}
		if system == "" || system != brokers[id] {
			t.Errorf("%s: messaging.system %q, want %q", id, system, brokers[id])
		}
		if h := handled[id]; h.SpanID() != cs.SpanContext().SpanID() {
			t.Errorf("%s: the handler's context carries span %s, want the consumer span %s", id, h.SpanID(), cs.SpanContext().SpanID())
		}
		waits := 0
		for _, s := range ended {
			if s.Name() == consumer.WaitSpanName && s.Parent().SpanID() == cs.SpanContext().SpanID() {
				waits++
				// The layer that set the wait: the shared bucket, even
				// through a backend's own wrapper of the limiter.
				layer := ""
				for _, kv := range s.Attributes() {
					if kv.Key == "throttle.wait.layer" {
						layer = kv.Value.AsString()
					}
				}
				if layer != "bucket" {
					t.Errorf("%s: the wait span's throttle.wait.layer %q, want bucket", id, layer)
				}
			}
		}
		if waits != 1 {
			t.Errorf("%s: %d wait spans under the consumer span, want 1", id, waits)
		}
		var events []string
		for _, e := range cs.Events() {
			events = append(events, e.Name)
		}
		if want := map[bool]string{true: "dead-lettered", false: ""}[id == "tr-001"]; strings.Join(events, ",") != want ||
			(want != "") != (cs.Status().Code.String() == "Error") {
			t.Errorf("%s: events %v, status %v; want %q", id, events, cs.Status(), want)
		}
	}
}
