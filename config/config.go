package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/consumer"
)

// Config is the whole configuration of the throttle binary: the YAML
// model, one field per key. Obtain one with [Load] or [Parse], which
// expand the environment and validate it, and map it onto the libraries'
// configurations with [Config.Libraries].
//
// A zero field means "the default", and the default is the one of the
// library the field is handed to (redisconn, limiter, the consumers, the
// sinks), so that no default is written twice. In YAML, omitting a key
// gives that default; writing 0 for a key whose field is documented "not
// 0 in YAML" is an error naming the key.
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
	// Tracing configures OpenTelemetry tracing of each message.
	Tracing Tracing `yaml:"tracing"`
	// Console configures the web console ('throttle console', and in a
	// replica when Console.Listen is set).
	Console Console `yaml:"console"`
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
	// Addr is the host:port of a single Redis node. When none of addr,
	// addrs and master_name is set, redisconn connects to 127.0.0.1:6379.
	// It must not be set together with Addrs.
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
	// Timeout bounds dialing, reading and writing of each Redis call. Zero
	// means redisconn.DefaultTimeout (250ms); not 0 in YAML.
	Timeout Duration `yaml:"timeout,omitempty" check:"nonzero"`
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

// The store error policies. The empty policy means the limiter's default,
// local.
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

// The lease modes. The empty mode means auto.
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
	// the rate. It is required, and redislimiter.Config.Validate says
	// which names are valid.
	Bucket string `yaml:"bucket"`
	// Rate is the number of tokens added per second. It is required and
	// must pass redislimiter.Config.Validate. In YAML it is a number per second or
	// a string "N/s", "N/min", "N/h" or "N/d" (see limiter.ParseRate).
	Rate float64 `yaml:"rate" check:"rate"`
	// Burst is the bucket capacity, >= 1. Parse sets it to the
	// store's default (redislimiter.Config.WithDefaults) when the key is
	// absent; not 0 in YAML.
	Burst int `yaml:"burst,omitempty" check:"nonzero"`
	// CostHeader optionally names the message header holding a message's
	// integer cost in tokens; empty means every message costs 1.
	CostHeader string `yaml:"cost_header"`
	// CostTemplate optionally renders a message's cost: a message
	// template (package sinks/msgtmpl, the data and functions of the HTTP
	// sink's templates plus sms_segments) whose output must be a positive
	// integer, e.g. {{sms_segments .JSON.text}}. A message it fails for
	// is dead-lettered with the reason. It excludes CostHeader.
	CostTemplate string `yaml:"cost_template,omitempty"`
	// OnStoreError is the policy while Redis fails: local, closed or open;
	// empty means the limiter's default, local.
	OnStoreError StoreErrorPolicy `yaml:"on_store_error"`
	// FallbackRate is the local rate used by the local policy. The
	// default, 0, means Rate divided by the number of live replicas;
	// otherwise limiter.Options.Validate checks it.
	FallbackRate float64 `yaml:"fallback_rate"`
	// ProbeInterval is how often Redis is probed while it fails. Zero
	// means the limiter's default (1s); not 0 in YAML.
	ProbeInterval Duration `yaml:"probe_interval,omitempty" check:"nonzero"`
	// MaxWait bounds each wait of a message for tokens
	// (consumer.LimitOptions.WaitTimeout, which must not be negative): a
	// wait still going after it fails the attempt, which is retried like
	// any retryable failure. It is a timeout, unlike the max_wait of a
	// layer of Extra. The default, 0, means waiting as long as needed.
	MaxWait Duration `yaml:"max_wait"`
	// Lease is auto or off; empty means auto.
	Lease LeaseMode `yaml:"lease"`
	// LeaseCalls is limiter.LeaseOptions.Calls, the refills a second the
	// whole fleet aims at while leasing; 0 means the limiter's default.
	// Not with Lease off.
	LeaseCalls float64 `yaml:"lease_calls"`
	// Extra lists further limits (keyed buckets, calendar quotas) decided
	// with the bucket in one atomic step; see LimitLayer.
	Extra []LimitLayer `yaml:"extra,omitempty"`
	// Prices price each message for the budget layers of Extra; see
	// LimitPrices.
	Prices *LimitPrices `yaml:"prices,omitempty"`
	// Adaptive turns on the adaptive rate (AIMD, limiter.Adaptive): each
	// push-back from the sink lowers the bucket's rate for every replica,
	// and it climbs back while sends succeed. Rate becomes the ceiling.
	// Absent: off.
	Adaptive *LimitAdaptive `yaml:"adaptive,omitempty"`
	// Shadow makes the shared bucket a shadow (limiter.Options.Shadow):
	// decided on every message at rate and burst and counted
	// (throttle_limit_exceeded_total{layer="bucket",shadow="true"}),
	// never enforced; the layers of extra still are. Default false.
	Shadow bool `yaml:"shadow,omitempty"`
	// Priority is the class of this replica's messages: high, normal or
	// low (limiter.ParsePriority). Across every replica and deployment
	// that shares the bucket, a waiting message of a higher class gets
	// tokens before any of a lower class. Empty means normal.
	Priority string `yaml:"priority,omitempty"`
	// PriorityHeader optionally names the message header holding a
	// message's class (high, normal or low), which then wins over
	// Priority. A message without it has class Priority; any other
	// value, the empty one too, is a permanent error, so the message is
	// dead-lettered with the reason.
	PriorityHeader string `yaml:"priority_header,omitempty"`
	// MinShare maps a class to the floor of its share of the rate while it
	// has messages waiting, such as {low: 0.1} (limiter.Options.MinShare,
	// whose Validate checks the fractions). Every replica that shares the
	// bucket should name the same floors. Absent: none.
	MinShare map[string]float64 `yaml:"min_share,omitempty"`
	// Warmup is the warm-up period (redislimiter.Config.Warmup): on first
	// use, and after the bucket has been idle for longer than Warmup, its
	// rate ramps from a third of Rate to Rate over Warmup. 0 means none;
	// redislimiter.Config.Validate says which values are valid.
	Warmup Duration `yaml:"warmup,omitempty"`
	// Fair shares the bucket among tenants by weight while it is
	// saturated (limiter.Fair, which validates it): absent, none.
	Fair *LimitFair `yaml:"fair,omitempty"`
}

// LimitFair is limit.fair, mapped onto limiter.Fair and the consumer's
// consumer.LimitOptions.Tenant and TenantWaiting, which validate it and
// give the defaults of the keys left out.
type LimitFair struct {
	// Key is a message template (sinks/msgtmpl) giving the message's
	// tenant, such as {{index .Headers "x-tenant"}}. Required. A message
	// for which it fails or renders empty is dead-lettered with the
	// reason.
	Key string `yaml:"key"`
	// Weights maps a tenant to its weight (limiter.Fair.Weights), each > 0.
	Weights map[string]float64 `yaml:"weights,omitempty"`
	// DefaultWeight is the weight of the other tenants; default 1.
	DefaultWeight float64 `yaml:"default_weight,omitempty" check:"nonzero"`
	// Horizon is how far ahead, in time of the bucket's rate, the tenants
	// together hold reservations before the shares apply
	// (limiter.Fair.Horizon); default 500ms.
	Horizon Duration `yaml:"horizon,omitempty" check:"nonzero"`
	// MaxWaiting bounds the messages of one tenant that wait for its share
	// at once in a replica (consumer.LimitOptions.TenantWaiting, default
	// 4): a further one is set aside until its tenant's share has room.
	// Under source.kafka.ordering partition every message waits instead,
	// in order.
	MaxWaiting int `yaml:"max_waiting,omitempty" check:"nonzero"`
}

// LimitAdaptive is limit.adaptive, mapped onto limiter.Adaptive, which
// validates it and gives the defaults of the keys left out.
type LimitAdaptive struct {
	// MinRate is the floor of the adaptive rate. Required; a rate like
	// Limit.Rate.
	MinRate float64 `yaml:"min_rate" check:"rate"`
	// Decrease multiplies the rate at each push-back, in (0, 1).
	Decrease float64 `yaml:"decrease,omitempty" check:"nonzero"`
	// Increase is what the rate gains every Interval, a rate like
	// Limit.Rate ("1/s").
	Increase float64 `yaml:"increase,omitempty" check:"rate,nonzero"`
	// Interval is the period of Increase.
	Interval Duration `yaml:"interval,omitempty" check:"nonzero"`
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

// Kafka configures the Kafka source (YAML key "source.kafka"). Zero fields
// take the defaults of consumer/kafka. It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type Kafka struct {
	// Brokers lists the host:port of the seed brokers; it is required.
	Brokers []string `yaml:"brokers"`
	// Topic is the topic to consume; it is required and must be a valid
	// Kafka topic name.
	Topic string `yaml:"topic"`
	// Group is the consumer group; it is required.
	Group string `yaml:"group"`
	// Concurrency is how many partitions are worked in parallel. Zero
	// means the consumer's default, 1; not 0 in YAML.
	Concurrency int `yaml:"concurrency,omitempty" check:"nonzero"`
	// DeadLetterTopic receives messages that could not be delivered. Empty
	// means the consumer's default, Topic + ".dlq"; it must differ from
	// Topic.
	DeadLetterTopic string `yaml:"dead_letter_topic"`
	// DelayTopic receives the messages a layer of limit.extra with
	// on_exceed delay sets aside; the group consumes it too. Empty means
	// the consumer's default, Topic + ".delay"; it must differ from Topic
	// and from the dead-letter topic. Groups that consume one topic should
	// each set their own: on a shared one, each skips the messages the
	// others set aside.
	DelayTopic string `yaml:"delay_topic"`
	// StartOffset is first or last; empty means first. It applies to the
	// partitions of Topic without a committed offset; those of DelayTopic
	// always start at first.
	StartOffset StartOffset `yaml:"start_offset"`
	// Ordering is partition, key or none (consumer.Ordering); empty means
	// the consumer's default, partition.
	Ordering consumer.Ordering `yaml:"ordering"`
	// OrderingKey is a message template (sinks/msgtmpl) giving the key
	// for ordering: key, such as '{{index .Headers "x-from"}}'. Empty
	// means the message key. It requires ordering: key.
	OrderingKey string `yaml:"ordering_key"`
	// MaxInFlight bounds the messages handled at once under ordering key
	// or none; under ordering partition, which concurrency bounds, it is
	// an error (kafka.Config.Validate). Zero means the
	// consumer's default (kafka.DefaultMaxInFlight); not 0 in YAML.
	MaxInFlight int `yaml:"max_in_flight,omitempty" check:"nonzero"`
	// SASL configures SASL authentication; it is off by default.
	SASL SASL `yaml:"sasl"`
	// TLS configures TLS to the brokers; it is off by default.
	TLS TLS `yaml:"tls"`
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
// Zero fields take the defaults of consumer/rabbitmq. It is a plain value:
// safe to read concurrently, not to mutate concurrently.
type RabbitMQ struct {
	// URL is the AMQP URL, such as amqp://user:pass@host:5672/vhost. It is
	// required, its scheme must be amqp or amqps, and its password is a
	// secret.
	URL string `yaml:"url"`
	// Queue is the queue to consume; it is required.
	Queue string `yaml:"queue"`
	// Prefetch is the consumer prefetch count, at most 65535. Zero means
	// the consumer's default (rabbitmq.DefaultPrefetch, 50); not 0 in
	// YAML. With delivery.dedupe the broker is asked for twice as many,
	// the deliveries that only wait for their mark not counted
	// (rabbitmq.Config.Prefetch).
	Prefetch int `yaml:"prefetch,omitempty" check:"nonzero"`
	// Concurrency is how many messages are handled in parallel. Zero
	// means the consumer's default, Prefetch; not 0 in YAML.
	Concurrency int `yaml:"concurrency,omitempty" check:"nonzero"`
	// AckDelay is how long a settled delivery's ack may wait to go out
	// with others as one multiple ack (rabbitmq.Config.AckDelay). Zero
	// means the consumer's default, 1ms; not 0 in YAML; negative, such as
	// -1ms, acks each delivery on its own at once.
	AckDelay Duration `yaml:"ack_delay,omitempty" check:"nonzero"`
	// Declare makes the consumer declare the queue (durable) and a
	// dead-letter exchange and queue.
	Declare bool `yaml:"declare"`
	// DeadLetterExchange receives messages that could not be delivered.
	// With Declare it defaults to Queue + ".dlx". Without Declare, setting
	// it makes the consumer publish dead letters there itself (with the
	// x-throttle-* headers, checking at connect that it exists); empty
	// means the broker's own dead-lettering (nack), with a warning at
	// start.
	DeadLetterExchange string `yaml:"dead_letter_exchange"`
	// Ordering is partition, key or none (consumer.Ordering); empty means
	// the consumer's default, partition.
	Ordering consumer.Ordering `yaml:"ordering"`
	// OrderingKey is a message template (sinks/msgtmpl) giving the key
	// for ordering: key. Empty means the routing key. It requires
	// ordering: key.
	OrderingKey string `yaml:"ordering_key"`
	// TLS configures TLS to the broker; it is off by default.
	TLS TLS `yaml:"tls"`
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

// HTTP configures the HTTP sink (YAML key "sink.http"). Its fields are
// those of httpsink.Config (see Libraries.HTTP), whose Validate checks
// them and whose defaults apply to zero fields, but MaxPause. It is a plain value: safe
// to read concurrently, not to mutate concurrently.
type HTTP struct {
	// URL is the request URL; it is required and its scheme must be http
	// or https. A password in it is a secret.
	URL string `yaml:"url"`
	// Method is the request method; empty means httpsink.DefaultMethod,
	// POST.
	Method string `yaml:"method"`
	// Timeout bounds each request. Zero means httpsink.DefaultTimeout
	// (5s); not 0 in YAML.
	Timeout Duration `yaml:"timeout,omitempty" check:"nonzero"`
	// Headers are added to every request, as they are after expansion.
	// Values of headers whose name looks secret (see [IsSecretHeader])
	// are secrets.
	Headers map[string]string `yaml:"headers"`
	// BodyTemplate is an optional message template (package
	// sinks/msgtmpl: .JSON, .Body, .Headers, ... and the functions json
	// and form) producing the request body; empty means the raw message
	// payload.
	BodyTemplate string `yaml:"body_template"`
	// ContentType is the Content-Type of requests; empty means
	// httpsink.DefaultContentType, application/json.
	ContentType string `yaml:"content_type"`
	// MaxConns bounds the connections to the server, and over HTTP/1.1
	// the sends in flight. Zero means httpsink.DefaultMaxConns (64); not 0
	// in YAML.
	MaxConns int `yaml:"max_conns,omitempty" check:"nonzero"`
	// PushBack makes the sink honour 429 and 503 responses (and their
	// Retry-After) by pausing consumption. Nil means the default, true;
	// use [HTTP.PushBackEnabled] to read it.
	PushBack *bool `yaml:"push_back"`
	// MaxPause caps one push-back pause of the shared bucket: it is
	// limiter.Options.MaxPause, the one cap. The binary caps the delay a
	// response asks for (Retry-After) at the bucket's cap too, so that the
	// message that got it is retried when the pause ends. Zero means the
	// limiter's default (60s); not 0 in YAML.
	MaxPause Duration `yaml:"max_pause,omitempty" check:"nonzero"`
	// Preset is a provider preset, one of httpsink.Presets (twilio,
	// vonage, vonage_sms, fcm, apns), or empty. With a preset, URL is
	// optional and replaces the provider's base URL, and every other field
	// set here wins over the preset's.
	Preset string `yaml:"preset,omitempty"`
	// Credentials are the preset's credentials; zero fields come from the
	// environment variables the preset names. Password is a secret.
	Credentials Credentials `yaml:"credentials,omitempty"`
	// Classify is an ordered list of response rules, tried before the
	// preset's and the default ones (httpsink.Rule).
	Classify []Rule `yaml:"classify,omitempty"`
}

// Credentials are a preset's credentials (YAML key
// "sink.http.credentials"); see httpsink.Credentials for each field and
// its environment variable.
type Credentials struct {
	// Username is Twilio's account SID or Vonage's API key.
	Username string `yaml:"username"`
	// Password is Twilio's auth token or Vonage's API secret: a secret.
	Password string `yaml:"password"`
	// KeyFile is the path of FCM's service-account JSON or of the APNs
	// .p8 signing key.
	KeyFile string `yaml:"key_file"`
	// KeyID is the APNs key id.
	KeyID string `yaml:"key_id"`
	// TeamID is the Apple team id.
	TeamID string `yaml:"team_id"`
	// ProjectID is the Firebase project id; by default the key's.
	ProjectID string `yaml:"project_id"`
}

// Rule is one response rule of sink.http.classify; see httpsink.Rule. A
// rule matches when all of the conditions it sets hold.
type Rule struct {
	// Name names the rule in error messages.
	Name string `yaml:"name"`
	// Status lists codes (429), classes ("4xx") or ranges ("500-599").
	Status StringList `yaml:"status"`
	// Headers maps a response header to the values that match; an empty
	// list matches any value.
	Headers map[string]StringList `yaml:"headers"`
	// Body maps a dotted path into the JSON body ("messages.0.status") to
	// the values that match; an empty list matches when the path exists.
	Body map[string]StringList `yaml:"body"`
	// Action is delivered, retry, push_back or permanent.
	Action string `yaml:"action"`
	// Delay is the delay of retry or push_back without a Retry-After.
	Delay Duration `yaml:"delay"`
	// RecipientGone marks a permanent answer meaning the recipient no
	// longer exists (dead-letter header x-throttle-recipient-gone).
	RecipientGone bool `yaml:"recipient_gone"`
}

// StringList is a list of strings that YAML may also give as one scalar:
// status: 429 is status: ["429"].
type StringList []string

// UnmarshalYAML accepts a scalar or a sequence of scalars.
func (l *StringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = StringList{n.Value}
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = s
	return nil
}

// PushBackEnabled reports whether push-back is on; a nil PushBack means on.
func (h HTTP) PushBackEnabled() bool {
	return h.PushBack == nil || *h.PushBack
}

// Postgres configures the PostgreSQL sink (YAML key "sink.postgres"). Its
// fields are those of postgres.Config (see Libraries.Postgres), whose
// Validate checks them. It is a plain value: safe to read concurrently, not
// to mutate concurrently.
type Postgres struct {
	// DSN is the connection string, as a URL (postgres://...) or in
	// key=value form. It is required and a password in it is a secret.
	DSN string `yaml:"dsn"`
	// Table is the table rows are inserted into. It is required, and
	// postgres.ValidateTable says which names are valid.
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

// Delivery configures delivery retries (YAML key "delivery"). Zero fields
// take the defaults of consumer.RetryPolicy and of the consumers. It is a
// plain value: safe to read concurrently, not to mutate concurrently.
type Delivery struct {
	// MaxAttempts is the number of delivery attempts before a message is
	// dead-lettered. Zero means the retry policy's default (5); not 0 in
	// YAML.
	MaxAttempts int `yaml:"max_attempts,omitempty" check:"nonzero"`
	// Backoff is the pause before the first retry; it doubles on each
	// further retry. Zero means the retry policy's default (200ms); not 0
	// in YAML.
	Backoff Duration `yaml:"backoff,omitempty" check:"nonzero"`
	// MaxBackoff caps the pause between retries; when both are set it
	// must be >= Backoff (consumer.Options.Validate). Zero means the retry policy's default (30s); not
	// 0 in YAML.
	MaxBackoff Duration `yaml:"max_backoff,omitempty" check:"nonzero"`
	// DrainTimeout bounds how long in-flight messages may finish on
	// shutdown. Zero means the consumer's default (30s); not 0 in YAML.
	DrainTimeout Duration `yaml:"drain_timeout,omitempty" check:"nonzero"`
	// MaxSetAside caps one stay of a message in the delay topic or queue
	// of a limit.extra layer with on_exceed delay
	// (consumer.Options.MaxSetAside). Zero means the consumer's default
	// (1m); not 0 in YAML.
	MaxSetAside Duration `yaml:"max_set_aside,omitempty" check:"nonzero"`
	// Dedupe, when set, sends a message whose key was already sent
	// never again (consumer.Dedupe, with the claims and marks in Redis:
	// consumer/redisdedupe, in the namespace limit.bucket). Default: off.
	Dedupe *Dedupe `yaml:"dedupe,omitempty"`
}

// Dedupe configures dedupe (YAML key "delivery.dedupe"): the fields of
// consumer.Dedupe, whose defaults apply to the zero ones. It is a plain
// value: safe to read concurrently, not to mutate concurrently.
type Dedupe struct {
	// Key is the template of a message's dedupe key, such as
	// '{{index .Headers "message-id"}}'. Required. A missing or null
	// value renders the empty key: no key (see RequireKey).
	Key string `yaml:"key"`
	// Window is how long a key stays marked sent. Zero means the
	// consumer's default (24h); not 0 in YAML.
	Window Duration `yaml:"window,omitempty" check:"nonzero"`
	// ClaimTTL is how long a claim outlives a replica that died holding
	// it. Zero means the consumer's derivation: the sink's timeout
	// (sink.http.timeout, else 10s) × delivery.max_attempts; not 0 in
	// YAML.
	ClaimTTL Duration `yaml:"claim_ttl,omitempty" check:"nonzero"`
	// OnStoreError is what happens while Redis fails: local, closed or
	// open, as limit.on_store_error. Empty means the consumer's default,
	// local.
	OnStoreError StoreErrorPolicy `yaml:"on_store_error"`
	// RequireKey dead-letters a message without a key instead of sending
	// it without dedupe.
	RequireKey bool `yaml:"require_key"`
}

// Metrics configures the Prometheus endpoint (YAML key "metrics"). It is a
// plain value: safe to read concurrently, not to mutate concurrently.
type Metrics struct {
	// Listen is the host:port the metrics server listens on. It defaults
	// to 127.0.0.1:9464; port 0 lets the system pick one (the "serving
	// metrics" log line says which); "" or "off" disables the server.
	Listen string `yaml:"listen"`
}

// Enabled reports whether the metrics server should run.
func (m Metrics) Enabled() bool {
	return m.Listen != "" && m.Listen != "off"
}

// Console configures the web console (YAML key "console"): one page
// showing the buckets, replicas, classes and layers, with the operator's
// actions behind a token. It is a plain value: safe to read concurrently,
// not to mutate concurrently.
type Console struct {
	// Listen is the host:port the console serves on. 'throttle console'
	// defaults to DefaultConsoleListen; a replica ('throttle run') serves
	// none unless it is set. "off" disables it in both. Port 0 lets the
	// system pick one (the "serving the console" log line says which). The
	// host must be a loopback address (127.0.0.1, ::1, localhost) unless
	// AllowRemote is set.
	Listen string `yaml:"listen"`
	// Token allows the actions (set rate, clear override, fill, pause,
	// resume), sent as "Authorization: Bearer TOKEN". Empty means the
	// console is read-only. At least 16 characters; it is a secret, best
	// given as "${THROTTLE_CONSOLE_TOKEN}".
	Token string `yaml:"token"`
	// AllowRemote lets Listen name an address other than loopback, such as
	// 0.0.0.0:8090. The console has no TLS: put it behind a proxy that
	// terminates TLS before allowing remote access with a token.
	AllowRemote bool `yaml:"allow_remote"`
}

// DefaultConsoleListen is where 'throttle console' listens when
// console.listen is not set.
const DefaultConsoleListen = "127.0.0.1:8090"

// MinConsoleToken is the shortest console.token accepted.
const MinConsoleToken = 16

// Enabled reports whether a replica serves the console: Listen is set and
// not "off".
func (c Console) Enabled() bool {
	return c.Listen != "" && c.Listen != "off"
}

// Tracing configures OpenTelemetry tracing (YAML key "tracing",
// docs/tracing.md): a span per message, continuing the W3C traceparent
// of its headers, exported over OTLP/HTTP to where the standard
// OTEL_EXPORTER_OTLP_* variables say. It is a plain value: safe to read
// concurrently, not to mutate concurrently.
type Tracing struct {
	// Enabled turns tracing on. Default false: no spans, no exporter.
	Enabled bool `yaml:"enabled"`
	// SampleRatio is the share of the traces starting at a replica that
	// are sampled (telemetry.Options.SampleRatio); default 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
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

// Default returns a Config holding the defaults that belong to the binary
// rather than to a library: the metrics address and the log settings. Every
// other field is zero, meaning the default of the library it is handed to.
// It has no source and no sink, so it is not valid by itself; Parse decodes
// the YAML on top of it.
func Default() Config {
	return Config{
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
				if p.Line == 0 {
					p.Line = w.lines[p.Key]
				}
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

// applyDerivedDefaults fills the one default the binary reads back from
// the configuration: the burst, which replicas report and the CLI shows.
// It comes from the store (redislimiter.Config.WithDefaults), never from a
// copy of its rule.
func (c *Config) applyDerivedDefaults() {
	c.Limit.Burst = c.Limit.bucketConfig().WithDefaults().Burst
}

// String returns the configuration as YAML with every secret replaced by
// "xxxxx" (see [Config.Redacted]), so a Config can be logged safely.
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
