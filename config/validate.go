package config

import (
	"errors"
	"fmt"
	"math"
	"mime"
	"net"
	"net/url"
	"strconv"
	"strings"
	"text/template"
	"unicode"
)

// Problem is one thing wrong with a configuration. It is a plain value and
// safe for concurrent use.
type Problem struct {
	// Key is the dotted path of the key concerned, such as "limit.rate" or
	// "source.kafka.brokers[0]"; it is empty for the document as a whole.
	Key string
	// Message says what is wrong, such as "must be > 0, got -5".
	Message string
}

// String returns "key: message".
func (p Problem) String() string {
	if p.Key == "" {
		return p.Message
	}
	return p.Key + ": " + p.Message
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

func (ps *problems) add(key, format string, args ...any) {
	*ps = append(*ps, Problem{Key: key, Message: fmt.Sprintf(format, args...)})
}

// Validate checks every setting of c, which must already hold its defaults
// (as Parse ensures), and returns a *ValidationError listing all problems, or
// nil. It does not modify c and does not read any file.
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
		checkAddr(ps, "redis.addr", r.Addr)
	}
	for i, a := range r.Addrs {
		checkAddr(ps, fmt.Sprintf("redis.addrs[%d]", i), a)
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
	if r.Timeout <= 0 {
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
	switch {
	case l.Bucket == "":
		ps.add("limit.bucket", "required")
	case strings.ContainsAny(l.Bucket, "{}"):
		ps.add("limit.bucket", "must not contain '{' or '}', got %q", l.Bucket)
	case strings.IndexFunc(l.Bucket, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		ps.add("limit.bucket", "must not contain spaces or control characters, got %q", l.Bucket)
	}
	switch {
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0):
		ps.add("limit.rate", "must be a finite number, got %v", l.Rate)
	case l.Rate <= 0:
		ps.add("limit.rate", "must be > 0, got %v", l.Rate)
	}
	rateOK := l.Rate > 0 && !math.IsInf(l.Rate, 1)
	if l.Burst < 1 && (l.Burst != 0 || rateOK) {
		ps.add("limit.burst", "must be >= 1, got %d", l.Burst)
	}
	switch l.OnStoreError {
	case StoreErrorLocal, StoreErrorClosed, StoreErrorOpen:
	default:
		ps.add("limit.on_store_error", "must be one of local, closed, open, got %q", l.OnStoreError)
	}
	if math.IsNaN(l.FallbackRate) || math.IsInf(l.FallbackRate, 0) || l.FallbackRate < 0 {
		ps.add("limit.fallback_rate", "must be a finite number >= 0, got %v", l.FallbackRate)
	}
	if l.ProbeInterval <= 0 {
		ps.add("limit.probe_interval", "must be > 0, got %v", l.ProbeInterval)
	}
	if l.MaxWait < 0 {
		ps.add("limit.max_wait", "must be >= 0, got %v", l.MaxWait)
	}
	switch l.Lease {
	case LeaseAuto, LeaseOff:
	default:
		ps.add("limit.lease", "must be one of auto, off, got %q", l.Lease)
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
	if len(k.Brokers) == 0 {
		ps.add(key+".brokers", "required (at least one host:port)")
	}
	for i, b := range k.Brokers {
		checkAddr(ps, fmt.Sprintf("%s.brokers[%d]", key, i), b)
	}
	if k.Topic == "" {
		ps.add(key+".topic", "required")
	} else {
		checkTopic(ps, key+".topic", k.Topic)
	}
	if k.Group == "" {
		ps.add(key+".group", "required")
	}
	if k.Concurrency < 1 {
		ps.add(key+".concurrency", "must be >= 1, got %d", k.Concurrency)
	}
	if k.DeadLetterTopic != "" {
		checkTopic(ps, key+".dead_letter_topic", k.DeadLetterTopic)
		if k.DeadLetterTopic == k.Topic {
			ps.add(key+".dead_letter_topic", "must differ from %s.topic", key)
		}
	}
	switch k.StartOffset {
	case StartFirst, StartLast:
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
	checkURL(ps, key+".url", q.URL, "amqp", "amqps")
	if q.Queue == "" {
		ps.add(key+".queue", "required")
	}
	if q.Prefetch < 1 || q.Prefetch > math.MaxUint16 {
		ps.add(key+".prefetch", "must be between 1 and 65535, got %d", q.Prefetch)
	}
	if q.Concurrency < 1 && (q.Concurrency != 0 || q.Prefetch >= 1) {
		ps.add(key+".concurrency", "must be >= 1, got %d", q.Concurrency)
	}
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
	const key = "sink.http"
	checkURL(ps, key+".url", h.URL, "http", "https")
	if !isToken(h.Method) {
		ps.add(key+".method", "must be an HTTP method such as POST, got %q", h.Method)
	}
	if h.Timeout <= 0 {
		ps.add(key+".timeout", "must be > 0, got %v", h.Timeout)
	}
	for name, value := range h.Headers {
		if !isToken(name) {
			ps.add(key+".headers", "invalid header name %q", name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			// Never echo the value: it may be a credential.
			ps.add(key+".headers."+name, "value must not contain CR, LF or NUL")
		}
	}
	if h.BodyTemplate != "" {
		if _, err := template.New("body").Parse(h.BodyTemplate); err != nil {
			ps.add(key+".body_template", "%v", err)
		}
	}
	if _, _, err := mime.ParseMediaType(h.ContentType); err != nil {
		ps.add(key+".content_type", "invalid media type %q: %v", h.ContentType, err)
	}
	if h.MaxConns < 1 {
		ps.add(key+".max_conns", "must be >= 1, got %d", h.MaxConns)
	}
	if h.MaxPause <= 0 {
		ps.add(key+".max_pause", "must be > 0, got %v", h.MaxPause)
	}
}

func (p *Postgres) validate(ps *problems) {
	const key = "sink.postgres"
	switch {
	case p.DSN == "":
		ps.add(key+".dsn", "required")
	case hasURLScheme(p.DSN):
		u, err := url.Parse(p.DSN)
		switch {
		case err != nil:
			ps.add(key+".dsn", "invalid URL %s: %v", RedactURL(p.DSN), urlErr(err))
		case u.Scheme != "postgres" && u.Scheme != "postgresql":
			ps.add(key+".dsn", "URL scheme must be postgres or postgresql, got %q", u.Scheme)
		}
	default:
		if _, err := parseKeyValues(p.DSN); err != nil {
			ps.add(key+".dsn", "not a postgres:// URL nor a valid key=value connection string: %v", err)
		}
	}
	switch {
	case p.Table == "":
		ps.add(key+".table", "required")
	case !isTableName(p.Table):
		ps.add(key+".table", "must be an unquoted SQL identifier such as deliveries or myschema.deliveries, got %q", p.Table)
	}
}

func (d *Delivery) validate(ps *problems) {
	if d.MaxAttempts < 1 {
		ps.add("delivery.max_attempts", "must be >= 1, got %d", d.MaxAttempts)
	}
	if d.Backoff <= 0 {
		ps.add("delivery.backoff", "must be > 0, got %v", d.Backoff)
	}
	if d.MaxBackoff < d.Backoff {
		ps.add("delivery.max_backoff", "must be >= delivery.backoff (%v), got %v", d.Backoff, d.MaxBackoff)
	}
	if d.DrainTimeout <= 0 {
		ps.add("delivery.drain_timeout", "must be > 0, got %v", d.DrainTimeout)
	}
}

func (m *Metrics) validate(ps *problems) {
	if m.Enabled() {
		checkAddr(ps, "metrics.listen", m.Listen)
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

// checkAddr reports unless addr is host:port with a numeric port. The host
// may be empty, meaning the local host.
func checkAddr(ps *problems, key, addr string) {
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
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		ps.add(key, "port must be a number between 1 and 65535, got %q", port)
	}
}

// checkURL reports unless raw is an absolute URL with a host and one of the
// given schemes. Messages never include a password from raw.
func checkURL(ps *problems, key, raw string, schemes ...string) {
	if raw == "" {
		ps.add(key, "required")
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		ps.add(key, "invalid URL %s: %v", RedactURL(raw), urlErr(err))
		return
	}
	ok := false
	for _, s := range schemes {
		ok = ok || u.Scheme == s
	}
	if !ok {
		ps.add(key, "scheme must be %s, got %q", strings.Join(schemes, " or "), u.Scheme)
		return
	}
	if u.Host == "" {
		ps.add(key, "must include a host, got %s", RedactURL(raw))
	}
}

// urlErr strips the URL, which may hold a password, from a url.Parse error.
func urlErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// checkTopic reports unless name is a legal Kafka topic name.
func checkTopic(ps *problems, key, name string) {
	valid := len(name) <= 249 && name != "." && name != ".."
	for _, c := range name {
		valid = valid && (c == '.' || c == '_' || c == '-' ||
			c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	}
	if !valid {
		ps.add(key, "must be a Kafka topic name (at most 249 of a-z A-Z 0-9 . _ -), got %q", name)
	}
}

// isToken reports whether s is a non-empty RFC 9110 token, as HTTP methods
// and header names must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", c):
		default:
			return false
		}
	}
	return true
}

// isTableName reports whether s is an identifier or schema.identifier.
func isTableName(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 63 {
			return false
		}
		for i, c := range p {
			switch {
			case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			case c >= '0' && c <= '9' && i > 0:
			default:
				return false
			}
		}
	}
	return true
}
