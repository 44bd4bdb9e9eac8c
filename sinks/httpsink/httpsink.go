// Package httpsink is a sink that delivers each message as an HTTP request,
// for SMS gateways, push services and webhooks.
//
// # Request
//
// Each message becomes one request to Config.URL with Config.Method (POST by
// default) and Config.Headers. Header values may reference the environment
// as ${NAME} (or ${NAME:-default}; $$ is a literal $), expanded once in New:
// "Authorization: Bearer ${SMS_TOKEN}". The body is the raw message payload,
// or the output of Config.BodyTemplate, a Go text/template executed with a
// TemplateData. This is how a form-encoded SMS request is built from a JSON
// event:
//
//	To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}
//
// Besides the text/template builtins (urlquery, print, index, ...), a
// template may call json, which encodes its argument as JSON, and form,
// which encodes a map, or alternating keys and values, as
// application/x-www-form-urlencoded. A template that refers to a missing
// JSON field or header (use index for optional ones), or to .JSON of a body
// that is not JSON, fails, as does any other execution error. Such a message is permanent: it is dead-lettered,
// never sent half-rendered.
//
// # Responses and errors
//
//   - 2xx: delivered.
//   - 408, 429 and 5xx: retryable. If the response has a Retry-After header
//     (seconds or an HTTP date), the error carries that delay with
//     consumer.RetryAfter, capped at Config.MaxRetryAfter. A 429 without a
//     usable Retry-After carries Config.DefaultRetryAfter instead, because
//     a 429 always means "slow down". The consumer.PushBack middleware turns
//     that delay into a pause of the shared bucket for every replica.
//   - Any other status, redirects included (they are not followed): permanent.
//   - Network errors and timeouts: retryable.
//   - A body template that fails for a message: permanent.
//
// Error texts name the method, the URL without its query and user
// information, the status and a short, truncated snippet of the response
// body. They never include request headers, where credentials live, nor the
// URL query, where some providers expect an API key. A non-2xx answer is a
// *StatusError, reachable with errors.As.
//
// # Connections
//
// The sink keeps its own connection pool: at most Config.MaxConns
// connections to the host, all of them kept alive and reused. Response
// bodies are drained (up to 64 KiB) and closed so that connections go back
// to the pool.
package httpsink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode"

	"github.com/throttlehq/throttle/consumer"

	"github.com/throttlehq/throttle/internal/envexpand"
)

// Defaults for the zero fields of a Config.
const (
	DefaultMethod            = http.MethodPost
	DefaultTimeout           = 5 * time.Second
	DefaultContentType       = "application/json"
	DefaultMaxConns          = 64
	DefaultDefaultRetryAfter = time.Second
	DefaultMaxRetryAfter     = 60 * time.Second
)

const (
	// snippetLen is the most bytes of a response body that an error quotes.
	snippetLen = 256
	// drainLimit is the most bytes read from a response body to keep its
	// connection alive; a longer body closes the connection instead.
	drainLimit = 64 << 10
	// templateName names the body template in its own error messages.
	templateName = "body_template"
)

// Config configures a Sink. Zero fields take the documented defaults.
type Config struct {
	// URL is the request URL. It is required; its scheme must be http or
	// https.
	URL string
	// Method is the request method. Default POST.
	Method string
	// Headers are set on every request. Values may reference environment
	// variables as ${NAME} or ${NAME:-default}, and $$ is a literal $; an
	// unset variable without a default is an error in New naming the
	// header. A Content-Type here overrides ContentType.
	Headers map[string]string
	// RawHeaders turns off the environment expansion of Headers, for
	// values that were expanded already (the config package does so) and
	// must be used as given.
	RawHeaders bool
	// Timeout bounds each request, from sending it to reading the
	// response. Default 5s.
	Timeout time.Duration
	// BodyTemplate is a Go text/template for the request body, executed
	// with a TemplateData. Empty means the raw message payload.
	BodyTemplate string
	// ContentType is the Content-Type of every request. Default
	// application/json.
	ContentType string
	// MaxConns bounds the connections to the host, busy or idle; requests
	// beyond it wait for a free connection. Default 64.
	MaxConns int
	// DefaultRetryAfter is the delay a 429 without a usable Retry-After
	// header asks for. Default 1s.
	DefaultRetryAfter time.Duration
	// MaxRetryAfter caps the delay taken from a Retry-After header, so a
	// provider cannot stop delivery for hours. Default 60s.
	MaxRetryAfter time.Duration
}

// TemplateData is what Config.BodyTemplate sees for a message.
type TemplateData struct {
	// JSON is the body decoded as JSON (numbers as json.Number, so they
	// keep their exact text), or nil when the body is not valid JSON. For
	// a JSON object, {{.JSON.field}} reads a field.
	JSON any
	// Body is the raw body as a string.
	Body string
	// Key is the message key as a string.
	Key string
	// Headers are the message headers.
	Headers map[string]string
	// Source is where the message came from.
	Source consumer.Source
	// Attempt is the delivery attempt, 1 for the first.
	Attempt int
}

// StatusError is the error for a response whose status is not 2xx. The
// sink wraps it with consumer.Permanent or consumer.RetryAfter as the
// package documentation describes; use errors.As to read it.
type StatusError struct {
	// StatusCode is the response status code.
	StatusCode int
	// Body is a snippet of the response body: at most 256 bytes, with
	// control characters replaced by spaces.
	Body string

	endpoint string
	status   string
}

func (e *StatusError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("%s: %s", e.endpoint, e.status)
	}
	return fmt.Sprintf("%s: %s: %s", e.endpoint, e.status, e.Body)
}

// Sink delivers messages as HTTP requests. It is safe for concurrent use.
// Close releases its idle connections.
type Sink struct {
	client            *http.Client
	transport         *http.Transport
	method            string
	url               string
	endpoint          string // method and URL without userinfo and query, for errors
	header            http.Header
	timeout           time.Duration
	tmpl              *template.Template
	defaultRetryAfter time.Duration
	maxRetryAfter     time.Duration
}

// New validates cfg and returns a Sink. An error names the field at fault
// and never quotes a header value.
func New(cfg Config) (*Sink, error) {
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		return nil, errors.New("httpsink: url is required")
	case err != nil:
		return nil, errors.New("httpsink: url is not a valid URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("httpsink: url scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		return nil, errors.New("httpsink: url has no host")
	}

	method := cfg.Method
	if method == "" {
		method = DefaultMethod
	}
	if !validToken(method) {
		return nil, fmt.Errorf("httpsink: method %q is not a valid HTTP method", method)
	}

	s := &Sink{
		method:            method,
		url:               u.String(),
		endpoint:          method + " " + (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String(),
		header:            make(http.Header, len(cfg.Headers)+1),
		timeout:           orDefault(cfg.Timeout, DefaultTimeout),
		defaultRetryAfter: orDefault(cfg.DefaultRetryAfter, DefaultDefaultRetryAfter),
		maxRetryAfter:     orDefault(cfg.MaxRetryAfter, DefaultMaxRetryAfter),
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("httpsink: timeout %v is negative", cfg.Timeout)
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("httpsink: max_conns %d is negative", cfg.MaxConns)
	}

	s.header.Set("Content-Type", DefaultContentType)
	if cfg.ContentType != "" {
		if !validHeaderValue(cfg.ContentType) {
			return nil, errors.New("httpsink: content_type holds a control character")
		}
		s.header.Set("Content-Type", cfg.ContentType)
	}
	// Sorted, so that the first bad header reported is always the same.
	names := make([]string, 0, len(cfg.Headers))
	for name := range cfg.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !validToken(name) {
			return nil, fmt.Errorf("httpsink: header name %q is not valid", name)
		}
		v := cfg.Headers[name]
		if !cfg.RawHeaders {
			if v, _, err = envexpand.Expand(v, os.LookupEnv); err != nil {
				return nil, fmt.Errorf("httpsink: header %s: %w", name, err)
			}
		}
		if !validHeaderValue(v) {
			return nil, fmt.Errorf("httpsink: header %s: value holds a control character", name)
		}
		s.header.Set(name, v)
	}

	if cfg.BodyTemplate != "" {
		s.tmpl, err = template.New(templateName).
			Funcs(template.FuncMap{"json": jsonFunc, "form": formFunc}).
			Option("missingkey=error").
			Parse(cfg.BodyTemplate)
		if err != nil {
			return nil, fmt.Errorf("httpsink: parsing body_template: %w", err)
		}
	}

	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	s.transport = newTransport(maxConns)
	s.client = &http.Client{
		Transport: s.transport,
		// A redirect is answered as is: a POST must not silently turn
		// into a GET, nor its credentials follow it elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return s, nil
}

func newTransport(maxConns int) *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxConnsPerHost:       maxConns,
		MaxIdleConns:          maxConns,
		MaxIdleConnsPerHost:   maxConns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Close closes the idle connections. Requests in flight are not
// interrupted, and the Sink stays usable: a later Send opens new
// connections.
func (s *Sink) Close() error {
	s.transport.CloseIdleConnections()
	return nil
}

// Send delivers msg as one request and classifies the outcome as the
// package documentation describes.
func (s *Sink) Send(ctx context.Context, msg consumer.Message) error {
	body, err := s.body(msg)
	if err != nil {
		return err
	}
	reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, s.method, s.url, bytes.NewReader(body))
	if err != nil {
		// New validated the method and URL, so this is not expected.
		return consumer.Permanent(fmt.Errorf("%s: building request: %w", s.endpoint, err))
	}
	req.Header = s.header.Clone()

	resp, err := s.client.Do(req)
	if err != nil {
		return s.transportError(ctx, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return s.statusError(resp)
}

func (s *Sink) body(msg consumer.Message) ([]byte, error) {
	if s.tmpl == nil {
		return msg.Body, nil
	}
	data := TemplateData{
		Body:    string(msg.Body),
		Key:     string(msg.Key),
		Headers: msg.Headers,
		Source:  msg.Source,
		Attempt: msg.Attempt,
	}
	if data.Headers == nil {
		data.Headers = map[string]string{}
	}
	dec := json.NewDecoder(bytes.NewReader(msg.Body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err == nil {
		// Only a body that is one JSON value and nothing else.
		if _, err := dec.Token(); err == io.EOF {
			data.JSON = v
		}
	}
	var buf bytes.Buffer
	if err := s.tmpl.Execute(&buf, data); err != nil {
		return nil, consumer.Permanent(fmt.Errorf("rendering %s: %w", templateName, err))
	}
	return buf.Bytes(), nil
}

// transportError classifies a failed round trip. All of them are
// retryable. The url.Error is unwrapped, since its text holds the full URL.
func (s *Sink) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", s.endpoint, ctx.Err())
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: no response within %v: %w", s.endpoint, s.timeout, err)
	}
	return fmt.Errorf("%s: %w", s.endpoint, err)
}

func (s *Sink) statusError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, snippetLen+1))
	serr := &StatusError{
		StatusCode: resp.StatusCode,
		Body:       snippet(raw),
		endpoint:   s.endpoint,
		status:     resp.Status,
	}
	if serr.status == "" {
		serr.status = strconv.Itoa(resp.StatusCode)
	}
	code := resp.StatusCode
	if code != http.StatusRequestTimeout && code != http.StatusTooManyRequests && code < 500 {
		return consumer.Permanent(serr)
	}
	d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now())
	switch {
	case ok:
		return consumer.RetryAfter(serr, min(d, s.maxRetryAfter))
	case code == http.StatusTooManyRequests:
		return consumer.RetryAfter(serr, min(s.defaultRetryAfter, s.maxRetryAfter))
	default:
		return serr
	}
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP date. A
// date in the past is a delay of 0.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		// Guard against overflow: anything this large is capped anyway.
		if secs > int64(24*time.Hour/time.Second) {
			secs = int64(24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// snippet makes a response body fit for an error message: valid UTF-8, no
// control characters, at most snippetLen bytes, marked when truncated.
func snippet(raw []byte) string {
	truncated := len(raw) > snippetLen
	if truncated {
		raw = raw[:snippetLen]
	}
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(raw), "\uFFFD"))
	s = strings.TrimSpace(s)
	if truncated {
		s += "…"
	}
	return s
}

// jsonFunc is the template function json: its argument encoded as JSON.
func jsonFunc(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// formFunc is the template function form. It encodes either one map or
// alternating keys and values as application/x-www-form-urlencoded, keys
// sorted. A slice value adds the key once for each element; other values
// are formatted with fmt.Sprint.
func formFunc(args ...any) (string, error) {
	vals := url.Values{}
	switch {
	case len(args) == 1:
		switch m := args[0].(type) {
		case map[string]any:
			for k, v := range m {
				addFormValue(vals, k, v)
			}
		case map[string]string:
			for k, v := range m {
				vals.Add(k, v)
			}
		case url.Values:
			vals = m
		default:
			return "", fmt.Errorf("form: want a map or key-value pairs, got %T", args[0])
		}
	case len(args)%2 == 0:
		for i := 0; i < len(args); i += 2 {
			k, ok := args[i].(string)
			if !ok {
				return "", fmt.Errorf("form: key %d is a %T, not a string", i/2+1, args[i])
			}
			addFormValue(vals, k, args[i+1])
		}
	default:
		return "", errors.New("form: want a map or an even number of key-value arguments")
	}
	return vals.Encode(), nil
}

func addFormValue(vals url.Values, k string, v any) {
	switch v := v.(type) {
	case nil:
		vals.Add(k, "")
	case string:
		vals.Add(k, v)
	case []any:
		for _, e := range v {
			vals.Add(k, fmt.Sprint(e))
		}
	case []string:
		for _, e := range v {
			vals.Add(k, e)
		}
	default:
		vals.Add(k, fmt.Sprint(v))
	}
}

// validToken reports whether s is an RFC 9110 token, as header names and
// methods must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v holds no control character other than
// horizontal tab; CR and LF would split the header.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
