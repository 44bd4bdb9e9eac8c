package integration

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/throttlehq/throttle/internal/testenv"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes each export
// request (protobuf) and keeps its spans. It is safe for concurrent use.
type otlpReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	spans    []*tracepb.Span
	requests int
	service  string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if req.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, "not a trace export", http.StatusNotFound)
			return
		}
		var export coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.requests++
		for _, rs := range export.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					r.service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// named returns the spans received so far with that name.
func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			v := a.GetValue()
			switch {
			case v.GetStringValue() != "":
				return v.GetStringValue()
			case v.GetIntValue() != 0:
				return fmt.Sprint(v.GetIntValue())
			case v.GetDoubleValue() != 0:
				return fmt.Sprint(v.GetDoubleValue())
			}
			return ""
		}
	}
	return ""
}

// TestTracingEndToEndRabbitMQ runs the binary with tracing on against an
// OTLP/HTTP receiver: each message published with a traceparent gets one
// consumer span in that trace, under the publisher's span, with the wait
// span and the sink's client span under it; the provider receives the
// client span's traceparent, so the same trace ID; a retry and a dead
// letter are events of their message's span.
func TestTracingEndToEndRabbitMQ(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	recv := newOTLPReceiver(t)

	// The provider: message 4 is refused (400, dead-lettered), message 5
	// fails once (503, retried); it records the traceparent of each.
	var mu sync.Mutex
	received := map[int]string{}
	failed5 := false
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ ID int }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		received[body.ID] = r.Header.Get("traceparent")
		switch {
		case body.ID == 4:
			http.Error(w, "invalid number", http.StatusBadRequest)
		case body.ID == 5 && !failed5:
			failed5 = true
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(provider.Close)

	cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit: {bucket: %s, rate: 50, burst: 1}
source: {rabbitmq: {url: %q, queue: %s, prefetch: 10, declare: true}}
sink: {http: {url: %q, timeout: 5s}}
delivery: {max_attempts: 3, backoff: 20ms, max_backoff: 100ms, drain_timeout: 5s}
metrics: {listen: "off"}
tracing: {enabled: true, sample_ratio: 0}
`, redisAddr, name, amqpURL, name, provider.URL)
	path := filepath.Join(t.TempDir(), "throttle.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// sample_ratio 0: only the messages whose traceparent is sampled are
	// traced, so the spans received are this test's.
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_TRACES_SAMPLER=", "OTEL_EXPORTER_OTLP_PROTOCOL=", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=", "OTEL_SDK_DISABLED="}
	proc := cliStartEnv(t, bin, env, "run", "--config", path)
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	cliWait(t, 20*time.Second, "the consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })

	const n = 6
	traces := make([]string, n+1)
	parents := make([]string, n+1)
	ctx := testenv.Context(t, 10*time.Second)
	for i := range n + 1 {
		pub := amqp.Publishing{ContentType: "application/json", Body: fmt.Appendf(nil, `{"id":%d}`, i), MessageId: fmt.Sprintf("m%d", i)}
		if i < n { // message n has no traceparent: not sampled at ratio 0
			traces[i] = fmt.Sprintf("%032x", 0xabc000+i)
			parents[i] = fmt.Sprintf("%016x", 0xdef000+i)
			pub.Headers = amqp.Table{"traceparent": "00-" + traces[i] + "-" + parents[i] + "-01"}
		}
		if err := ch.PublishWithContext(ctx, "", name, false, false, pub); err != nil {
			t.Fatal(err)
		}
	}
	cliWait(t, 30*time.Second, "every message at the provider", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(received) == n+1
	})
	process := "process " + name
	cliWait(t, 30*time.Second, fmt.Sprintf("%d consumer spans", n), func() bool { return len(recv.named(process)) >= n })
	cliWait(t, 10*time.Second, "the client spans", func() bool { return len(recv.named("POST")) >= n+1 }) // 5 retried once

	byTrace := map[string]*tracepb.Span{}
	for _, s := range recv.named(process) {
		tid := hex.EncodeToString(s.TraceId)
		if byTrace[tid] != nil {
			t.Errorf("two consumer spans in trace %s", tid)
		}
		byTrace[tid] = s
	}
	if len(byTrace) != n {
		t.Fatalf("%d consumer spans, want %d (one per traced message)", len(byTrace), n)
	}
	waits, clients := recv.named("throttle wait"), recv.named("POST")
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		cs := byTrace[traces[i]]
		if cs == nil {
			t.Fatalf("message %d: no consumer span in its trace %s", i, traces[i])
		}
		if hex.EncodeToString(cs.ParentSpanId) != parents[i] || cs.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Errorf("message %d: consumer span under %x, kind %v; want under the publisher's %s", i, cs.ParentSpanId, cs.Kind, parents[i])
		}
		for k, want := range map[string]string{"messaging.system": "rabbitmq", "messaging.operation.type": "process",
			"messaging.consumer.group.name": name, "messaging.destination.subscription.name": name, "messaging.message.id": fmt.Sprintf("m%d", i)} {
			if got := spanAttr(cs, k); got != want {
				t.Errorf("message %d: %s = %q, want %q", i, k, got, want)
			}
		}
		under := func(spans []*tracepb.Span) []*tracepb.Span {
			var out []*tracepb.Span
			for _, s := range spans {
				if bytes.Equal(s.ParentSpanId, cs.SpanId) && bytes.Equal(s.TraceId, cs.TraceId) {
					out = append(out, s)
				}
			}
			return out
		}
		attempts := 1
		if i == 5 {
			attempts = 2
		}
		ws, cl := under(waits), under(clients)
		if len(ws) != attempts || len(cl) != attempts {
			t.Errorf("message %d: %d wait spans and %d client spans under its consumer span, want %d each", i, len(ws), len(cl), attempts)
			continue
		}
		if spanAttr(ws[0], "throttle.wait.layer") != "bucket" {
			t.Errorf("message %d: the wait's layer %q, want bucket", i, spanAttr(ws[0], "throttle.wait.layer"))
		}
		last := cl[len(cl)-1]
		if i != 5 { // 5's last request is its second: compare with any of them
			want := "00-" + traces[i] + "-" + hex.EncodeToString(last.SpanId) + "-01"
			if received[i] != want {
				t.Errorf("message %d: the provider got traceparent %q, want %q (the client span's)", i, received[i], want)
			}
		} else if !strings.HasPrefix(received[i], "00-"+traces[i]+"-") {
			t.Errorf("message 5: the provider got traceparent %q, want trace %s", received[i], traces[i])
		}
		var events []string
		for _, e := range cs.Events {
			events = append(events, e.Name)
		}
		want := ""
		switch i {
		case 4:
			want = "dead-lettered"
			if cs.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("message 4: status %v, want an error", cs.Status)
			}
		case 5:
			want = "retry"
		}
		if strings.Join(events, ",") != want {
			t.Errorf("message %d: events %v, want %q", i, events, want)
		}
	}
	// The message without a traceparent starts a trace, not sampled at
	// ratio 0: the provider is told so (flags 00), and nothing is exported.
	if !strings.HasPrefix(received[n], "00-") || !strings.HasSuffix(received[n], "-00") {
		t.Errorf("the message without a traceparent reached the provider with traceparent %q, want one not sampled", received[n])
	}
	if recv.service != "throttle" {
		t.Errorf("service.name %q, want throttle", recv.service)
	}
	if code := proc.stop(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
