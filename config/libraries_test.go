package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// TestLibrariesMapsTheYAML: every section lands in the library
// configuration that uses it, once, and keys left out stay zero: the
// library's default, which config does not copy.
func TestLibrariesMapsTheYAML(t *testing.T) {
	cfg := mustParse(t, `
limit:
  bucket: sms
  rate: 10
  burst: 20
  warmup: 30s
  max_wait: 2s
  priority: low
  priority_header: x-priority
  on_store_error: closed
  lease: "off"
  extra: [{name: per-recipient, key: '{{.JSON.to}}', rate: 1/s, on_exceed: delay}]
source:
  kafka:
    brokers: ["127.0.0.1:9092"]
    topic: sms
    group: g
    ordering: key
    max_in_flight: 50
    start_offset: last
sink:
  http: {url: "http://h/send", max_pause: 10s}
delivery: {max_attempts: 3, backoff: 1s, drain_timeout: 5s, max_set_aside: 2m}
`, nil)
	lib := libs(t, cfg)
	if b := lib.Bucket; b.Bucket != "sms" || b.Rate != 10 || b.Burst != 20 || b.Warmup != 30*time.Second || b.Prefix != "" {
		t.Errorf("Bucket = %+v", b)
	}
	if o := lib.Limiter; o.Priority != limiter.PriorityLow || o.OnStoreError != limiter.ModeClosed || !o.Lease.Disabled ||
		o.MaxPause != 10*time.Second || o.ProbeInterval != 0 || o.MaxReserve != 0 || o.HeartbeatInterval != 0 {
		t.Errorf("Limiter = %+v", o)
	}
	if len(lib.Layers) != 1 || lib.Layers[0].Name != "per-recipient" || !lib.Layers[0].Keyed || lib.Layers[0].Burst != 0 {
		t.Errorf("Layers = %+v", lib.Layers)
	}
	if l := lib.Limit; l.WaitTimeout != 2*time.Second || l.Priority == nil || l.Keys == nil {
		t.Errorf("Limit = %+v", l)
	}
	if p, err := lib.Limit.Priority(consumer.Message{}); p != limiter.PriorityLow || err != nil {
		t.Errorf("a message without the header: class %v, %v; want the bucket's, low", p, err)
	}
	k := lib.Kafka
	if k == nil || lib.RabbitMQ != nil {
		t.Fatalf("Kafka %v, RabbitMQ %v", k, lib.RabbitMQ)
	}
	if k.Topic != "sms" || k.Group != "g" || k.Concurrency != 50 || k.StartOffset != kafkago.LastOffset ||
		!k.SetAside || k.Dialer != nil || k.DeadLetterTopic != "" || k.Ordering != consumer.OrderKey || k.OrderingKey != nil {
		t.Errorf("Kafka = %+v", *k)
	}
	if o := k.Options; o.Retry != (consumer.RetryPolicy{MaxAttempts: 3, Backoff: time.Second}) || o.DrainTimeout != 5*time.Second ||
		o.MaxSetAside != 2*time.Minute || o.Cost != nil || o.Limiter != nil || o.Pauser != nil || o.Priority != nil {
		t.Errorf("Kafka.Options = %+v", o)
	}
	// sink.http.max_pause is mapped once, onto the limiter's cap; the sink
	// takes the bucket's (Libraries.HTTP).
	if h := lib.HTTP; h == nil || h.URL != "http://h/send" || h.MaxRetryAfter != 0 || h.Method != "" || h.Timeout != 0 || !lib.PushBack {
		t.Errorf("HTTP = %+v, PushBack %v", h, lib.PushBack)
	}
	if lib.Postgres != nil || lib.Stdout {
		t.Errorf("Postgres %v, Stdout %v", lib.Postgres, lib.Stdout)
	}

	off := libs(t, mustParse(t, strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', push_back: false}", 1), nil))
	if off.PushBack || off.Limiter.MaxPause != 0 {
		t.Errorf("push_back false: PushBack %v, MaxPause %v", off.PushBack, off.Limiter.MaxPause)
	}
	plain := libs(t, mustParse(t, minimal, nil))
	if plain.Limit.Priority != nil || plain.Limit.Keys != nil || plain.Layers != nil || plain.Kafka.SetAside || !plain.Stdout || plain.HTTP != nil {
		t.Errorf("minimal: %+v", plain)
	}
}

// TestLibrariesRabbitMQAndPostgres: the other source and sink.
func TestLibrariesRabbitMQAndPostgres(t *testing.T) {
	lib := libs(t, mustParse(t, `
limit: {bucket: b, rate: 5, cost_header: x-cost, lease_calls: 2500}
source: {rabbitmq: {url: "amqps://u:p@h/", queue: q, prefetch: 20, ack_delay: -1ms, declare: true, ordering: none, tls: {enabled: true}}}
sink: {postgres: {dsn: "postgres://h/db", table: sent, create_table: true, id_header: x-id}}
`, nil))
	q := lib.RabbitMQ
	if q == nil || lib.Kafka != nil || q.URL != "amqps://u:p@h/" || q.Queue != "q" || q.Prefetch != 20 || q.AckDelay != -time.Millisecond || !q.Declare ||
		q.Concurrency != 0 || q.TLS == nil || q.Ordering != consumer.OrderNone || q.Cost == nil {
		t.Fatalf("RabbitMQ = %+v", q)
	}
	if p := lib.Postgres; p == nil || p.DSN != "postgres://h/db" || p.Table != "sent" || !p.CreateTable || p.IDHeader != "x-id" {
		t.Errorf("Postgres = %+v", p)
	}
	if lib.PushBack || lib.Limiter.MaxPause != 0 {
		t.Errorf("without an HTTP sink: PushBack %v, MaxPause %v", lib.PushBack, lib.Limiter.MaxPause)
	}
	if l := lib.Limiter.Lease; l.Disabled || l.Calls != 2500 {
		t.Errorf("Lease = %+v, want on with Calls 2500 (limit.lease_calls)", l)
	}
}

// TestLibrariesTracing: tracing is off by default (nil), on with the
// default ratio, or with the ratio the file gives, 0 included.
func TestLibrariesTracing(t *testing.T) {
	base := `
limit: {bucket: b, rate: 5}
source: {rabbitmq: {url: "amqp://h/", queue: q}}
sink: {stdout: {}}
`
	for _, c := range []struct {
		yaml string
		want float64 // -1: off
	}{
		{"", -1},
		{"tracing: {enabled: false}\n", -1},
		{"tracing: {enabled: true}\n", 1},
		{"tracing: {enabled: true, sample_ratio: 0.01}\n", 0.01},
		{"tracing: {enabled: true, sample_ratio: 0}\n", 0},
	} {
		lib := libs(t, mustParse(t, base+c.yaml, nil))
		switch {
		case c.want < 0 && lib.Tracing != nil:
			t.Errorf("%q: tracing on", c.yaml)
		case c.want >= 0 && (lib.Tracing == nil || lib.Tracing.SampleRatio != c.want):
			t.Errorf("%q: tracing %+v, want ratio %v", c.yaml, lib.Tracing, c.want)
		}
	}
}

// TestLibrariesReadsTheTLSFiles: Validate reads no file, so a missing one
// passes Parse; Libraries reads it and names the key.
func TestLibrariesReadsTheTLSFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, src := range []string{
		`kafka: {brokers: ["127.0.0.1:9092"], topic: t, group: g, tls: {enabled: true, ca_file: "` + missing + `"}}`,
		`rabbitmq: {url: "amqps://h/", queue: q, tls: {enabled: true, ca_file: "` + missing + `"}}`,
	} {
		cfg := mustParse(t, "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource: {"+src+"}\n", nil)
		_, err := cfg.Libraries()
		ps := problemsOf(t, err)
		key := "source." + strings.SplitN(src, ":", 2)[0] + ".tls"
		if len(ps) != 1 || ps[0].Key != key || !strings.Contains(ps[0].Message, "read ca_file") || !strings.Contains(ps[0].Message, missing) {
			t.Errorf("%s: problems %v, want one under %s naming the file", src, ps, key)
		}
	}
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	cfg := mustParse(t, `limit: {bucket: b, rate: 1}
sink: {stdout: {}}
source: {kafka: {brokers: ["127.0.0.1:9092"], topic: t, group: g, tls: {enabled: true, ca_file: "`+certFile+`", cert_file: "`+certFile+`", key_file: "`+keyFile+`"}}}
`, nil)
	if d := libs(t, cfg).Kafka.Dialer; d == nil || d.TLS == nil || d.TLS.RootCAs == nil || len(d.TLS.Certificates) != 1 || d.SASLMechanism != nil {
		t.Errorf("Dialer = %+v", d)
	}
}

// TestKafkaDialer: SASL and TLS make a dialer with kafka-go's defaults; a
// mechanism SASLprep cannot use is a problem that does not echo the
// password.
func TestKafkaDialer(t *testing.T) {
	for _, mech := range []SASLMechanism{SASLPlain, SASLScramSHA256, SASLScramSHA512} {
		cfg := mustParse(t, strings.Replace(minimal, "group: g", "group: g\n    sasl: {mechanism: "+string(mech)+", username: u, password: hunter2}", 1), nil)
		d := libs(t, cfg).Kafka.Dialer
		if d == nil || d.SASLMechanism == nil || !strings.EqualFold(d.SASLMechanism.Name(), string(mech)) {
			t.Fatalf("%s: dialer %+v", mech, d)
		}
		if d.Timeout != kafkago.DefaultDialer.Timeout || d.DualStack != kafkago.DefaultDialer.DualStack || d.TLS != nil {
			t.Errorf("%s: dialer %+v, want kafka-go's defaults", mech, d)
		}
	}
	_, err := Parse([]byte(strings.Replace(minimal, "group: g", "group: g\n    sasl: {mechanism: scram-sha-256, username: u, password: \"hunter2\\u0000\"}", 1)), nil)
	ps := problemsOf(t, err)
	if len(ps) != 1 || ps[0].Key != "source.kafka.sasl" || !strings.Contains(ps[0].Message, "not usable") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("problems %v", ps)
	}
}
