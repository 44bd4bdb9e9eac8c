package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// minimal is the smallest valid configuration.
const minimal = `
limit:
  bucket: sms
  rate: 10
source:
  kafka:
    brokers: ["127.0.0.1:9092"]
    topic: sms
    group: g
sink:
  stdout: {}
`

// env returns a lookup function backed by m.
func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func mustParse(t *testing.T, doc string, vars map[string]string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(doc), env(vars))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

// libs returns cfg mapped onto the libraries, failing otherwise.
func libs(t *testing.T, cfg *Config) *Libraries {
	t.Helper()
	lib, err := cfg.Libraries()
	if err != nil {
		t.Fatalf("Libraries: %v", err)
	}
	return lib
}

// problems returns the problems of a *ValidationError, failing otherwise.
func problemsOf(t *testing.T, err error) []Problem {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	if len(ve.Problems) == 0 {
		t.Fatal("ValidationError without problems")
	}
	return ve.Problems
}

func TestParseBadInputs(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		env  map[string]string
		// key is the Problem.Key expected; empty for errors that are not a
		// *ValidationError, in which case want is matched against Error().
		key  string
		want string
	}{
		{
			name: "missing source",
			doc:  "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\n",
			key:  "source",
			want: "exactly one of kafka, rabbitmq must be set, got 0",
		},
		{
			name: "two sinks",
			doc:  minimal + "  http: {url: 'http://127.0.0.1/'}\n",
			key:  "sink",
			want: "exactly one of http, postgres, stdout must be set, got 2 (http, stdout)",
		},
		{
			name: "rate 0",
			doc:  strings.Replace(minimal, "rate: 10", "rate: 0", 1),
			key:  "limit.rate",
			want: "must be a number > 0 and <= 1e+09, got 0",
		},
		{
			name: "negative rate",
			doc:  strings.Replace(minimal, "rate: 10", "rate: -5", 1),
			key:  "limit.rate",
			want: "must be a number > 0 and <= 1e+09, got -5",
		},
		{
			name: "negative burst",
			doc:  strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: -3", 1),
			key:  "limit.burst",
			want: "must be >= 1 and <= 2147483647, got -3",
		},
		{
			name: "unknown key",
			doc:  minimal + "redis:\n  pasword: x\n",
			key:  "redis.pasword",
			want: "unknown key; did you mean password? (line 13)",
		},
		{
			name: "unknown top-level key",
			doc:  minimal + "limits: {}\n",
			key:  "limits",
			want: "unknown key; did you mean limit? (line 12)",
		},
		{
			name: "bad duration",
			doc:  minimal + "delivery:\n  backoff: 5 seconds\n",
			key:  "delivery.backoff",
			want: `invalid duration "5 seconds"`,
		},
		{
			name: "duration without unit",
			doc:  minimal + "redis: {timeout: 5}\n",
			key:  "redis.timeout",
			want: `invalid duration "5"`,
		},
		{
			name: "unset variable",
			doc:  minimal + "redis:\n  password: ${REDIS_PASSWORD}\n",
			key:  "redis.password",
			want: "environment variable REDIS_PASSWORD is not set (line 13)",
		},
		{
			name: "malformed variable reference",
			doc:  minimal + "redis:\n  password: ${REDIS PASSWORD}\n",
			key:  "redis.password",
			want: "invalid variable reference",
		},
		{
			name: "unterminated variable reference",
			doc:  minimal + "redis:\n  password: ${REDIS_PASSWORD\n",
			key:  "redis.password",
			want: "unterminated",
		},
		{
			name: "invalid YAML",
			doc:  "limit:\n  bucket: [a\n  rate: 1\n",
			want: "invalid YAML: line",
		},
		{
			name: "invalid YAML indentation",
			doc:  "limit:\n  bucket: a\n    rate: 1: 2\n",
			want: "invalid YAML: line 3",
		},
		{
			name: "two documents",
			doc:  minimal + "---\nlimit: {}\n",
			want: "invalid YAML: line 12: only one document is allowed",
		},
		{
			name: "rate NaN",
			doc:  strings.Replace(minimal, "rate: 10", "rate: .nan", 1),
			key:  "limit.rate",
			want: "must be a number per second or N/s, N/min, N/h, N/d, got \".nan\"",
		},
		{
			name: "rate infinite",
			doc:  strings.Replace(minimal, "rate: 10", "rate: .inf", 1),
			key:  "limit.rate",
			want: "must be a number per second or N/s, N/min, N/h, N/d, got \".inf\"",
		},
		{
			name: "rate inf string",
			doc:  strings.Replace(minimal, "rate: 10", `rate: "inf"`, 1),
			key:  "limit.rate",
			want: `must be a number > 0 and <= 1e+09, got +Inf (line 4)`,
		},
		{
			name: "rate not a number",
			doc:  strings.Replace(minimal, "rate: 10", "rate: fast", 1),
			key:  "limit.rate",
			want: `must be a number per second or N/s, N/min, N/h, N/d, got "fast"`,
		},
		{
			name: "burst not an integer",
			doc:  strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: 1.5", 1),
			key:  "limit.burst",
			want: `cannot use "1.5" as an integer`,
		},
		{
			name: "bad on_store_error",
			doc:  strings.Replace(minimal, "rate: 10", "rate: 10\n  on_store_error: retry", 1),
			key:  "limit.on_store_error",
			want: `must be local, closed or open, got "retry"`,
		},
		{
			name: "bad rabbitmq url scheme",
			doc:  "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource:\n  rabbitmq: {url: 'http://u:hunter2@h/', queue: q}\n",
			key:  "source.rabbitmq.url",
			want: `AMQP scheme must be either 'amqp://' or 'amqps://'`,
		},
		{
			name: "bad http url scheme",
			doc:  strings.Replace(minimal, "stdout: {}", "http: {url: 'ftp://h/x'}", 1),
			key:  "sink.http.url",
			want: `scheme must be http or https, got "ftp"`,
		},
		{
			name: "bucket with braces",
			doc:  strings.Replace(minimal, "bucket: sms", "bucket: '{sms}'", 1),
			key:  "limit.bucket",
			want: "must not contain braces or white space",
		},
		{
			name: "bucket with space",
			doc:  strings.Replace(minimal, "bucket: sms", "bucket: 'a b'", 1),
			key:  "limit.bucket",
			want: "must not contain braces or white space",
		},
		{
			name: "mapping instead of value",
			doc:  strings.Replace(minimal, "rate: 10", "rate: {x: 1}", 1),
			key:  "limit.rate",
			want: "expected a single value, got a mapping (line 4)",
		},
		{
			name: "value instead of list",
			doc:  strings.Replace(minimal, `brokers: ["127.0.0.1:9092"]`, "brokers: 127.0.0.1:9092", 1),
			key:  "source.kafka.brokers",
			want: "expected a list",
		},
		{
			name: "duplicate key",
			doc:  minimal + "log: {level: info, level: debug}\n",
			key:  "log.level",
			want: "duplicate key",
		},
		{
			name: "broker port out of range",
			doc:  strings.Replace(minimal, `"127.0.0.1:9092"`, `"127.0.0.1:99999"`, 1),
			key:  "source.kafka.brokers[0]",
			want: "no port between 1 and 65535",
		},
		{
			name: "bad broker address",
			doc:  strings.Replace(minimal, `"127.0.0.1:9092"`, `"127.0.0.1"`, 1),
			key:  "source.kafka.brokers[0]",
			want: `"127.0.0.1" is not host:port`,
		},
		{
			name: "max_backoff below backoff",
			doc:  minimal + "delivery: {backoff: 2s, max_backoff: 1s}\n",
			key:  "delivery.max_backoff",
			want: "1s must not be below the backoff, 2s",
		},
		{
			name: "cluster with db",
			doc:  minimal + "redis: {addrs: ['a:1', 'b:2'], db: 2}\n",
			key:  "redis.db",
			want: "must be 0 with a cluster",
		},
		{
			name: "sentinel without addrs",
			doc:  minimal + "redis: {master_name: mymaster}\n",
			key:  "redis.master_name",
			want: "requires redis.addrs",
		},
		{
			name: "sasl without username",
			doc:  strings.Replace(minimal, "group: g", "group: g\n    sasl: {mechanism: plain}", 1),
			key:  "source.kafka.sasl.username",
			want: "required when mechanism is plain",
		},
		{
			name: "bad postgres table",
			doc:  strings.Replace(minimal, "stdout: {}", "postgres: {dsn: 'postgres://h/db', table: 'drop table'}", 1),
			key:  "sink.postgres.table",
			want: "\"drop table\" is not an unquoted identifier",
		},
		{
			name: "bad body template",
			doc:  strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', body_template: '{{.Foo'}", 1),
			key:  "sink.http.body_template",
			want: "unclosed action",
		},
		{
			name: "explicit zero timeout",
			doc:  minimal + "redis: {timeout: 0}\n",
			key:  "redis.timeout",
			want: "must not be 0; omit the key for the default (line 12)",
		},
		{
			name: "bad log level",
			doc:  minimal + "log: {level: verbose}\n",
			key:  "log.level",
			want: `must be one of debug, info, warn, error, got "verbose"`,
		},
		{
			name: "tls file while disabled",
			doc:  minimal + "redis: {tls: {ca_file: /ca.pem}}\n",
			key:  "redis.tls",
			want: "no effect unless redis.tls.enabled is true",
		},
		{"prefetch too large", rmq("prefetch: 70000"), nil, "source.rabbitmq.prefetch", "70000 must be between 1 and 65535"},
		{"negative rabbitmq concurrency", rmq("concurrency: -1"), nil, "source.rabbitmq.concurrency", "-1 must not be negative"},
		{"ack delay too long", rmq("ack_delay: 2s"), nil, "source.rabbitmq.ack_delay", "2s is over 1s"},
		{"bad topic", strings.Replace(minimal, "topic: sms", "topic: 'a/b'", 1), nil, "source.kafka.topic", "is not a Kafka topic name"},
		{"dead letter topic is topic", strings.Replace(minimal, "group: g", "group: g\n    dead_letter_topic: sms", 1), nil, "source.kafka.dead_letter_topic", `must differ from the topic "sms"`},
		{"delay topic is dead letter topic", strings.Replace(minimal, "group: g", "group: g\n    dead_letter_topic: sms.x\n    delay_topic: sms.x", 1), nil, "source.kafka.delay_topic", `must differ from the dead-letter topic "sms.x"`},
		{"dead letter topic is the default delay topic", strings.Replace(minimal, "group: g", "group: g\n    dead_letter_topic: sms.delay", 1), nil, "source.kafka.delay_topic", `must differ from the dead-letter topic "sms.delay"`},
		{"bad delay topic", strings.Replace(minimal, "group: g", "group: g\n    delay_topic: 'sms delay'", 1), nil, "source.kafka.delay_topic", "is not a Kafka topic name"},
		{"bad start offset", strings.Replace(minimal, "group: g", "group: g\n    start_offset: middle", 1), nil, "source.kafka.start_offset", `must be one of first, last, got "middle"`},
		{"bad sasl mechanism", strings.Replace(minimal, "group: g", "group: g\n    sasl: {mechanism: gssapi, username: u}", 1), nil, "source.kafka.sasl.mechanism", `got "gssapi"`},
		{"sasl password without mechanism", strings.Replace(minimal, "group: g", "group: g\n    sasl: {password: p}", 1), nil, "source.kafka.sasl", "no effect unless"},
		{"missing group", strings.Replace(minimal, "group: g", "", 1), nil, "source.kafka.group", "required"},
		{"bad http method", httpSink("method: 'PO ST'"), nil, "sink.http.method", "must be an HTTP method"},
		{"bad header name", httpSink("headers: {'X Y': z}"), nil, "sink.http.headers.X Y", `not a valid header name`},
		{"bad content type", httpSink("content_type: 'json/'"), nil, "sink.http.content_type", "not a media type such as application/json"},
		{"zero max_pause", httpSink("max_pause: 0s"), nil, "sink.http.max_pause", "must not be 0; omit the key for the default"},
		{"negative http timeout", httpSink("timeout: -1s"), nil, "sink.http.timeout", "must not be negative, got -1s"},
		{"postgres bad scheme", strings.Replace(minimal, "stdout: {}", "postgres: {dsn: 'mysql://h/db', table: t}", 1), nil, "sink.postgres.dsn", `URL scheme must be postgres or postgresql, got "mysql"`},
		{"postgres bad key=value", strings.Replace(minimal, "stdout: {}", "postgres: {dsn: 'mydb', table: t}", 1), nil, "sink.postgres.dsn", "invalid connection string"},
		{"postgres missing table", strings.Replace(minimal, "stdout: {}", "postgres: {dsn: 'postgres://h/db'}", 1), nil, "sink.postgres.table", "required"},
		{"bad lease", strings.Replace(minimal, "rate: 10", "rate: 10\n  lease: always", 1), nil, "limit.lease", `must be one of auto, off, got "always"`},
		{"lease calls with leasing off", strings.Replace(minimal, "rate: 10", "rate: 10\n  lease: \"off\"\n  lease_calls: 2500", 1), nil, "limit.lease_calls", "has no effect with limit.lease off"},
		{"negative lease calls", strings.Replace(minimal, "rate: 10", "rate: 10\n  lease_calls: -5", 1), nil, "limit.lease_calls", "must be >= 0 (0 for the default), got -5"},
		{"negative fallback rate", strings.Replace(minimal, "rate: 10", "rate: 10\n  fallback_rate: -1", 1), nil, "limit.fallback_rate", "must be 0 (the replica's share) or a number > 0 and <= 1e+09, got -1"},
		{"zero probe interval", strings.Replace(minimal, "rate: 10", "rate: 10\n  probe_interval: 0s", 1), nil, "limit.probe_interval", "must not be 0; omit the key for the default"},
		{"negative max wait", strings.Replace(minimal, "rate: 10", "rate: 10\n  max_wait: -1s", 1), nil, "limit.max_wait", "-1s must not be negative"},
		{"zero drain timeout", minimal + "delivery: {drain_timeout: 0s}\n", nil, "delivery.drain_timeout", "must not be 0; omit the key for the default"},
		{"zero max set aside", minimal + "delivery: {max_set_aside: 0s}\n", nil, "delivery.max_set_aside", "must not be 0; omit the key for the default"},
		{"bad metrics listen", minimal + "metrics: {listen: 'localhost'}\n", nil, "metrics.listen", "must be host:port"},
		{"bad metrics port", minimal + "metrics: {listen: 'localhost:http'}\n", nil, "metrics.listen", "port must be a number"},
		{"sample ratio above 1", minimal + "tracing: {enabled: true, sample_ratio: 1.5}\n", nil, "tracing.sample_ratio", "must be within [0, 1]"},
		{"sample ratio without tracing", minimal + "tracing: {sample_ratio: 0.5}\n", nil, "tracing.sample_ratio", "no effect unless tracing.enabled"},
		{"addr and addrs", minimal + "redis: {addr: 'a:1', addrs: ['b:2']}\n", nil, "redis", "set either addr or addrs, not both"},
		{"negative db", minimal + "redis: {db: -1}\n", nil, "redis.db", "must be >= 0, got -1"},
		{"sentinel password without master", minimal + "redis: {sentinel_password: x}\n", nil, "redis.sentinel_password", "has no effect without redis.master_name"},
		{"cert without key", minimal + "redis: {tls: {enabled: true, cert_file: c.pem}}\n", nil, "redis.tls", "cert_file and key_file must be set together"},
		{"bad merge value", minimal + "log: {<<: 3}\n", nil, "log", "merge key"},
		{"non-scalar key", minimal + "log: {[a]: 1}\n", nil, "log", "keys must be plain strings, got a list"},
		{"bool expected", minimal + "redis: {tls: {enabled: maybe}}\n", nil, "redis.tls.enabled", `cannot use "maybe" as a boolean`},
		{"mapping instead of list item", strings.Replace(minimal, `["127.0.0.1:9092"]`, "[{a: 1}]", 1), nil, "source.kafka.brokers[0]", "expected a single value, got a mapping"},
		{"list instead of mapping", minimal + "redis: [a]\n", nil, "redis", "expected a mapping, got a list"},
		{"headers not a mapping", httpSink("headers: [a]"), nil, "sink.http.headers", "expected a mapping, got a list"},
		{
			name: "top level not a mapping",
			doc:  "- a\n- b\n",
			want: "expected a mapping, got a list (line 1)",
		},
		{
			name: "self-referencing alias",
			doc:  minimal + "redis: &r {<<: *r}\n",
			key:  "redis",
			want: "refers to a value that contains it",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.doc), env(tt.env))
			if err == nil {
				t.Fatalf("Parse succeeded, want error; config:\n%v", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with error %v", err)
			}
			if tt.key == "" {
				if !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %q does not contain %q", err, tt.want)
				}
				return
			}
			for _, p := range problemsOf(t, err) {
				if p.Key == tt.key && strings.Contains(p.String(), tt.want) {
					if !strings.Contains(err.Error(), tt.key+": ") {
						t.Errorf("Error() %q does not name key %q", err, tt.key)
					}
					return
				}
			}
			t.Fatalf("no problem with key %q and message containing %q in:\n%v", tt.key, tt.want, err)
		})
	}
}

// rmq returns a valid RabbitMQ configuration with extra settings.
func rmq(extra string) string {
	return "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource:\n  rabbitmq: {url: 'amqp://h/', queue: q, " + extra + "}\n"
}

// httpSink returns minimal with an HTTP sink with extra settings.
func httpSink(extra string) string {
	return strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', "+extra+"}", 1)
}

func TestMultipleErrorsListedAtOnce(t *testing.T) {
	doc := `
limit:
  bucket: ""
  rate: -5
  burst: -1
  on_store_error: sometimes
source:
  kafka: {brokers: [], topic: t, group: g}
  rabbitmq: {url: "amqp://h/", queue: q}
sink:
  http: {url: "http://h/", max_conns: 0}
  stdout: {}
delivery: {max_attempts: 0}
log: {format: xml}
`
	_, err := Parse([]byte(doc), nil)
	ps := problemsOf(t, err)
	want := []string{
		"limit.bucket: must not be empty",
		"limit.rate: must be a number > 0 and <= 1e+09, got -5",
		"limit.burst: must be >= 1 and <= 2147483647, got -1",
		`limit.on_store_error: must be local, closed or open, got "sometimes"`,
		"source.kafka.brokers: required",
		"source: exactly one of kafka, rabbitmq must be set, got 2 (kafka, rabbitmq)",
		"sink.http.max_conns: must not be 0; omit the key for the default",
		"sink: exactly one of http, postgres, stdout must be set, got 2 (http, stdout)",
		"delivery.max_attempts: must not be 0; omit the key for the default",
		`log.format: must be one of text, json, got "xml"`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(ps) {
		t.Errorf("Error() has %d lines for %d problems:\n%v", len(lines), len(ps), err)
	}
	for _, w := range want {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, w)
		}
		if !found {
			t.Errorf("missing problem %q in:\n%v", w, err)
		}
	}
}

func TestDecodeErrorsListedAtOnce(t *testing.T) {
	doc := strings.Replace(minimal, "rate: 10", "rate: -5", 1) + `
redis:
  timeout: soon
  passwrd: x
  password: ${A}${B}
delivery:
  max_attempts: many
`
	ps := problemsOf(t, func() error { _, err := Parse([]byte(doc), nil); return err }())
	var keys []string
	for _, p := range ps {
		keys = append(keys, p.Key)
	}
	// Decoding problems come first, in document order (a rate is parsed
	// while decoding), then validation problems.
	want := []string{"limit.rate", "redis.timeout", "redis.passwrd", "redis.password", "delivery.max_attempts"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys = %q, want %q; problems:\n%v", keys, want, ps)
	}
	if got := ps[3]; got.Message != "environment variables A, B are not set" || got.Line != 16 {
		t.Errorf("problem = %+v", got)
	}
}

func TestRejectedValueIsReportedOnce(t *testing.T) {
	doc := strings.Replace(minimal, "rate: 10", "rate: fast", 1)
	doc = strings.Replace(doc, "kafka:", "kafka: [x]\n  rabbitmq:", 1)
	_, err := Parse([]byte(doc), nil)
	ps := problemsOf(t, err)
	// Neither "limit.rate: must be > 0, got 0" nor the missing settings of
	// source.kafka are reported on top of the decoding problems; the
	// rabbitmq problems and the two sources are.
	var keys []string
	for _, p := range ps {
		keys = append(keys, p.Key)
	}
	want := []string{
		"limit.rate", "source.kafka", "source.rabbitmq.brokers", "source.rabbitmq.topic", "source.rabbitmq.group",
		"source.rabbitmq.url", "source.rabbitmq.queue", "source",
	}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys = %q, want %q; problems:\n%v", keys, want, err)
	}
}

// TestDefaults checks that an absent key leaves its field zero, meaning
// the default of the library it is handed to (no default is written
// twice), except the binary's own defaults and the burst.
func TestDefaults(t *testing.T) {
	cfg := mustParse(t, minimal, nil)
	want := Default()
	want.Limit.Bucket = "sms"
	want.Limit.Rate = 10
	want.Limit.Burst = 10 // limiter.DefaultBurst(10)
	want.Source.Kafka = &Kafka{
		Brokers: []string{"127.0.0.1:9092"},
		Topic:   "sms",
		Group:   "g",
	}
	want.Sink.Stdout = &Stdout{}
	if !reflect.DeepEqual(*cfg, want) {
		t.Fatalf("got\n%v\nwant\n%v", cfg, &want)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"metrics.listen", cfg.Metrics.Listen, "127.0.0.1:9464"},
		{"metrics enabled", cfg.Metrics.Enabled(), true},
		{"log.level", cfg.Log.Level, "info"},
		{"log.format", cfg.Log.Format, "text"},
		{"redis mode", cfg.Redis.Mode(), RedisSingle},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestDerivedDefaults(t *testing.T) {
	t.Run("burst from fractional rate", func(t *testing.T) {
		cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 2.5", 1), nil)
		if cfg.Limit.Burst != 3 {
			t.Errorf("burst = %d, want 3", cfg.Limit.Burst)
		}
	})
	t.Run("burst from small rate", func(t *testing.T) {
		cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 0.1\n  burst:", 1), nil)
		if cfg.Limit.Burst != 1 {
			t.Errorf("burst = %d, want 1", cfg.Limit.Burst)
		}
	})
	t.Run("explicit burst", func(t *testing.T) {
		cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: 200", 1), nil)
		if cfg.Limit.Burst != 200 {
			t.Errorf("burst = %d, want 200", cfg.Limit.Burst)
		}
	})
	t.Run("http push_back default", func(t *testing.T) {
		h := mustParse(t, strings.Replace(minimal, "stdout: {}", "http: {url: 'https://h/x'}", 1), nil).Sink.HTTP
		if !reflect.DeepEqual(*h, HTTP{URL: "https://h/x"}) || !h.PushBackEnabled() {
			t.Errorf("got %+v", *h)
		}
	})
	t.Run("http push_back false", func(t *testing.T) {
		h := mustParse(t, strings.Replace(minimal, "stdout: {}", "http: {url: 'https://h/x', push_back: false}", 1), nil).Sink.HTTP
		if h.PushBack == nil || *h.PushBack || h.PushBackEnabled() {
			t.Errorf("push_back = %v", h.PushBack)
		}
	})
	t.Run("metrics off", func(t *testing.T) {
		for _, v := range []string{`""`, "off"} {
			cfg := mustParse(t, minimal+"metrics: {listen: "+v+"}\n", nil)
			if cfg.Metrics.Enabled() {
				t.Errorf("listen %s: metrics enabled", v)
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		cfg := mustParse(t, minimal+"redis: {addrs: ['a:1', 'b:2']}\n", nil)
		if cfg.Redis.Addr != "" || cfg.Redis.Mode() != RedisCluster {
			t.Errorf("addr %q, mode %s", cfg.Redis.Addr, cfg.Redis.Mode())
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		cfg := mustParse(t, minimal+"redis: {addrs: ['a:1'], master_name: m, db: 3}\n", nil)
		if cfg.Redis.Mode() != RedisSentinel {
			t.Errorf("mode %s", cfg.Redis.Mode())
		}
	})
}

func TestEmptyChoiceCountsAsSet(t *testing.T) {
	for _, v := range []string{"stdout: {}", "stdout:", "stdout: ~"} {
		cfg := mustParse(t, strings.Replace(minimal, "stdout: {}", v, 1), nil)
		if cfg.Sink.Stdout == nil {
			t.Errorf("%q: Sink.Stdout is nil", v)
		}
	}
	_, err := Parse([]byte(strings.Replace(minimal, "stdout: {}", "stdout: {format: x}", 1)), nil)
	if ps := problemsOf(t, err); ps[0].Key != "sink.stdout.format" {
		t.Errorf("problems %v", ps)
	}
}

func TestEnvExpansion(t *testing.T) {
	doc := strings.Replace(minimal, "rate: 10", "rate: ${RATE:-100}\n  burst: \"${BURST}\"\n  max_wait: ${WAIT:-}", 1) + `
redis:
  addrs: ["s:26379"]
  master_name: m
  password: ${REDIS_PASSWORD:-}
  username: "${USER_NAME:-default}"
  sentinel_password: pa$$word
  db: ${DB:-0}
  tls: {enabled: "${TLS:-false}"}
sink:
  http:
    url: http://h/$notavar
    headers: {Authorization: "Bearer ${TOKEN}", X-Note: "a: b, 'c' \"d\" ${NOTE}"}
    body_template: '{"v": "$${{.Payload}}"}'
`
	doc = strings.Replace(doc, "sink:\n  stdout: {}\n", "", 1)
	vars := map[string]string{
		"BURST":     "7",
		"USER_NAME": "",
		"TOKEN":     "t0k3n",
		"NOTE":      "x: [y], {z} #c",
		"TLS":       "true",
	}
	cfg := mustParse(t, doc, vars)
	checks := []struct {
		name      string
		got, want any
	}{
		{"rate from default", cfg.Limit.Rate, 100.0},
		{"quoted burst becomes a number", cfg.Limit.Burst, 7},
		{"empty duration is absent", cfg.Limit.MaxWait, Duration(0)},
		{"empty default", cfg.Redis.Password, ""},
		{"set but empty uses default", cfg.Redis.Username, "default"},
		{"$$ escapes", cfg.Redis.SentinelPassword, "pa$word"},
		{"int default", cfg.Redis.DB, 0},
		{"bool", cfg.Redis.TLS.Enabled, true},
		{"lone $ kept", cfg.Sink.HTTP.URL, "http://h/$notavar"},
		{"header", cfg.Sink.HTTP.Headers["Authorization"], "Bearer t0k3n"},
		{"value with YAML syntax stays a string", cfg.Sink.HTTP.Headers["X-Note"], "a: b, 'c' \"d\" x: [y], {z} #c"},
		{"template", cfg.Sink.HTTP.BodyTemplate, `{"v": "${{.Payload}}"}`},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestEnvExpansionKeepsStringType(t *testing.T) {
	doc := minimal + "redis:\n  password: ${PW}\n  username: ${U}\n"
	cfg := mustParse(t, doc, map[string]string{"PW": "null", "U": "0123"})
	if cfg.Redis.Password != "null" || cfg.Redis.Username != "0123" {
		t.Errorf("password %q, username %q", cfg.Redis.Password, cfg.Redis.Username)
	}
}

func TestEnvExpansionDoesNotEchoValues(t *testing.T) {
	doc := minimal + "redis: {db: '${REDIS_PASSWORD}'}\n"
	_, err := Parse([]byte(doc), env(map[string]string{"REDIS_PASSWORD": "hunter2"}))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v", err)
	}
	if ps := problemsOf(t, err); ps[0].Key != "redis.db" || !strings.Contains(ps[0].Message, `"${REDIS_PASSWORD}" does not expand to an integer`) {
		t.Errorf("problems %v", ps)
	}
}

func TestAliasesAndMergeKeys(t *testing.T) {
	doc := strings.Replace(minimal, "stdout: {}", `stdout: {}
  x: &common {timeout: "${T:-1s}"}`, 1)
	_, err := Parse([]byte(doc), nil)
	if ps := problemsOf(t, err); ps[0].Key != "sink.x" {
		t.Errorf("problems %v", ps)
	}
	doc = `
limit: {bucket: b, rate: 1}
source:
  kafka:
    brokers: [&addr "${BROKER:-k:9092}"]
    topic: t
    group: g
    tls: &tls {enabled: true, server_name: "$${x}"}
redis:
  addrs: [*addr]
  tls: *tls
sink:
  http:
    <<: {url: "http://h/", timeout: 1s}
    timeout: 2s
`
	cfg := mustParse(t, doc, nil)
	if cfg.Redis.Addrs[0] != "k:9092" || cfg.Redis.TLS.ServerName != "${x}" || cfg.Source.Kafka.TLS.ServerName != "${x}" {
		t.Errorf("aliases: %+v, %+v", cfg.Redis, cfg.Source.Kafka.TLS)
	}
	if cfg.Sink.HTTP.URL != "http://h/" || cfg.Sink.HTTP.Timeout != Duration(2*time.Second) {
		t.Errorf("merge: %+v", cfg.Sink.HTTP)
	}
}

func TestEmptyDocument(t *testing.T) {
	_, err := Parse(nil, nil)
	ps := problemsOf(t, err)
	if len(ps) != 4 { // bucket, rate, source, sink
		t.Errorf("problems:\n%v", err)
	}
}

func TestRedaction(t *testing.T) {
	secrets := map[string]string{
		"REDIS_PASSWORD":    "redis-secret-1",
		"SENTINEL_PASSWORD": "sentinel-secret-2",
		"SASL_PASSWORD":     "sasl-secret-3",
		"TOKEN":             "header-secret-4",
		"API_KEY":           "header-secret-5",
		"COOKIE":            "header-secret-6",
		"HTTP_PASSWORD":     "url-secret-7",
	}
	doc := `
redis:
  addrs: ["s1:26379"]
  master_name: mymaster
  sentinel_password: ${SENTINEL_PASSWORD}
  password: ${REDIS_PASSWORD}
limit: {bucket: b, rate: 1}
source:
  kafka:
    brokers: ["k:9092"]
    topic: t
    group: g
    sasl: {mechanism: scram-sha-512, username: svc, password: "${SASL_PASSWORD}"}
sink:
  http:
    url: "https://user:${HTTP_PASSWORD}@h/send?access_token=${TOKEN}&x=1"
    headers:
      Authorization: "Bearer ${TOKEN}"
      X-Api-Key: ${API_KEY}
      Cookie: ${COOKIE}
      X-Request-Source: throttle
`
	cfg := mustParse(t, doc, secrets)
	original := *cfg.Sink.HTTP
	dump := cfg.String()
	for _, s := range secrets {
		if strings.Contains(dump, s) {
			t.Errorf("dump contains secret %q:\n%s", s, dump)
		}
	}
	for _, want := range []string{"svc", "X-Request-Source: throttle", "user:xxxxx@h", "x=1", "mymaster"} {
		if !strings.Contains(dump, want) {
			t.Errorf("dump lacks %q:\n%s", want, dump)
		}
	}
	if n := strings.Count(dump, "xxxxx"); n != 8 {
		t.Errorf("dump has %d xxxxx, want 8:\n%s", n, dump)
	}
	// Redacted must not touch the original.
	if cfg.Redis.Password != secrets["REDIS_PASSWORD"] || cfg.Sink.HTTP.Headers["Cookie"] != secrets["COOKIE"] ||
		!reflect.DeepEqual(*cfg.Sink.HTTP, original) {
		t.Error("Redacted modified the original config")
	}
	// The dump is itself a valid configuration.
	back := mustParse(t, dump, nil)
	if !reflect.DeepEqual(back, cfg.Redacted()) {
		t.Errorf("dump does not round-trip:\n%v", back)
	}

	// Postgres and RabbitMQ connection strings.
	pg := mustParse(t, strings.Replace(minimal, "stdout: {}", `postgres: {dsn: "host=db user=u password='pg secret\\'8' sslmode=disable", table: s.t}`, 1), nil)
	if got := pg.String(); strings.Contains(got, "secret") || !strings.Contains(got, "host=db user=u password=xxxxx sslmode=disable") {
		t.Errorf("postgres dump:\n%s", got)
	}
	mq := mustParse(t, "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource:\n  rabbitmq: {url: 'amqp://guest:rabbit-secret-9@h:5672/', queue: q}\n", nil)
	if got := mq.String(); strings.Contains(got, "rabbit-secret-9") || !strings.Contains(got, "amqp://guest:xxxxx@h:5672/") {
		t.Errorf("rabbitmq dump:\n%s", got)
	}
}

func TestValidationErrorsDoNotLeakSecrets(t *testing.T) {
	doc := "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource:\n  rabbitmq: {url: 'amqp://u:leak%zz@h/', queue: q}\n"
	_, err := Parse([]byte(doc), nil)
	if err == nil || strings.Contains(err.Error(), "leak") {
		t.Fatalf("error %v", err)
	}
	doc = strings.Replace(minimal, "stdout: {}", `postgres: {dsn: "host=db password='leak", table: t}`, 1)
	_, err = Parse([]byte(doc), nil)
	if err == nil || strings.Contains(err.Error(), "leak") {
		t.Fatalf("error %v", err)
	}
}

// TestRedactURL checks that config forwards to internal/redact, whose own
// tests cover the cases: one implementation, one mask.
func TestRedactURL(t *testing.T) {
	if got := RedactURL("amqp://guest:guest@127.0.0.1:5672/"); got != "amqp://guest:xxxxx@127.0.0.1:5672/" {
		t.Errorf("RedactURL = %q", got)
	}
	if !IsSecretHeader("X-Api-Key") || IsSecretHeader("Content-Type") {
		t.Error("IsSecretHeader disagrees with internal/redact")
	}
}

func TestDuration(t *testing.T) {
	doc := strings.Replace(minimal, "rate: 10", "rate: 10\n  max_wait: 0", 1) + "delivery: {backoff: 1m30s, max_backoff: 2m}\n"
	cfg := mustParse(t, doc, nil)
	if cfg.Delivery.Backoff != Duration(90*time.Second) || cfg.Delivery.Backoff.String() != "1m30s" {
		t.Errorf("backoff = %v", cfg.Delivery.Backoff)
	}
	var d Duration
	if err := d.UnmarshalText([]byte("5 seconds")); err == nil || !strings.Contains(err.Error(), `invalid duration "5 seconds"`) {
		t.Errorf("UnmarshalText error = %v", err)
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "throttle.yaml")
	if err := os.WriteFile(path, []byte(minimal+"redis: {password: \"${THROTTLE_TEST_PW:-}\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("THROTTLE_TEST_PW", "pw")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Password != "pw" {
		t.Errorf("password = %q", cfg.Redis.Password)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("limit: {rate: -1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	var ve *ValidationError
	if !errors.As(err, &ve) || !strings.HasPrefix(err.Error(), "config "+path+": ") {
		t.Errorf("invalid file: %v", err)
	}
}

func TestValidateNil(t *testing.T) {
	var c *Config
	if err := c.Validate(); err == nil {
		t.Error("Validate on nil config succeeded")
	}
	if c.Redacted() != nil || c.String() != "<nil>" {
		t.Error("nil config not handled")
	}
}

func TestLogSlogLevel(t *testing.T) {
	for level, want := range map[string]string{"debug": "DEBUG", "info": "INFO", "warn": "WARN", "error": "ERROR"} {
		if got := (Log{Level: level}).SlogLevel().String(); got != want {
			t.Errorf("%s: %s", level, got)
		}
	}
}

func TestTLSClientConfig(t *testing.T) {
	if c, err := (TLS{}).ClientConfig(); c != nil || err != nil {
		t.Fatalf("disabled: %v, %v", c, err)
	}
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	c, err := TLS{Enabled: true, CAFile: certFile, CertFile: certFile, KeyFile: keyFile, ServerName: "example"}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "example" || c.MinVersion != tls.VersionTLS12 {
		t.Errorf("config %+v", c)
	}

	missing := filepath.Join(dir, "missing.pem")
	if _, err := (TLS{Enabled: true, CAFile: missing}).ClientConfig(); err == nil || !strings.Contains(err.Error(), "ca_file") || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing ca_file: %v", err)
	}
	if _, err := (TLS{Enabled: true, CAFile: keyFile}).ClientConfig(); err == nil || !strings.Contains(err.Error(), keyFile) {
		t.Errorf("ca_file without certificate: %v", err)
	}
	if _, err := (TLS{Enabled: true, CertFile: certFile, KeyFile: missing}).ClientConfig(); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing key_file: %v", err)
	}
	if _, err := (TLS{Enabled: true, CertFile: certFile}).ClientConfig(); err == nil {
		t.Error("cert_file without key_file succeeded")
	}
}

// writeCert writes a self-signed certificate and its key to dir.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "example"},
		NotBefore:             time.Unix(0, 0),
		NotAfter:              time.Unix(1<<32, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestExplicitZero is a regression test: "burst: 0"
// was taken silently as "the default". Omitting a key (or leaving it
// empty) gives the default; writing 0 where 0 means nothing is an error
// naming the key.
func TestExplicitZero(t *testing.T) {
	for _, tt := range []struct{ key, doc string }{
		{"limit.burst", strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: 0", 1)},
		{"limit.burst", strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: ${B}", 1)},
		{"limit.probe_interval", strings.Replace(minimal, "rate: 10", "rate: 10\n  probe_interval: 0s", 1)},
		{"redis.timeout", minimal + "redis: {timeout: 0ms}\n"},
		{"source.kafka.concurrency", strings.Replace(minimal, "group: g", "group: g\n    concurrency: 0", 1)},
		{"source.rabbitmq.prefetch", "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource: {rabbitmq: {url: 'amqp://h/', queue: q, prefetch: 0}}\n"},
		{"source.rabbitmq.concurrency", "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource: {rabbitmq: {url: 'amqp://h/', queue: q, concurrency: 0}}\n"},
		{"source.rabbitmq.ack_delay", "limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource: {rabbitmq: {url: 'amqp://h/', queue: q, ack_delay: 0s}}\n"},
		{"sink.http.timeout", strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', timeout: 0s}", 1)},
		{"sink.http.max_conns", strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', max_conns: 0}", 1)},
		{"delivery.max_attempts", minimal + "delivery: {max_attempts: 0}\n"},
		{"delivery.backoff", minimal + "delivery: {backoff: 0s}\n"},
		{"delivery.max_backoff", minimal + "delivery: {max_backoff: 0s}\n"},
	} {
		_, err := Parse([]byte(tt.doc), env(map[string]string{"B": "0"}))
		ps := problemsOf(t, err)
		if len(ps) != 1 || ps[0].Key != tt.key || !strings.Contains(ps[0].Message, "must not be 0; omit the key for the default") {
			t.Errorf("%s: problems %v", tt.key, ps)
		}
	}
	for _, doc := range []string{
		strings.Replace(minimal, "rate: 10", "rate: 10\n  burst:", 1),
		strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: ~", 1),
		strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: ${B:-}", 1),
	} {
		if cfg := mustParse(t, doc, nil); cfg.Limit.Burst != 10 {
			t.Errorf("burst = %d, want the default 10 for\n%s", cfg.Limit.Burst, doc)
		}
	}
	// Keys where 0 means something stay accepted.
	cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  fallback_rate: 0\n  max_wait: 0s", 1)+"redis: {db: 0}\n", nil)
	if cfg.Limit.FallbackRate != 0 || cfg.Limit.MaxWait != 0 {
		t.Errorf("limit = %+v", cfg.Limit)
	}
}

// TestRateStrings checks the rate syntax of limit.rate: a number per
// second, or N/s, N/min, N/h, N/d (limiter.ParseRate), also from the
// environment.
func TestRateStrings(t *testing.T) {
	for _, tt := range []struct {
		yaml string
		want float64
	}{
		{"100", 100}, {"2.5", 2.5}, {"'100/s'", 100}, {"6000/min", 100}, {"3600/h", 1}, {"86400/d", 1}, {"${RATE}", 20},
	} {
		cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: "+tt.yaml, 1), map[string]string{"RATE": "1200/min"})
		if cfg.Limit.Rate != tt.want {
			t.Errorf("rate: %s = %v, want %v", tt.yaml, cfg.Limit.Rate, tt.want)
		}
	}
	for _, tt := range []struct{ yaml, want string }{
		{"5/m", "unknown unit: use N/s, N/min, N/h or N/d"},
		{"1e20", "must be a number > 0 and <= 1e+09"},
		{"0/h", "must be a number > 0"},
		{"${RATE}", `"${RATE}" does not expand to a rate`},
		{"[1]", "expected a single value, got a list"},
	} {
		_, err := Parse([]byte(strings.Replace(minimal, "rate: 10", "rate: "+tt.yaml, 1)), env(map[string]string{"RATE": "lots"}))
		ps := problemsOf(t, err)
		if len(ps) != 1 || ps[0].Key != "limit.rate" || !strings.Contains(ps[0].Message, tt.want) {
			t.Errorf("rate: %s: problems %v, want limit.rate: %s", tt.yaml, ps, tt.want)
		}
		if strings.Contains(err.Error(), "lots") {
			t.Errorf("rate: %s: the error echoes the environment: %v", tt.yaml, err)
		}
	}
}

// TestHTTPSinkValidatedByTheSink is a regression test:
// config parsed body templates without the sink's functions, so the
// documented push-webhook template made `throttle run` exit 2. The sink's own
// Validate decides now, and its problems carry the YAML key.
func TestHTTPSinkValidatedByTheSink(t *testing.T) {
	for _, tmpl := range []string{
		`'{"token":{{json .JSON.device}}}'`,
		`'{{form "To" .JSON.to "Body" .JSON.text}}'`,
	} {
		mustParse(t, strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', body_template: "+tmpl+"}", 1), nil)
	}
	doc := strings.Replace(minimal, "stdout: {}", `http:
      url: "http://h/"
      method: "A B"
      body_template: "{{jsn .JSON}}"
      max_pause: -1s
      headers: {Authorization: "Bearer ${TOKEN}"}`, 1)
	_, err := Parse([]byte(doc), env(map[string]string{"TOKEN": "tok\nen"}))
	got := map[string]string{}
	for _, p := range problemsOf(t, err) {
		got[p.Key] = p.Message
	}
	want := map[string]string{
		"sink.http.method":                `must be an HTTP method such as POST, got "A B"`,
		"sink.http.body_template":         `template: body_template:1: function "jsn" not defined`,
		"sink.http.max_pause":             "must be >= 0 (0 for the default), got -1s", // the limiter's cap
		"sink.http.headers.Authorization": "value holds a control character (CR, LF, NUL, ...)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%v\nwant:\n%v", got, want)
	}
	if strings.Contains(err.Error(), "tok") {
		t.Errorf("error echoes a header value: %v", err)
	}
}

// TestPostgresValidatedByTheSink checks that table names and DSNs follow
// the sink's rules, reported under their YAML keys.
func TestPostgresValidatedByTheSink(t *testing.T) {
	doc := strings.Replace(minimal, "stdout: {}", `postgres: {dsn: "postgres://u:pw-9@h:notaport/db", table: "a.b.c"}`, 1)
	_, err := Parse([]byte(doc), nil)
	got := map[string]bool{}
	for _, p := range problemsOf(t, err) {
		got[p.Key] = true
	}
	if !got["sink.postgres.dsn"] || !got["sink.postgres.table"] || len(got) != 2 {
		t.Errorf("problems: %v", err)
	}
	if strings.Contains(err.Error(), "pw-9") {
		t.Errorf("error echoes the password: %v", err)
	}
}

func TestMetricsListenPortZero(t *testing.T) {
	cfg := mustParse(t, minimal+"metrics: {listen: '127.0.0.1:0'}\n", nil)
	if !cfg.Metrics.Enabled() || cfg.Metrics.Listen != "127.0.0.1:0" {
		t.Errorf("metrics = %+v", cfg.Metrics)
	}
	_, err := Parse([]byte(minimal+"redis: {addr: '127.0.0.1:0'}\n"), nil)
	if ps := problemsOf(t, err); ps[0].Key != "redis.addr" {
		t.Errorf("problems %v", ps)
	}
}

func TestOrdering(t *testing.T) {
	kafka := func(extra string) string {
		return strings.Replace(minimal, "group: g", "group: g\n    "+extra, 1)
	}
	cfg := mustParse(t, kafka("ordering: key\n    ordering_key: '{{index .Headers \"x-from\"}}'\n    max_in_flight: 50"), nil)
	k := cfg.Source.Kafka
	if k.Ordering != "key" || k.MaxInFlight != 50 {
		t.Fatalf("kafka = %+v", k)
	}
	f := libs(t, cfg).Kafka.OrderingKey
	if f == nil {
		t.Fatal("no ordering key function")
	}
	if key, err := f(consumer.Message{Headers: map[string]string{"x-from": "+1555"}}); key != "+1555" || err != nil {
		t.Errorf("key = %q, %v", key, err)
	}
	if _, err := f(consumer.Message{Headers: map[string]string{}}); err != nil {
		t.Errorf("a missing header via index: %v", err)
	}
	if f := libs(t, mustParse(t, minimal, nil)).Kafka.OrderingKey; f != nil {
		t.Error("empty ordering_key: a key function, want the consumer's default")
	}
	for _, tt := range []struct{ doc, key, want string }{
		{kafka("ordering: random"), "source.kafka.ordering", `"random" is not`},
		{kafka("ordering: key\n    ordering_key: '{{nope}}'"), "source.kafka.ordering_key", `function "nope" not defined`},
		{kafka("ordering_key: '{{.Key}}'"), "source.kafka.ordering_key", `requires ordering "key", got ""`},
		{kafka("max_in_flight: 0"), "source.kafka.max_in_flight", "must not be 0"},
		{kafka("max_in_flight: 50"), "source.kafka.max_in_flight", `has no effect with ordering "partition"`},
		{kafka("ordering: partition\n    max_in_flight: 50"), "source.kafka.max_in_flight", `has no effect with ordering "partition"`},
		// The consumer's one bound comes from max_in_flight under key and
		// none, from concurrency under partition.
		{kafka("ordering: key\n    max_in_flight: -5"), "source.kafka.max_in_flight", "-5 must not be negative"},
		{kafka("concurrency: -2"), "source.kafka.concurrency", "-2 must not be negative"},
		{"limit: {bucket: b, rate: 1}\nsink: {stdout: {}}\nsource: {rabbitmq: {url: 'amqp://h/', queue: q, ordering: none, ordering_key: x}}\n",
			"source.rabbitmq.ordering_key", `requires ordering "key", got "none"`},
	} {
		_, err := Parse([]byte(tt.doc), nil)
		ps := problemsOf(t, err)
		if len(ps) != 1 || ps[0].Key != tt.key || !strings.Contains(ps[0].Message, tt.want) {
			t.Errorf("problems %v, want %s: %s", ps, tt.key, tt.want)
		}
	}
	mustParse(t, kafka("ordering: none\n    max_in_flight: 50"), nil)
}

// TestLibraryFieldsNameYAMLKeys checks the translation of the Go field
// names in library errors into YAML keys.
func TestLibraryFieldsNameYAMLKeys(t *testing.T) {
	for _, tt := range []struct {
		k          libraryKeys
		goName, yk string
	}{
		{limitKeys, "Bucket", "limit.bucket"},
		{limiterKeys, "FallbackRate", "limit.fallback_rate"},
		{limiterKeys, "fallback_rate", "limit.fallback_rate"},
		{limiterKeys, "OnStoreError", "limit.on_store_error"},
		{limiterKeys, "Lease.Fraction", "limit.lease.fraction"},
		{limiterKeys, "Lease.MinBatch", "limit.lease.min_batch"},
		{limiterKeys, "Lease.Calls", "limit.lease_calls"},
		{limiterKeys, "MaxPause", "sink.http.max_pause"},
		{limitKeys, "WaitTimeout", "limit.max_wait"},
		{limitKeys, "Nope", "limit"},
		{kafkaKeys, "Brokers[1]", "source.kafka.brokers[1]"},
		{kafkaKeys, "Retry.MaxBackoff", "delivery.max_backoff"},
		{rabbitMQKeys, "DrainTimeout", "delivery.drain_timeout"},
		{httpKeys, "BodyTemplate", "sink.http.body_template"},
		{httpKeys, "Rules", "sink.http.classify"},
		{httpKeys, "URL", "sink.http.url"},
	} {
		if got := tt.k.key(tt.goName); got != tt.yk {
			t.Errorf("%s key of %q = %q, want %q", tt.k.section, tt.goName, got, tt.yk)
		}
	}
}

// TestDeliveryValidatedByTheConsumer checks that the delivery section goes
// through consumer.Options.Validate, whose Go names (Retry.MaxAttempts)
// land on the YAML keys.
func TestDeliveryValidatedByTheConsumer(t *testing.T) {
	_, err := Parse([]byte(minimal+"delivery: {max_attempts: -1, backoff: -1s, max_backoff: -2s, drain_timeout: -3s, max_set_aside: -4s}\n"), nil)
	got := map[string]string{}
	for _, p := range problemsOf(t, err) {
		got[p.Key] = p.Message
	}
	want := map[string]string{
		"delivery.max_attempts":  "-1 must not be negative",
		"delivery.backoff":       "-1s must not be negative",
		"delivery.max_backoff":   "-2s must not be negative",
		"delivery.drain_timeout": "-3s must not be negative",
		"delivery.max_set_aside": "-4s must not be negative",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems %v, want %v", got, want)
	}
	_, err = Parse([]byte(minimal+"delivery: {backoff: 2s, max_backoff: 1s}\n"), nil)
	if ps := problemsOf(t, err); ps[0].Key != "delivery.max_backoff" {
		t.Errorf("problems %v", ps)
	}
}

// TestProblemsCarryTheirLine: every problem about a key present in the
// YAML gives that key's line, whether the walker found it while decoding
// or a library's validation did afterwards; a problem about an absent key
// has none.
func TestProblemsCarryTheirLine(t *testing.T) {
	doc := `limit:
  rate: 10
  on_store_error: sometimes
  adaptive:
    min_rate: 20
  extra:
    - name: l
      key: '{{nope}}'
      rate: 1
source:
  kafka:
    brokers: ["127.0.0.1:9092"]
    topic: sms
    group: g
    max_in_flight: 50
    ordering: partition
sink:
  stdout: {}
  http: {url: "http://h/"}
redis:
  timeout: soon
  pasword: x
`
	_, err := Parse([]byte(doc), nil)
	want := map[string]int{
		"limit.bucket":               0, // absent
		"limit.on_store_error":       3,
		"limit.adaptive.min_rate":    5,
		"limit.extra[0].key":         8,
		"source.kafka.max_in_flight": 15,
		"sink":                       17,
		"redis.timeout":              21,
		"redis.pasword":              22,
	}
	got := map[string]int{}
	for _, p := range problemsOf(t, err) {
		got[p.Key] = p.Line
		if p.Line > 0 && !strings.HasSuffix(p.String(), fmt.Sprintf(" (line %d)", p.Line)) {
			t.Errorf("%q does not end with its line", p.String())
		}
		if strings.Contains(p.Message, "(line") {
			t.Errorf("%q: the line is in the message", p.String())
		}
	}
	for key, line := range want {
		if l, ok := got[key]; !ok || l != line {
			t.Errorf("%s: line %d (reported %v), want %d", key, l, ok, line)
		}
	}
	if t.Failed() {
		t.Logf("problems:\n%v", err)
	}
}
