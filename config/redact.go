package config

import (
	"maps"
	"slices"

	"github.com/throttlehq/throttle/internal/redact"
)

// Redacted returns a deep copy of c in which every secret is replaced by
// "xxxxx" (internal/redact's Mask, as net/url's URL.Redacted writes): the
// Redis and Sentinel passwords, the console token, the Kafka SASL password, passwords in the
// RabbitMQ URL, the HTTP sink URL and the Postgres DSN, and the values of
// HTTP sink headers whose name looks secret. Empty secrets stay empty, so
// the copy still shows which ones are set. The copy shares no memory with
// c.
func (c *Config) Redacted() *Config {
	if c == nil {
		return nil
	}
	r := *c
	r.Redis.Addrs = slices.Clone(c.Redis.Addrs)
	r.Redis.Password = redact.Value(r.Redis.Password)
	r.Redis.SentinelPassword = redact.Value(r.Redis.SentinelPassword)
	r.Console.Token = redact.Value(r.Console.Token)
	if k := c.Source.Kafka; k != nil {
		k2 := *k
		k2.Brokers = slices.Clone(k.Brokers)
		k2.SASL.Password = redact.Value(k.SASL.Password)
		r.Source.Kafka = &k2
	}
	if q := c.Source.RabbitMQ; q != nil {
		q2 := *q
		q2.URL = redact.URL(q.URL)
		r.Source.RabbitMQ = &q2
	}
	if h := c.Sink.HTTP; h != nil {
		h2 := *h
		h2.URL = redact.URL(h.URL)
		h2.Credentials.Password = redact.Value(h.Credentials.Password)
		h2.Classify = slices.Clone(h.Classify)
		if h.PushBack != nil {
			pushBack := *h.PushBack
			h2.PushBack = &pushBack
		}
		if h.Headers != nil {
			h2.Headers = maps.Clone(h.Headers)
			for name, v := range h2.Headers {
				if IsSecretHeader(name) {
					h2.Headers[name] = redact.Value(v)
				}
			}
		}
		r.Sink.HTTP = &h2
	}
	if p := c.Sink.Postgres; p != nil {
		p2 := *p
		p2.DSN = redact.URL(p.DSN)
		r.Sink.Postgres = &p2
	}
	if c.Sink.Stdout != nil {
		r.Sink.Stdout = &Stdout{}
	}
	return &r
}

// IsSecretHeader reports whether a header (or query parameter, or
// connection string key) with this name likely carries a credential: its
// name contains auth, token, key, secret, passw, pwd, cookie, credential or
// session, in any case. It is internal/redact's rule.
func IsSecretHeader(name string) bool {
	return redact.IsSecretName(name)
}

// RedactURL returns s with its secrets replaced by "xxxxx", for use in
// logs and error messages: the password of a URL's user information,
// secret-looking query parameters, and secret-looking keys of a key=value
// connection string. It is internal/redact's URL, the one implementation.
func RedactURL(s string) string {
	return redact.URL(s)
}
