package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks"
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
// valid. Settings handed to a library are checked by that library's own
// exported validation (httpsink.Config.Validate, postgres.Config.Validate,
// redislimiter.Config.Validate, limiter.Options.Validate, ...), with each
// problem named by its YAML key. It does not modify c, does not read any
// file and makes no network call.
func (c *Config) Validate() error {
	if c == nil {
		return &ValidationError{Problems: []Problem{{Message: "config is nil"}}}
	}
	var ps problems
	c.Redis.validate(&ps)
	c.Limit.validate(&ps)
	c.Source.validate(&ps)
	c.Sink.validate(&ps)
	c.Delivery.validate(&ps)
	c.Metrics.validate(&ps)
	c.Log.validate(&ps)
	if len(ps) > 0 {
		return &ValidationError{Problems: ps}
	}
	return nil
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

func (t *TLS) validate(ps *problems, key string) {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify {
			ps.add(key, "settings have no effect unless %s.enabled is true", key)
		}
		return
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		ps.add(key, "cert_file and key_file must be set together")
	}
}

func (l *Limit) validate(ps *problems) {
	defer l.validateExtra(ps)
	ps.library("limit", reflect.TypeFor[Limit](), l.StoreConfig().Validate())
	ps.library("limit", reflect.TypeFor[Limit](), l.LimiterOptions().Validate())
	if a := l.Adaptive.Limiter(); a != nil {
		// The rules that need the rate; Validate's own ones repeat above
		// and are recorded once.
		ps.library("limit", reflect.TypeFor[Limit](), a.ValidateFor(l.Rate))
	}
	_, err := limiter.ParsePriority(l.Priority)
	ps.library("limit", reflect.TypeFor[Limit](), err)
	_, errs := l.minShare()
	for _, err := range errs {
		ps.add("limit.min_share", "a key %s", paramMessage(err))
	}
	if l.MaxWait < 0 {
		ps.add("limit.max_wait", "must be >= 0, got %v", l.MaxWait)
	}
	switch l.Lease {
	case "", LeaseAuto, LeaseOff:
	default:
		ps.add("limit.lease", "must be one of auto, off, got %q", l.Lease)
	}
	if l.CostTemplate != "" {
		if l.CostHeader != "" {
			ps.add("limit.cost_template", "set either limit.cost_header or limit.cost_template, not both")
		}
		if _, err := l.CostFunc(); err != nil {
			ps.add("limit.cost_template", "%s", err)
		}
	}
}

func (s *Source) validate(ps *problems) {
	var set []string
	if s.Kafka != nil {
		set = append(set, "kafka")
		s.Kafka.validate(ps)
	}
	if s.RabbitMQ != nil {
		set = append(set, "rabbitmq")
		s.RabbitMQ.validate(ps)
	}
	checkOneOf(ps, "source", []string{"kafka", "rabbitmq"}, set)
}

func (k *Kafka) validate(ps *problems) {
	const key = "source.kafka"
	var opts consumer.Options
	if f, err := k.KeyFunc(); err != nil {
		ps.add(key+".ordering_key", "%v", err)
	} else {
		opts.OrderingKey = f
	}
	ps.library(key, reflect.TypeFor[Kafka](), k.ConsumerConfig(opts, nil).Validate())
	switch k.StartOffset {
	case "", StartFirst, StartLast:
	default:
		ps.add(key+".start_offset", "must be one of first, last, got %q", k.StartOffset)
	}
	switch k.SASL.Mechanism {
	case SASLNone:
		if k.SASL.Username != "" || k.SASL.Password != "" {
			ps.add(key+".sasl", "username and password have no effect unless %s.sasl.mechanism is set", key)
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if k.SASL.Username == "" {
			ps.add(key+".sasl.username", "required when mechanism is %s", k.SASL.Mechanism)
		}
	default:
		ps.add(key+".sasl.mechanism", "must be one of plain, scram-sha-256, scram-sha-512 or empty, got %q", k.SASL.Mechanism)
	}
	k.TLS.validate(ps, key+".tls")
}

func (q *RabbitMQ) validate(ps *problems) {
	const key = "source.rabbitmq"
	var tlsConf *tls.Config
	if q.TLS.Enabled {
		// A stand-in: the files are read when the consumer is built.
		tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	var opts consumer.Options
	if f, err := q.KeyFunc(); err != nil {
		ps.add(key+".ordering_key", "%v", err)
	} else {
		opts.OrderingKey = f
	}
	ps.library(key, reflect.TypeFor[RabbitMQ](), q.ConsumerConfig(tlsConf, opts).Validate())
	q.TLS.validate(ps, key+".tls")
}

func (s *Sink) validate(ps *problems) {
	var set []string
	if s.HTTP != nil {
		set = append(set, "http")
		s.HTTP.validate(ps)
	}
	if s.Postgres != nil {
		set = append(set, "postgres")
		s.Postgres.validate(ps)
	}
	if s.Stdout != nil {
		set = append(set, "stdout")
	}
	checkOneOf(ps, "sink", []string{"http", "postgres", "stdout"}, set)
}

func (h *HTTP) validate(ps *problems) {
	ps.library("sink.http", reflect.TypeFor[HTTP](), h.SinkConfig().Validate())
}

func (p *Postgres) validate(ps *problems) {
	ps.library("sink.postgres", reflect.TypeFor[Postgres](), p.SinkConfig().Validate())
}

func (d *Delivery) validate(ps *problems) {
	opts := consumer.Options{Retry: d.RetryPolicy(), DrainTimeout: time.Duration(d.DrainTimeout), MaxSetAside: time.Duration(d.MaxSetAside)}
	ps.library("delivery", reflect.TypeFor[Delivery](), opts.Validate())
}

func (m *Metrics) validate(ps *problems) {
	if m.Enabled() {
		checkAddr(ps, "metrics.listen", m.Listen, true)
	}
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

// library records the problems a library's validation returned, err, under
// the YAML keys of the section at prefix, whose Go type is t. Libraries
// name their Go fields (limiter.ParamError.Param, sinks.FieldError.Field);
// the field is found in t by its Go name or by its YAML name, compared
// without case and without "_" or ".", so "FallbackRate" and
// "fallback_rate" both land on limit.fallback_rate. A field t does not
// know (one the configuration never sets) is reported under prefix.
func (ps *problems) library(prefix string, t reflect.Type, err error) {
	for _, err := range leaves(err) {
		var (
			fe *sinks.FieldError
			pe *limiter.ParamError
		)
		switch {
		case errors.As(err, &fe):
			key := join(prefix, yamlKeyOf(t, fe.Field))
			if fe.Key != "" {
				key += "." + fe.Key
			}
			ps.add(key, "%s", fe.Err)
		case errors.As(err, &pe):
			ps.add(join(prefix, yamlKeyOf(t, pe.Param)), "%s", paramMessage(pe))
		default:
			ps.add(prefix, "%s", err)
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
// library calls goName, as library describes, or "" when there is none.
func yamlKeyOf(t reflect.Type, goName string) string {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", ".", "").Replace(s))
	}
	want := norm(goName)
	if alias, ok := libraryNames[t.Name()+"."+goName]; ok {
		return alias
	}
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

// libraryNames maps the library fields whose name differs from the
// configuration's, as "ConfigType.LibraryField", to their YAML key.
var libraryNames = map[string]string{
	"Delivery.Retry.MaxAttempts": "max_attempts",
	"Delivery.Retry.Backoff":     "backoff",
	"Delivery.Retry.MaxBackoff":  "max_backoff",
	"HTTP.MaxRetryAfter":         "max_pause",
	"HTTP.Rules":                 "classify",
}
