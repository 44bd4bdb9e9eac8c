package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration of the throttle binary. Obtain one with
// [Load] or [Parse], which apply defaults and validate it.
//
// A Config is a plain value: it is safe to read from several goroutines at
// once, but must not be mutated while it is being read.
type Config struct {
	// Redis configures the connection to the Redis server that holds the
	// global token bucket.
	Redis Redis `yaml:"redis"`
	// Limit configures the token bucket.
	Limit Limit `yaml:"limit"`
	// Source configures where messages come from. Exactly one of its fields
	// must be set.
	Source Source `yaml:"source"`
	// Sink configures where messages are delivered. Exactly one of its
	// fields must be set.
	Sink Sink `yaml:"sink"`
	// Delivery configures retries of failed deliveries.
	Delivery Delivery `yaml:"delivery"`
	// Metrics configures the Prometheus metrics endpoint.
	Metrics Metrics `yaml:"metrics"`
	// Log configures logging.
	Log Log `yaml:"log"`
}

// RedisMode says how the Redis client connects, as decided by [Redis.Mode].
// It is a plain string and safe for concurrent use.
type RedisMode string

// The Redis connection modes.
const (
	// RedisSingle connects to the single node at Redis.Addr.
	RedisSingle RedisMode = "single"
	// RedisCluster connects to a Redis Cluster through the nodes in
	// Redis.Addrs.
	RedisCluster RedisMode = "cluster"
	// RedisSentinel asks the Sentinels in Redis.Addrs for the master named
	// Redis.MasterName.
	RedisSentinel RedisMode = "sentinel"
)

// Redis configures the connection to Redis (YAML key "redis"). It is a plain
// value: safe to read concurrently, not to mutate concurrently.
type Redis struct {
	// Addr is the host:port of a single Redis node. It defaults to
	// 127.0.0.1:6379 when none of addr, addrs and master_name is set, and
	// must not be set together with Addrs.
	Addr string `yaml:"addr"`
	// Addrs lists the host:port of Redis Cluster nodes, or of Sentinels
	// when MasterName is set.
	Addrs []string `yaml:"addrs"`
	// MasterName is the Sentinel master name; it requires Addrs.
	MasterName string `yaml:"master_name"`
	// SentinelUsername is the username used to authenticate to the
	// Sentinels; it requires MasterName.
	SentinelUsername string `yaml:"sentinel_username"`
	// SentinelPassword is the password used to authenticate to the
	// Sentinels; it requires MasterName. It is a secret.
	SentinelPassword string `yaml:"sentinel_password"`
	// Username is the ACL username; empty means the default user.
	Username string `yaml:"username"`
	// Password is the Redis password; empty means none. It is a secret.
	Password string `yaml:"password"`
	// DB is the database number, >= 0; it must be 0 with a cluster.
	DB int `yaml:"db"`
	// Timeout bounds dialing, reading and writing of each Redis call. It
	// defaults to 250ms and must be > 0.
	Timeout Duration `yaml:"timeout"`
	// TLS configures TLS to Redis; it is off by default.
	TLS TLS `yaml:"tls"`
}

// Mode reports how to connect: sentinel when MasterName is set, cluster when
// Addrs is set, and single otherwise.
func (r Redis) Mode() RedisMode {
	switch {
	case r.MasterName != "":
		return RedisSentinel
	case len(r.Addrs) > 0:
		return RedisCluster
	default:
		return RedisSingle
	}
}

// StoreErrorPolicy says what the limiter does while Redis is unreachable. It
// is a plain string and safe for concurrent use.
type StoreErrorPolicy string

// The store error policies.
const (
	// StoreErrorLocal falls back to a local token bucket running at
	// Limit.FallbackRate.
	StoreErrorLocal StoreErrorPolicy = "local"
	// StoreErrorClosed stops processing until Redis is back.
	StoreErrorClosed StoreErrorPolicy = "closed"
	// StoreErrorOpen processes messages without any limit until Redis is
	// back.
	StoreErrorOpen StoreErrorPolicy = "open"
)

// LeaseMode says whether the limiter may take tokens from Redis in batches.
// It is a plain string and safe for concurrent use.
type LeaseMode string

// The lease modes.
const (
	// LeaseAuto lets the limiter lease batches of tokens when the rate is
	// high enough for that to pay off.
	LeaseAuto LeaseMode = "auto"
	// LeaseOff makes the limiter ask Redis for every single token.
	LeaseOff LeaseMode = "off"
)

// Limit configures the global token bucket (YAML key "limit"). It is a plain
// value: safe to read concurrently, not to mutate concurrently.
type Limit struct {
	// Bucket names the bucket in Redis; every replica sharing it shares
	// the rate. It is required and must contain no whitespace, control
	// characters, "{" or "}".
	Bucket string `yaml:"bucket"`
	// Rate is the number of tokens added per second. It is required and
	// must be finite and > 0.
	Rate float64 `yaml:"rate"`
	// Burst is the bucket capacity, >= 1. When 0 or absent it defaults to
	// max(1, ceil(Rate)), capped at math.MaxInt32.
	Burst int `yaml:"burst"`
	// CostHeader optionally names the message header holding a message's
	// integer cost in tokens; empty means every message costs 1.
	CostHeader string `yaml:"cost_header"`
	// OnStoreError is the policy while Redis fails: local, closed or open.
	// It defaults to local.
	OnStoreError StoreErrorPolicy `yaml:"on_store_error"`
	// FallbackRate is the local rate used by the local policy, finite and
	// >= 0. The default, 0, means Rate divided by the number of live
	// replicas.
	FallbackRate float64 `yaml:"fallback_rate"`
	// ProbeInterval is how often Redis is probed while it fails. It
	// defaults to 1s and must be > 0.
	ProbeInterval Duration `yaml:"probe_interval"`
	// MaxWait bounds how long a message waits for tokens, >= 0. The
	// default, 0, means waiting as long as needed.
	MaxWait Duration `yaml:"max_wait"`
	// Lease is auto or off and defaults to auto.
	Lease LeaseMode `yaml:"lease"`
}

// Source says where messages come from (YAML key "source"). Exactly one
// field is non-nil in a valid Config; a key that is present in the YAML
// counts as set even when its value is empty. It is a plain value: safe to
// read concurrently, not to mutate concurrently.
type Source struct {
	// Kafka consumes a Kafka topic with a consumer group.
	Kafka *Kafka `yaml:"kafka,omitempty"`
	// RabbitMQ consumes a RabbitMQ queue.
	RabbitMQ *RabbitMQ `yaml:"rabbitmq,omitempty"`
}

// StartOffset says where a Kafka consumer group without committed offsets
// starts reading. It is a plain string and safe for concurrent use.
type StartOffset string

// The start offsets.
const (
	// StartFirst starts at the oldest retained message.
	StartFirst StartOffset = "first"
	// StartLast starts after the newest message.
	StartLast StartOffset = "last"
)

// Kafka configures the Kafka source (YAML key "source.kafka"). Decoding it
// from YAML starts from its defaults. It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type Kafka struct {
	// Brokers lists the host:port of the seed brokers; it is required.
	Brokers []string `yaml:"brokers"`
	// Topic is the topic to consume; it is required and must be a valid
	// Kafka topic name.
	Topic string `yaml:"topic"`
	// Group is the consumer group; it is required.
	Group string `yaml:"group"`
	// Concurrency is how many partitions are worked in parallel. It
	// defaults to 1 and must be >= 1.
	Concurrency int `yaml:"concurrency"`
	// DeadLetterTopic receives messages that could not be delivered. It
	// defaults to Topic + ".dlq" and must differ from Topic.
	DeadLetterTopic string `yaml:"dead_letter_topic"`
	// StartOffset is first or last and defaults to first.
	StartOffset StartOffset `yaml:"start_offset"`
	// SASL configures SASL authentication; it is off by default.
	SASL SASL `yaml:"sasl"`
	// TLS configures TLS to the brokers; it is off by default.
	TLS TLS `yaml:"tls"`
}

// UnmarshalYAML decodes n on top of the Kafka defaults.
func (k *Kafka) UnmarshalYAML(n *yaml.Node) error {
	type plain Kafka
	p := plain(defaultKafka())
	if err := n.Decode(&p); err != nil {
		return err
	}
	*k = Kafka(p)
	return nil
}

func defaultKafka() Kafka {
	return Kafka{Concurrency: 1, StartOffset: StartFirst}
}

// SASLMechanism names a Kafka SASL mechanism. It is a plain string and safe
// for concurrent use.
type SASLMechanism string

// The SASL mechanisms. The empty mechanism disables SASL.
const (
	SASLNone        SASLMechanism = ""
	SASLPlain       SASLMechanism = "plain"
	SASLScramSHA256 SASLMechanism = "scram-sha-256"
	SASLScramSHA512 SASLMechanism = "scram-sha-512"
)

// SASL configures Kafka SASL authentication (YAML key
// "source.kafka.sasl"). It is a plain value: safe to read concurrently, not
// to mutate concurrently.
type SASL struct {
	// Mechanism is empty (no SASL), plain, scram-sha-256 or scram-sha-512.
	Mechanism SASLMechanism `yaml:"mechanism"`
	// Username is required when Mechanism is set.
	Username string `yaml:"username"`
	// Password is the SASL password. It is a secret.
	Password string `yaml:"password"`
}

// RabbitMQ configures the RabbitMQ source (YAML key "source.rabbitmq").
// Decoding it from YAML starts from its defaults. It is a plain value: safe
// to read concurrently, not to mutate concurrently.
type RabbitMQ struct {
	// URL is the AMQP URL, such as amqp://user:pass@host:5672/vhost. It is
	// required, its scheme must be amqp or amqps, and its password is a
	// secret.
	URL string `yaml:"url"`
	// Queue is the queue to consume; it is required.
	Queue string `yaml:"queue"`
	// Prefetch is the consumer prefetch count. It defaults to 50 and must
	// be between 1 and 65535.
	Prefetch int `yaml:"prefetch"`
	// Concurrency is how many messages are handled in parallel. When 0 or
	// absent it defaults to Prefetch; otherwise it must be >= 1.
	Concurrency int `yaml:"concurrency"`
	// Declare makes the consumer declare the queue (durable) and a
	// dead-letter exchange and queue.
	Declare bool `yaml:"declare"`
	// DeadLetterExchange receives messages that could not be delivered.
	// It defaults to Queue + ".dlx" when Declare is true.
	DeadLetterExchange string `yaml:"dead_letter_exchange"`
	// TLS configures TLS to the broker; it is off by default.
	TLS TLS `yaml:"tls"`
}

// UnmarshalYAML decodes n on top of the RabbitMQ defaults.
func (r *RabbitMQ) UnmarshalYAML(n *yaml.Node) error {
	type plain RabbitMQ
	p := plain(defaultRabbitMQ())
	if err := n.Decode(&p); err != nil {
		return err
	}
	*r = RabbitMQ(p)
	return nil
}

func defaultRabbitMQ() RabbitMQ {
	return RabbitMQ{Prefetch: 50}
}

// Sink says where messages are delivered (YAML key "sink"). Exactly one
// field is non-nil in a valid Config; a key that is present in the YAML
// counts as set even when its value is empty, so "stdout: {}" and "stdout:"
// both select the stdout sink. It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type Sink struct {
	// HTTP delivers each message as an HTTP request.
	HTTP *HTTP `yaml:"http,omitempty"`
	// Postgres inserts each message as a row.
	Postgres *Postgres `yaml:"postgres,omitempty"`
	// Stdout writes each message to standard output.
	Stdout *Stdout `yaml:"stdout,omitempty"`
}

// HTTP configures the HTTP sink (YAML key "sink.http"). Decoding it from
// YAML starts from its defaults. It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type HTTP struct {
	// URL is the request URL; it is required and its scheme must be http
	// or https. A password in it is a secret.
	URL string `yaml:"url"`
	// Method is the request method and defaults to POST.
	Method string `yaml:"method"`
	// Timeout bounds each request. It defaults to 5s and must be > 0.
	Timeout Duration `yaml:"timeout"`
	// Headers are added to every request. Values of headers whose name
	// looks secret (see [IsSecretHeader]) are secrets.
	Headers map[string]string `yaml:"headers"`
	// BodyTemplate is an optional Go text/template producing the request
	// body; empty means the raw message payload.
	BodyTemplate string `yaml:"body_template"`
	// ContentType is the Content-Type of requests and defaults to
	// application/json.
	ContentType string `yaml:"content_type"`
	// MaxConns bounds the connections to the server. It defaults to 64
	// and must be >= 1.
	MaxConns int `yaml:"max_conns"`
	// PushBack makes the sink honour 429 and 503 responses (and their
	// Retry-After) by pausing consumption. Nil means the default, true;
	// use [HTTP.PushBackEnabled] to read it.
	PushBack *bool `yaml:"push_back"`
	// MaxPause bounds one push-back pause. It defaults to 60s and must be
	// > 0.
	MaxPause Duration `yaml:"max_pause"`
}

// PushBackEnabled reports whether push-back is on; a nil PushBack means on.
func (h HTTP) PushBackEnabled() bool {
	return h.PushBack == nil || *h.PushBack
}

// UnmarshalYAML decodes n on top of the HTTP defaults.
func (h *HTTP) UnmarshalYAML(n *yaml.Node) error {
	type plain HTTP
	p := plain(defaultHTTP())
	if err := n.Decode(&p); err != nil {
		return err
	}
	*h = HTTP(p)
	return nil
}

func defaultHTTP() HTTP {
	pushBack := true
	return HTTP{
		Method:      "POST",
		Timeout:     Duration(5 * time.Second),
		ContentType: "application/json",
		MaxConns:    64,
		PushBack:    &pushBack,
		MaxPause:    Duration(60 * time.Second),
	}
}

// Postgres configures the PostgreSQL sink (YAML key "sink.postgres"). It is
// a plain value: safe to read concurrently, not to mutate concurrently.
type Postgres struct {
	// DSN is the connection string, as a URL (postgres://...) or in
	// key=value form. It is required and a password in it is a secret.
	DSN string `yaml:"dsn"`
	// Table is the table rows are inserted into. It is required and must
	// be an unquoted SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63
	// bytes), optionally schema-qualified as schema.table.
	Table string `yaml:"table"`
	// CreateTable makes the sink create the table if it does not exist.
	CreateTable bool `yaml:"create_table"`
	// IDHeader optionally names the message header holding the
	// idempotency id of a message.
	IDHeader string `yaml:"id_header"`
}

// Stdout configures the stdout sink (YAML key "sink.stdout"), which has no
// settings. It is a plain value and safe for concurrent use.
type Stdout struct{}

// Delivery configures delivery retries (YAML key "delivery"). It is a plain
// value: safe to read concurrently, not to mutate concurrently.
type Delivery struct {
	// MaxAttempts is the number of delivery attempts before a message is
	// dead-lettered. It defaults to 5 and must be >= 1.
	MaxAttempts int `yaml:"max_attempts"`
	// Backoff is the pause before the first retry; it doubles on each
	// further retry. It defaults to 200ms and must be > 0.
	Backoff Duration `yaml:"backoff"`
	// MaxBackoff caps the pause between retries. It defaults to 30s and
	// must be >= Backoff.
	MaxBackoff Duration `yaml:"max_backoff"`
	// DrainTimeout bounds how long in-flight messages may finish on
	// shutdown. It defaults to 30s and must be > 0.
	DrainTimeout Duration `yaml:"drain_timeout"`
}

// Metrics configures the Prometheus endpoint (YAML key "metrics"). It is a
// plain value: safe to read concurrently, not to mutate concurrently.
type Metrics struct {
	// Listen is the host:port the metrics server listens on. It defaults
	// to 127.0.0.1:9464; "" or "off" disables the server.
	Listen string `yaml:"listen"`
}

// Enabled reports whether the metrics server should run.
func (m Metrics) Enabled() bool {
	return m.Listen != "" && m.Listen != "off"
}

// Log configures logging (YAML key "log"). It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type Log struct {
	// Level is debug, info, warn or error and defaults to info.
	Level string `yaml:"level"`
	// Format is text or json and defaults to text.
	Format string `yaml:"format"`
}

// SlogLevel returns Level as a slog.Level; an unknown level yields
// slog.LevelInfo.
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// Default returns a Config holding every default that does not depend on
// other settings. It has no source and no sink, so it is not valid by
// itself; Parse decodes the YAML on top of it.
func Default() Config {
	return Config{
		Redis: Redis{Timeout: Duration(250 * time.Millisecond)},
		Limit: Limit{
			OnStoreError:  StoreErrorLocal,
			ProbeInterval: Duration(time.Second),
			Lease:         LeaseAuto,
		},
		Delivery: Delivery{
			MaxAttempts:  5,
			Backoff:      Duration(200 * time.Millisecond),
			MaxBackoff:   Duration(30 * time.Second),
			DrainTimeout: Duration(30 * time.Second),
		},
		Metrics: Metrics{Listen: "127.0.0.1:9464"},
		Log:     Log{Level: "info", Format: "text"},
	}
}

// Load reads the YAML file at path and parses it with [Parse], expanding
// variables from the process environment.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := Parse(data, os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes a YAML configuration, expands ${VAR} references with lookup
// (nil treats every variable as unset), applies defaults and validates the
// result. Problems with the content, such as unknown keys, values of the
// wrong type, unset variables or failed validation, are all reported in one
// *ValidationError; YAML that is not valid yields a plain error.
func Parse(data []byte, lookup func(string) (string, bool)) (*Config, error) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	root, err := parseYAML(data)
	if err != nil {
		return nil, err
	}
	cfg := Default()
	w := newWalker(lookup)
	if root != nil {
		w.walk(root, reflect.TypeFor[Config](), "")
		if w.fatal {
			return nil, &ValidationError{Problems: w.problems}
		}
		if err := root.Decode(&cfg); err != nil {
			if len(w.problems) > 0 {
				return nil, &ValidationError{Problems: w.problems}
			}
			return nil, fmt.Errorf("decode: %w", err)
		}
	}
	cfg.applyDerivedDefaults()
	ps := w.problems
	var ve *ValidationError
	if err := cfg.Validate(); errors.As(err, &ve) {
		for _, p := range ve.Problems {
			if !w.covers(p.Key) {
				ps = append(ps, p)
			}
		}
	}
	if len(ps) > 0 {
		return nil, &ValidationError{Problems: ps}
	}
	return &cfg, nil
}

// parseYAML parses a single YAML document; it returns a nil node for an
// empty document.
func parseYAML(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, &syntaxError{err: err}
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, &syntaxError{err: err}
	default:
		return nil, fmt.Errorf("invalid YAML: line %d: only one document is allowed", extra.Line)
	}
	return &doc, nil
}

// syntaxError reports YAML that is not valid; its message says so and gives
// the line.
type syntaxError struct{ err error }

func (e *syntaxError) Error() string {
	return "invalid YAML: " + strings.TrimPrefix(e.err.Error(), "yaml: ")
}

func (e *syntaxError) Unwrap() error { return e.err }

// applyDerivedDefaults fills the defaults that depend on other settings, and
// those for which an explicit zero also means "use the default".
func (c *Config) applyDerivedDefaults() {
	r := &c.Redis
	if r.Addr == "" && len(r.Addrs) == 0 && r.MasterName == "" {
		r.Addr = "127.0.0.1:6379"
	}
	l := &c.Limit
	if l.Burst == 0 && l.Rate > 0 && !math.IsInf(l.Rate, 0) {
		l.Burst = int(min(math.Max(1, math.Ceil(l.Rate)), math.MaxInt32))
	}
	if k := c.Source.Kafka; k != nil && k.DeadLetterTopic == "" && k.Topic != "" {
		k.DeadLetterTopic = k.Topic + ".dlq"
	}
	if q := c.Source.RabbitMQ; q != nil {
		if q.Concurrency == 0 && q.Prefetch > 0 {
			q.Concurrency = q.Prefetch
		}
		if q.Declare && q.DeadLetterExchange == "" && q.Queue != "" {
			q.DeadLetterExchange = q.Queue + ".dlx"
		}
	}
	if h := c.Sink.HTTP; h != nil {
		if h.Method == "" {
			h.Method = "POST"
		}
		if h.ContentType == "" {
			h.ContentType = "application/json"
		}
		if h.PushBack == nil {
			pushBack := true
			h.PushBack = &pushBack
		}
	}
}

// String returns the configuration as YAML with every secret replaced by
// "REDACTED", so a Config can be logged safely.
func (c *Config) String() string {
	if c == nil {
		return "<nil>"
	}
	out, err := yaml.Marshal(c.Redacted())
	if err != nil {
		return fmt.Sprintf("config: marshal: %v", err)
	}
	return strings.TrimSuffix(string(out), "\n")
}
