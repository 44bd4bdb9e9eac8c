package config

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
)

// redacted replaces secret values.
const redacted = "REDACTED"

// Redacted returns a deep copy of c in which every secret is replaced by
// "REDACTED": the Redis and Sentinel passwords, the Kafka SASL password,
// passwords in the RabbitMQ URL, the HTTP sink URL and the Postgres DSN, and
// the values of HTTP sink headers whose name looks secret. Empty secrets stay
// empty, so the copy still shows which ones are set. The copy shares no
// memory with c.
func (c *Config) Redacted() *Config {
	if c == nil {
		return nil
	}
	r := *c
	r.Redis.Addrs = slices.Clone(c.Redis.Addrs)
	r.Redis.Password = redactValue(r.Redis.Password)
	r.Redis.SentinelPassword = redactValue(r.Redis.SentinelPassword)
	if k := c.Source.Kafka; k != nil {
		k2 := *k
		k2.Brokers = slices.Clone(k.Brokers)
		k2.SASL.Password = redactValue(k.SASL.Password)
		r.Source.Kafka = &k2
	}
	if q := c.Source.RabbitMQ; q != nil {
		q2 := *q
		q2.URL = RedactURL(q.URL)
		r.Source.RabbitMQ = &q2
	}
	if h := c.Sink.HTTP; h != nil {
		h2 := *h
		h2.URL = RedactURL(h.URL)
		if h.PushBack != nil {
			pushBack := *h.PushBack
			h2.PushBack = &pushBack
		}
		if h.Headers != nil {
			h2.Headers = maps.Clone(h.Headers)
			for name, v := range h2.Headers {
				if IsSecretHeader(name) {
					h2.Headers[name] = redactValue(v)
				}
			}
		}
		r.Sink.HTTP = &h2
	}
	if p := c.Sink.Postgres; p != nil {
		p2 := *p
		p2.DSN = RedactURL(p.DSN)
		r.Sink.Postgres = &p2
	}
	if c.Sink.Stdout != nil {
		r.Sink.Stdout = &Stdout{}
	}
	return &r
}

func redactValue(s string) string {
	if s == "" {
		return ""
	}
	return redacted
}

// IsSecretHeader reports whether a header (or query parameter, or
// connection string key) with this name likely carries a credential: its
// name contains auth, token, key, secret, passw, pwd, cookie, credential or
// session, in any case. It errs on the side of hiding.
func IsSecretHeader(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"auth", "token", "key", "secret", "passw", "pwd", "cookie", "credential", "session"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// RedactURL returns s with its secrets replaced by "REDACTED", for use in
// logs and error messages. s may be a URL such as
// amqp://user:pass@host/vhost or postgres://user:pass@host/db?sslpassword=x,
// in which case the password of the user information and the values of
// query parameters with a secret-looking name are replaced, or a key=value
// connection string such as "host=db password='x y'", in which case the
// values of secret-looking keys are replaced. Anything else is returned
// unchanged, except that a malformed key=value string mentioning a secret is
// replaced entirely. It may hide more than needed in malformed URLs, never
// less.
func RedactURL(s string) string {
	switch {
	case hasURLScheme(s):
		return redactURL(s)
	case strings.Contains(s, "="):
		return redactKeyValues(s)
	default:
		return s
	}
}

// hasURLScheme reports whether s starts with "scheme://".
func hasURLScheme(s string) bool {
	i := strings.Index(s, "://")
	if i <= 0 {
		return false
	}
	for j, c := range s[:i] {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case j > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}

func redactURL(s string) string {
	start := strings.Index(s, "://") + len("://")
	rest := s[start:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		// An unescaped '/', '?' or '#' in a password ends the authority
		// early: fall back to the last '@' when a ':' precedes it.
		if at = strings.LastIndex(rest, "@"); at >= 0 && !strings.Contains(rest[:at], ":") {
			at = -1
		}
	}
	var b strings.Builder
	b.WriteString(s[:start])
	if at >= 0 {
		userinfo := rest[:at]
		if user, _, ok := strings.Cut(userinfo, ":"); ok {
			userinfo = user + ":" + redacted
		}
		b.WriteString(userinfo)
		b.WriteByte('@')
		rest = rest[at+1:]
	}
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		b.WriteString(rest)
		return b.String()
	}
	b.WriteString(rest[:q+1])
	query, fragment := rest[q+1:], ""
	if h := strings.IndexByte(query, '#'); h >= 0 {
		query, fragment = query[:h], query[h:]
	}
	params := strings.Split(query, "&")
	for i, p := range params {
		k, v, ok := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if ok && v != "" && IsSecretHeader(name) {
			params[i] = k + "=" + redacted
		}
	}
	b.WriteString(strings.Join(params, "&"))
	b.WriteString(fragment)
	return b.String()
}

// keyValue is one setting of a key=value connection string; the value is
// s[start:end] of the string, quotes included.
type keyValue struct {
	key        string
	start, end int
}

// parseKeyValues splits a libpq key=value connection string. Its errors do
// not quote the string, which may hold a password.
func parseKeyValues(s string) ([]keyValue, error) {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' }
	var kvs []keyValue
	i := 0
	skip := func() {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
	}
	for {
		skip()
		if i == len(s) {
			return kvs, nil
		}
		ks := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[ks:i]
		skip()
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, fmt.Errorf("expected key=value at byte %d", ks)
		}
		i++
		skip()
		vs := i
		if i < len(s) && s[i] == '\'' {
			for i++; ; i++ {
				if i >= len(s) {
					return nil, fmt.Errorf("unterminated quoted value at byte %d", vs)
				}
				if s[i] == '\\' {
					i++
					continue
				}
				if s[i] == '\'' {
					i++
					break
				}
			}
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(s))
		}
		kvs = append(kvs, keyValue{key: key, start: vs, end: i})
	}
}

func redactKeyValues(s string) string {
	kvs, err := parseKeyValues(s)
	if err != nil {
		if IsSecretHeader(s) {
			return redacted
		}
		return s
	}
	var b strings.Builder
	last := 0
	for _, kv := range kvs {
		if kv.end > kv.start && IsSecretHeader(kv.key) {
			b.WriteString(s[last:kv.start])
			b.WriteString(redacted)
			last = kv.end
		}
	}
	b.WriteString(s[last:])
	return b.String()
}
