// Package redact is the one implementation of hiding secrets in what the
// program prints: configuration dumps, log lines and error texts. It knows
// where secrets sit in URLs (the password of the user information, query
// parameters with a secret-looking name) and in libpq key=value connection
// strings, and it masks every one the same way, with [Mask], as net/url's
// URL.Redacted does.
//
// Every function is safe for concurrent use.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces each secret. It is what net/url's URL.Redacted writes for a
// password, so that every redacted URL looks the same whichever package
// redacted it.
const Mask = "xxxxx"

// Value returns Mask for a non-empty secret and "" for an empty one, so
// that a redacted configuration still shows which secrets are set.
func Value(s string) string {
	if s == "" {
		return ""
	}
	return Mask
}

// IsSecretName reports whether a header, query parameter or connection
// string key with this name likely carries a credential: its name contains
// auth, token, key, secret, passw, pwd, cookie, credential or session, in
// any case. It errs on the side of hiding.
func IsSecretName(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"auth", "token", "key", "secret", "passw", "pwd", "cookie", "credential", "session"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// URL returns s with its secrets replaced by Mask, for logs and error
// messages. s may be a URL such as amqp://user:pass@host/vhost or
// postgres://user:pass@host/db?sslpassword=x, in which case the password of
// the user information and the values of query parameters with a
// secret-looking name (see IsSecretName) are replaced, or a key=value
// connection string such as "host=db password='x y'", in which case the
// values of secret-looking keys are replaced. Anything else is returned
// unchanged, except that a malformed key=value string mentioning a secret
// is replaced entirely. It may hide more than needed in malformed URLs,
// never less.
func URL(s string) string {
	out, _ := redactString(s)
	return out
}

// Endpoint returns the scheme, host and path of the URL s, without user
// information, query or fragment, for error texts that name where a
// request went: some providers expect an API key in the query. A string
// that does not parse as a URL with a host yields "".
func Endpoint(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return ""
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
}

// Secrets returns the secret values that URL would hide in s, such as the
// password of a DSN, so that they can be masked with Text wherever a
// library quotes a piece of s. A malformed key=value string that mentions
// a secret yields s itself.
func Secrets(s string) []string {
	_, secrets := redactString(s)
	return secrets
}

// Text returns text with every occurrence of each non-empty secret
// replaced by Mask.
func Text(text string, secrets ...string) string {
	for _, s := range secrets {
		if s != "" {
			text = strings.ReplaceAll(text, s, Mask)
		}
	}
	return text
}

// Error returns err with every secret masked in its text, as Text does. It
// keeps err in the chain, so errors.Is and errors.As still see it, and
// returns err itself when its text holds no secret.
func Error(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	text := Text(err.Error(), secrets...)
	if text == err.Error() {
		return err
	}
	return &redactedError{text: text, err: err}
}

type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }

// redactString redacts s as URL describes and returns the secrets it hid.
func redactString(s string) (string, []string) {
	switch {
	case HasScheme(s):
		return redactURL(s)
	case strings.Contains(s, "="):
		return redactKeyValues(s)
	default:
		return s, nil
	}
}

// HasScheme reports whether s starts with "scheme://", as a URL (rather
// than a key=value connection string or a host:port) does.
func HasScheme(s string) bool {
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

func redactURL(s string) (string, []string) {
	var secrets []string
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
		if user, pw, ok := strings.Cut(userinfo, ":"); ok {
			userinfo = user + ":" + Mask
			secrets = appendSecret(secrets, pw)
		}
		b.WriteString(userinfo)
		b.WriteByte('@')
		rest = rest[at+1:]
	}
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		b.WriteString(rest)
		return b.String(), secrets
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
		if ok && v != "" && IsSecretName(name) {
			params[i] = k + "=" + Mask
			secrets = appendSecret(secrets, v)
		}
	}
	b.WriteString(strings.Join(params, "&"))
	b.WriteString(fragment)
	return b.String(), secrets
}

// appendSecret adds v and, when it differs, its unescaped form.
func appendSecret(secrets []string, v string) []string {
	if v == "" {
		return secrets
	}
	secrets = append(secrets, v)
	if u, err := url.PathUnescape(v); err == nil && u != v && u != "" {
		secrets = append(secrets, u)
	}
	return secrets
}

// keyValue is one setting of a key=value connection string; the value is
// s[start:end] of the string, quotes included.
type keyValue struct {
	key        string
	start, end int
}

// parseKeyValues splits a libpq key=value connection string; ok is false
// when s is not one.
func parseKeyValues(s string) ([]keyValue, bool) {
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
			return kvs, true
		}
		ks := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[ks:i]
		skip()
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, false
		}
		i++
		skip()
		vs := i
		if i < len(s) && s[i] == '\'' {
			for i++; ; i++ {
				if i >= len(s) {
					return nil, false
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

func redactKeyValues(s string) (string, []string) {
	kvs, ok := parseKeyValues(s)
	if !ok {
		if IsSecretName(s) {
			return Mask, []string{s}
		}
		return s, nil
	}
	var (
		b       strings.Builder
		secrets []string
		last    int
	)
	for _, kv := range kvs {
		if kv.end > kv.start && IsSecretName(kv.key) {
			v := s[kv.start:kv.end]
			secrets = append(secrets, v)
			if uq := strings.Trim(v, "'"); uq != v && uq != "" {
				secrets = append(secrets, uq)
			}
			b.WriteString(s[last:kv.start])
			b.WriteString(Mask)
			last = kv.end
		}
	}
	b.WriteString(s[last:])
	return b.String(), secrets
}
