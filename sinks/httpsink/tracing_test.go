package httpsink_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// TestSendCarriesTheTrace: a Send under a span that records is a client
// span under it, and the provider receives that span's traceparent; a
// Send under a span that is not sampled still sends the trace on
// (flags 00) and records nothing; without a span no traceparent is sent.
// The sink's shared headers stay as configured.
func TestSendCarriesTheTrace(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	s := newSink(t, httpsink.Config{URL: srv.URL + "/send?token=secret", Headers: map[string]string{"X-Api": "k"}})

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, parent := tp.Tracer("test").Start(context.Background(), "process sms")
	if err := s.Send(ctx, consumer.Message{Body: []byte("{}")}); err == nil {
		t.Fatal("a 503 was delivered")
	}
	parent.End()

	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{7}, SpanID: trace.SpanID{7}}))
	_ = s.Send(unsampled, consumer.Message{Body: []byte("{}")})
	_ = s.Send(context.Background(), consumer.Message{Body: []byte("{}")})

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the client span and its parent", len(spans))
	}
	cs := spans[0]
	if cs.Name() != "POST" || cs.SpanKind() != trace.SpanKindClient || cs.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("client span %q kind %v parent %v", cs.Name(), cs.SpanKind(), cs.Parent().SpanID())
	}
	a := attrs(cs)
	if a["http.request.method"].AsString() != "POST" || a["http.response.status_code"].AsInt64() != 503 ||
		a["server.address"].AsString() != "127.0.0.1" || a["error.type"].AsString() != "503" || cs.Status().Code.String() != "Error" {
		t.Fatalf("client span attributes %v status %v", a, cs.Status())
	}
	for k, v := range a {
		if strings.Contains(v.Emit(), "secret") {
			t.Fatalf("attribute %s holds the URL's query: %s", k, v.Emit())
		}
	}
	want := []string{
		"00-" + cs.SpanContext().TraceID().String() + "-" + cs.SpanContext().SpanID().String() + "-01",
		"00-07000000000000000000000000000000-0700000000000000-00",
		"",
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: traceparent %q, want %q", i+1, got[i], want[i])
		}
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value
	}
	return m
}
