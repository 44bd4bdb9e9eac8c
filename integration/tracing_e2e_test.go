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
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
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

// tracingProvider is the provider of the tracing tests: message 4 is
// refused (400, dead-lettered), message 5 fails once (503, retried); it
// records the traceparent each message arrived with. It is safe for
// concurrent use.
type tracingProvider struct {
	srv *httptest.Server

	mu       sync.Mutex
	received map[int]string
	failed5  bool
}

func newTracingProvider(t *testing.T) *tracingProvider {
	p := &tracingProvider{received: map[int]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ ID int }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.received[body.ID] = r.Header.Get("traceparent")
		switch {
		case body.ID == 4:
			http.Error(w, "invalid number", http.StatusBadRequest)
		case body.ID == 5 && !p.failed5:
			p.failed5 = true
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// tracingMessages is the number of messages of a tracing test published
// with a sampled traceparent; one more is published without.
const tracingMessages = 6

// tracingIDs returns the trace and the parent span of message i.
func tracingIDs(i int) (traceID, parent string) {
	return fmt.Sprintf("%032x", 0xabc000+i), fmt.Sprintf("%016x", 0xdef000+i)
}

// tracingRun starts the binary with tracing on, sample_ratio 0, with
// source (the YAML of source:), has publish publish messages 0 to
// tracingMessages (the last without a traceparent), and checks what the
// receiver and the provider got: one consumer span named process per
// traced message, in its trace under the publisher's span, with attrs
// (and messaging.system, operation type), a wait span and a POST span
// under it per attempt, the POST span's traceparent at the provider, a
// retry and a dead-letter event on their messages.
func tracingRun(t *testing.T, name, source, process string, ready func(), publish func(i int, traceparent string),
	attrs func(i int) map[string]string) {
	t.Helper()
	redisAddr := testenv.RedisAddr(t)
	bin := cliBuild(t)
	recv := newOTLPReceiver(t)
	prov := newTracingProvider(t)
	cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit: {bucket: %s, rate: 50, burst: 1}
source:
%s
sink: {http: {url: %q, timeout: 5s}}
delivery: {max_attempts: 3, backoff: 20ms, max_backoff: 100ms, drain_timeout: 5s}
metrics: {listen: "off"}
tracing: {enabled: true, sample_ratio: 0}
`, redisAddr, name, source, prov.srv.URL)
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
	ready()

	const n = tracingMessages
	for i := range n + 1 {
		tp := ""
		if i < n { // message n has no traceparent: not sampled at ratio 0
			tid, parent := tracingIDs(i)
			tp = "00-" + tid + "-" + parent + "-01"
		}
		publish(i, tp)
	}
	cliWait(t, 30*time.Second, "every message at the provider", func() bool {
		prov.mu.Lock()
		defer prov.mu.Unlock()
		return len(prov.received) == n+1
	})
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
	prov.mu.Lock()
	defer prov.mu.Unlock()
	received := prov.received
	for i := range n {
		tid, parent := tracingIDs(i)
		cs := byTrace[tid]
		if cs == nil {
			t.Fatalf("message %d: no consumer span in its trace %s", i, tid)
		}
		if hex.EncodeToString(cs.ParentSpanId) != parent || cs.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Errorf("message %d: consumer span under %x, kind %v; want under the publisher's %s", i, cs.ParentSpanId, cs.Kind, parent)
		}
		want := attrs(i)
		want["messaging.operation.type"] = "process"
		for k, v := range want {
			if got := spanAttr(cs, k); got != v {
				t.Errorf("message %d: %s = %q, want %q", i, k, got, v)
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
		if i != 5 {
			want := "00-" + tid + "-" + hex.EncodeToString(cl[0].SpanId) + "-01"
			if received[i] != want {
				t.Errorf("message %d: the provider got traceparent %q, want %q (the client span's)", i, received[i], want)
			}
		} else if !strings.HasPrefix(received[i], "00-"+tid+"-") {
			t.Errorf("message 5: the provider got traceparent %q, want trace %s", received[i], tid)
		}
		var events []string
		for _, e := range cs.Events {
			events = append(events, e.Name)
		}
		wantEvents := ""
		switch i {
		case 4:
			wantEvents = "dead-lettered"
			if cs.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("message 4: status %v, want an error", cs.Status)
			}
		case 5:
			wantEvents = "retry"
		}
		if strings.Join(events, ",") != wantEvents {
			t.Errorf("message %d: events %v, want %q", i, events, wantEvents)
		}
	}
	// The message without a traceparent starts a trace, not sampled at
	// ratio 0: the provider is told so (flags 00), and nothing is exported.
	if !strings.HasPrefix(received[n], "00-") || !strings.HasSuffix(received[n], "-00") {
		t.Errorf("the message without a traceparent reached the provider with traceparent %q, want one not sampled", received[n])
	}
	recv.mu.Lock()
	service := recv.service
	recv.mu.Unlock()
	if service != "throttle" {
		t.Errorf("service.name %q, want throttle", service)
	}
	if code := proc.stop(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestTracingEndToEndRabbitMQ runs the binary with tracing on against an
// OTLP/HTTP receiver on a RabbitMQ queue (see tracingRun).
func TestTracingEndToEndRabbitMQ(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	source := fmt.Sprintf("  rabbitmq: {url: %q, queue: %s, prefetch: 10, declare: true}", amqpURL, name)
	ctx := testenv.Context(t, 60*time.Second)
	tracingRun(t, name, source, "process "+name,
		func() {
			cliWait(t, 20*time.Second, "the consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })
		},
		func(i int, tp string) {
			pub := amqp.Publishing{ContentType: "application/json", Body: fmt.Appendf(nil, `{"id":%d}`, i), MessageId: fmt.Sprintf("m%d", i)}
			if tp != "" {
				pub.Headers = amqp.Table{"traceparent": tp}
			}
			if err := ch.PublishWithContext(ctx, "", name, false, false, pub); err != nil {
				t.Fatal(err)
			}
		},
		func(i int) map[string]string {
			return map[string]string{"messaging.system": "rabbitmq", "messaging.consumer.group.name": name,
				"messaging.destination.subscription.name": name, "messaging.message.id": fmt.Sprintf("m%d", i)}
		})
}

// TestTracingEndToEndKafka is TestTracingEndToEndRabbitMQ on a Kafka
// topic (kfake): the traceparent is a Kafka header.
func TestTracingEndToEndKafka(t *testing.T) {
	t.Parallel()
	name := cliName(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, name, name+".dlq"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	source := fmt.Sprintf("  kafka: {brokers: [%q], topic: %s, group: %s, dead_letter_topic: %s.dlq}", brokers[0], name, name, name)
	cl := suiteKgo(t, brokers)
	ctx := testenv.Context(t, 60*time.Second)
	tracingRun(t, name, source, "process "+name, func() {},
		func(i int, tp string) {
			r := &kgo.Record{Topic: name, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, `{"id":%d}`, i)}
			if tp != "" {
				r.Headers = []kgo.RecordHeader{{Key: "traceparent", Value: []byte(tp)}}
			}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		},
		func(int) map[string]string {
			return map[string]string{"messaging.system": "kafka", "messaging.consumer.group.name": name,
				"messaging.destination.name": name}
		})
}
