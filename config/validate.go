package config

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// Problem is one thing wrong with a configuration. It is a plain value and
// safe for concurrent use.
type Problem struct {
	// Key is the dotted path of the key concerned, such as "limit.rate" or
	// "source.kafka.brokers[0]"; it is empty for the document as a whole.
	Key string
	// Message says what is wrong, such as "must be > 0, got -5".
	Message string
	// Line is the line of the key concerned in the YAML document, 0 when
	// the key is absent or the Config was not parsed from YAML.
	Line int
}

// String returns "key: message (line N)", without the key when it is
// empty and without the line when it is unknown.
func (p Problem) String() string {
	s := p.Message
	if p.Key != "" {
		s = p.Key + ": " + s
	}
	if p.Line > 0 {
		s += " (line " + strconv.Itoa(p.Line) + ")"
	}
	return s
}

// ValidationError lists every problem found in a configuration. It is a
// plain value: safe to read concurrently, not to mutate concurrently.
type ValidationError struct {
	// Problems holds at least one problem, in document or field order.
	Problems []Problem
}

// Error returns the problems one per line.
func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

type problems []Problem

// add records a problem at key, once: a problem already recorded with the
// same key and message is not repeated.
func (ps *problems) add(key, format string, args ...any) {
	p := Problem{Key: key, Message: fmt.Sprintf(format, args...)}
	if !slices.Contains(*ps, p) {
		*ps = append(*ps, p)
	}
}

// Validate checks every setting of c and returns a *ValidationError listing
// all problems, or nil. Zero fields mean the libraries' defaults and are
// valid. It maps c onto the libraries' configurations as
// [Config.Libraries] does and checks the result with each library's own
// validation (redislimiter.Config.Validate, limiter.Options.Validate,
// limiter.Layers.Validate, consumer.LimitOptions.Validate,
// kafka.Config.Validate, rabbitmq.Config.Validate,
// httpsink.Config.Validate, postgres.Config.Validate), naming each problem
// by its YAML key; config adds no rule of its own to theirs. What is
// config's own is checked here: the Redis connection (redis.*), metrics.*,
// console.* and log.*, and that exactly one source and one sink are set. It does not
// modify c, does not read any file and makes no network call.
func (c *Config) Validate() error {
	if c == nil {
		return &ValidationError{Problems: []Problem{{Message: "config is nil"}}}
	}
	var ps problems
	c.Redis.validate(&ps)
	lib, opts := c.libraries(&ps, false)
	lib.validate(&ps, c, opts)
	c.Metrics.validate(&ps)
	c.Console.validate(&ps)
	c.Log.validate(&ps)
	if len(ps) > 0 {
		return &ValidationError{Problems: ps}
	}
	return nil
}

// validate checks lib, mapped from c, with the libraries' validation. opts
// are the consumer options of the delivery and limit sections alone,
// checked even when no source is set.
func (lib *Libraries) validate(ps *problems, c *Config, opts consumer.Options) {
	ps.library(limitKeys, lib.Bucket.Validate())
	ps.library(limiterKeys, lib.Limiter.Validate())
	if a := lib.Limiter.Adaptive; a != nil {
		// The rules that need the rate; Validate's own ones repeat above
		// and are recorded once.
		ps.library(limiterKeys, a.ValidateFor(lib.Bucket.Rate))
	}
	c.Limit.validateLayers(ps, lib.Layers)
	c.Limit.validateFair(ps, lib.Fair)
	ps.library(limiterKeys, lib.Limiter.ValidateFair(lib.Fair))
	ps.library(limitKeys, lib.Limit.Validate())
	ps.library(limitKeys, lib.Limit.ValidateLayers(lib.Layers))

	// The consumer's rules about its limiter hold for the one the binary
	// adds.
	opts.Limiter = standInLimiter{}
	ps.library(deliveryKeys, opts.Validate())
	if lib.Kafka != nil {
		kc := *lib.Kafka
		kc.Limiter = opts.Limiter
		ps.library(c.Source.Kafka.keys(), kc.Validate())
	}
	if lib.RabbitMQ != nil {
		rc := *lib.RabbitMQ
		rc.Limiter = opts.Limiter
		ps.library(rabbitMQKeys, rc.Validate())
	}
	checkOneOf(ps, "source", []string{"kafka", "rabbitmq"}, set(c.Source.Kafka != nil, "kafka", c.Source.RabbitMQ != nil, "rabbitmq"))

	if lib.HTTP != nil {
		ps.library(httpKeys, lib.HTTP.Validate())
	}
	if lib.Postgres != nil {
		ps.library(postgresKeys, lib.Postgres.Validate())
	}
	checkOneOf(ps, "sink", []string{"http", "postgres", "stdout"}, set(c.Sink.HTTP != nil, "http", c.Sink.Postgres != nil, "postgres", c.Sink.Stdout != nil, "stdout"))

	if lib.Tracing != nil {
		if err := lib.Tracing.Validate(); err != nil {
			ps.add("tracing.sample_ratio", "%s", err)
		}
	} else if c.Tracing.SampleRatio != nil {
		ps.add("tracing.sample_ratio", "has no effect unless tracing.enabled is true")
	}
}

// standInLimiter stands for the limiter the binary gives the consumer, so
// that the consumer's rules about a cost without a limiter pass.
type standInLimiter struct{}

func (standInLimiter) Wait(context.Context, int) error { return nil }

// set returns the names whose condition holds, from pairs of a condition
// and a name.
func set(pairs ...any) []string {
	var out []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i].(bool) {
			out = append(out, pairs[i+1].(string))
		}
	}
	return out
}

func (r *Redis) validate(ps *problems) {
	if r.Addr != "" && len(r.Addrs) > 0 {
		ps.add("redis", "set either addr or addrs, not both")
	}
	if r.Addr != "" {
		checkAddr(ps, "redis.addr", r.Addr, false)
	}
	for i, a := range r.Addrs {
		checkAddr(ps, fmt.Sprintf("redis.addrs[%d]", i), a, false)
	}
	if r.MasterName != "" && len(r.Addrs) == 0 {
		ps.add("redis.master_name", "requires redis.addrs (the sentinel addresses)")
	}
	if r.MasterName == "" {
		if r.SentinelUsername != "" {
			ps.add("redis.sentinel_username", "has no effect without redis.master_name")
		}
		if r.SentinelPassword != "" {
			ps.add("redis.sentinel_password", "has no effect without redis.master_name")
		}
	}
	switch {
	case r.DB < 0:
		ps.add("redis.db", "must be >= 0, got %d", r.DB)
	case r.DB != 0 && r.Mode() == RedisCluster:
		ps.add("redis.db", "must be 0 with a cluster (redis.addrs without master_name), got %d", r.DB)
	}
	if r.Timeout < 0 {
		ps.add("redis.timeout", "must be > 0, got %v", r.Timeout)
	}
	r.TLS.validate(ps, "redis.tls")
}

// validate checks the TLS section at key and reports whether a client
// configuration can be made from it: TLS is on and cert_file and key_file
// are set together.
func (t *TLS) validate(ps *problems, key string) bool {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify {
			ps.add(key, "settings have no effect unless %s.enabled is true", key)
		}
		return false
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		ps.add(key, "cert_file and key_file must be set together")
		return false
	}
	return true
}

func (m *Metrics) validate(ps *problems) {
	if m.Enabled() {
		checkAddr(ps, "metrics.listen", m.Listen, true)
	}
}

func (c *Console) validate(ps *problems) {
	if c.Enabled() {
		checkAddr(ps, "console.listen", c.Listen, true)
		if host, _, err := net.SplitHostPort(c.Listen); err == nil && !c.AllowRemote && !IsLoopbackHost(host) {
			ps.add("console.listen", "must be a loopback address (127.0.0.1, ::1 or localhost) unless console.allow_remote is true, got %q", c.Listen)
		}
	}
	if c.Token != "" && len(c.Token) < MinConsoleToken {
		ps.add("console.token", "must be at least %d characters, got %d", MinConsoleToken, len(c.Token))
	}
}

// IsLoopbackHost reports whether host (of a host:port) names only the
// loopback interface: localhost, or a loopback IP. An empty host, which
// means every interface, is not.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (l *Log) validate(ps *problems) {
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		ps.add("log.level", "must be one of debug, info, warn, error, got %q", l.Level)
	}
	switch l.Format {
	case "text", "json":
	default:
		ps.add("log.format", "must be one of text, json, got %q", l.Format)
	}
}

// checkOneOf reports unless exactly one of the choices was set.
func checkOneOf(ps *problems, key string, choices, set []string) {
	if len(set) == 1 {
		return
	}
	msg := fmt.Sprintf("exactly one of %s must be set, got %d", strings.Join(choices, ", "), len(set))
	if len(set) > 1 {
		msg += " (" + strings.Join(set, ", ") + ")"
	}
	ps.add(key, "%s", msg)
}

// checkAddr reports unless addr is host:port with a numeric port, which may
// be 0 (the system picks one) only when zeroPort is set. The host may be
// empty, meaning the local host.
func checkAddr(ps *problems, key, addr string, zeroPort bool) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		reason := err.Error()
		if errors.As(err, &ae) {
			reason = ae.Err
		}
		ps.add(key, "must be host:port, got %q: %s", RedactURL(addr), reason)
		return
	}
	n, err := strconv.ParseUint(port, 10, 16)
	switch {
	case zeroPort && (err != nil):
		ps.add(key, "port must be a number between 0 (any free port) and 65535, got %q", port)
	case !zeroPort && (err != nil || n == 0):
		ps.add(key, "port must be a number between 1 and 65535, got %q", port)
	}
}

// libraryKeys names the YAML key of each field of one library's
// configuration, whose validation names its Go fields
// (limiter.ParamError.Param, consumer.FieldError.Field). Most lie in the
// YAML section at section, whose type t names them the library's way
// (found by Go name or YAML name, compared without case, "_" or "."): so
// "FallbackRate" lands on limit.fallback_rate. alias gives the full YAML
// key of the others. A field neither knows (one the configuration never
// sets) is reported under section.
type libraryKeys struct {
	section string
	t       reflect.Type
	alias   map[string]string
}

// The YAML keys of the libraries' configurations in Libraries.
var (
	limitKeys   = libraryKeys{"limit", reflect.TypeFor[Limit](), map[string]string{"WaitTimeout": "limit.max_wait", "Prices": "limit.prices", "Recipient": "limit.prices.recipient"}}
	limiterKeys = libraryKeys{"limit", reflect.TypeFor[Limit](), map[string]string{"MaxPause": "sink.http.max_pause"}}
	// deliveryAlias names the consumer options that come from delivery.*.
	deliveryAlias = map[string]string{
		"Retry.MaxAttempts":   "delivery.max_attempts",
		"Retry.Backoff":       "delivery.backoff",
		"Retry.MaxBackoff":    "delivery.max_backoff",
		"DrainTimeout":        "delivery.drain_timeout",
		"MaxSetAside":         "delivery.max_set_aside",
		"Dedupe.Key":          "delivery.dedupe.key",
		"Dedupe.Window":       "delivery.dedupe.window",
		"Dedupe.ClaimTTL":     "delivery.dedupe.claim_ttl",
		"Dedupe.OnStoreError": "delivery.dedupe.on_store_error",
		"Dedupe.SendTimeout":  "sink.http.timeout",
	}
	deliveryKeys = libraryKeys{"delivery", reflect.TypeFor[Delivery](), deliveryAlias}
	kafkaKeys    = libraryKeys{"source.kafka", reflect.TypeFor[Kafka](), deliveryAlias}
	rabbitMQKeys = libraryKeys{"source.rabbitmq", reflect.TypeFor[RabbitMQ](), deliveryAlias}
	httpKeys     = libraryKeys{"sink.http", reflect.TypeFor[HTTP](), map[string]string{"Rules": "sink.http.classify"}}
	postgresKeys = libraryKeys{"sink.postgres", reflect.TypeFor[Postgres](), nil}
)

// keys returns the YAML keys of the Kafka consumer's configuration: its
// one bound, Options.Concurrency, comes from max_in_flight under ordering
// key and none, and from concurrency under partition.
func (k *Kafka) keys() libraryKeys {
	if k.Ordering != consumer.OrderKey && k.Ordering != consumer.OrderNone {
		return kafkaKeys
	}
	alias := maps.Clone(kafkaKeys.alias)
	alias["Concurrency"] = kafkaKeys.section + ".max_in_flight"
	return libraryKeys{kafkaKeys.section, kafkaKeys.t, alias}
}

// key returns the YAML key of the library field named field.
func (k libraryKeys) key(field string) string {
	if key, ok := k.alias[field]; ok {
		return key
	}
	if key := yamlKeyOf(k.t, field); key != "" {
		return k.section + "." + key
	}
	return k.section
}

// library records the problems a library's validation returned, err, each
// under the YAML key k gives its field.
func (ps *problems) library(k libraryKeys, err error) {
	for _, err := range leaves(err) {
		var (
			fe *consumer.FieldError
			pe *limiter.ParamError
		)
		switch {
		case errors.As(err, &fe):
			key := k.key(fe.Field)
			if fe.Key != "" {
				key += "." + fe.Key
			}
			ps.add(key, "%s", fe.Err)
		case errors.As(err, &pe):
			ps.add(k.key(pe.Param), "%s", paramMessage(pe))
		default:
			ps.add(k.section, "%s", err)
		}
	}
}

// leaves returns the errors joined in err (errors.Join, recursively), or
// err itself; nil for nil.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, leaves(e)...)
	}
	return out
}

// paramMessage returns the text of a limiter.ParamError without the Go
// name of the parameter, or err's text for another error.
func paramMessage(err error) string {
	var pe *limiter.ParamError
	if errors.As(err, &pe) {
		return strings.TrimPrefix(pe.Error(), pe.Param+": ")
	}
	return err.Error()
}

// yamlKeyOf returns the YAML name of the field of struct type t that a
// library calls goName, as libraryKeys describes, or "" when there is
// none.
func yamlKeyOf(t reflect.Type, goName string) string {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", ".", "").Replace(s))
	}
	want := norm(goName)
	// An element of a list, such as kafka's "Brokers[0]", keeps its index
	// under the list's key: brokers[0].
	if i := strings.IndexByte(goName, '['); i > 0 {
		if key := yamlKeyOf(t, goName[:i]); key != "" {
			return key + goName[i:]
		}
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if norm(f.Name) == want || norm(name) == want {
			return name
		}
	}
	// A nested library field, such as limiter's "Lease.Fraction", lands
	// under the key of its first part: limit.lease.fraction.
	if first, rest, ok := strings.Cut(goName, "."); ok {
		if key := yamlKeyOf(t, first); key != "" {
			return key + "." + snakeCase(rest)
		}
	}
	return ""
}

// snakeCase turns a Go name such as "MinBatch" or "Lease.MinBatch" into
// YAML style: "min_batch", "lease.min_batch".
func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 && s[i-1] != '.' {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
