// Package httpsink is a sink that delivers each message as an HTTP request,
// for SMS gateways, push services and webhooks.
//
// # Request
//
// Each message becomes one request to Config.URL with Config.Method (POST by
// default) and Config.Headers, used as given. The body is the raw message
// payload, or the output of Config.BodyTemplate, a message template of
// package msgtmpl (the same data and functions as every other template over
// a message). This is how a form-encoded SMS request is built from a JSON
// event:
//
//	To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}
//
// and a reshaped JSON body for a push service:
//
//	{"token":{{json .JSON.device}}}
//
// A template that fails for a message (a missing JSON field or header, .JSON
// of a body that is not JSON, any other execution error) makes the message
// permanent: it is dead-lettered, never sent half-rendered.
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
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/msgtmpl"
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
	// Method is the request method, an RFC 9110 token. Default POST.
	Method string
	// Headers are set on every request, as given: names must be RFC 9110
	// tokens and values must hold no control character but tab. A
	// Content-Type here overrides ContentType. The sink does not expand
	// environment variables; the config package does, once, for the
	// whole file.
	Headers map[string]string
	// Timeout bounds each request, from sending it to reading the
	// response. Default 5s.
	Timeout time.Duration
	// BodyTemplate is a message template (package msgtmpl: its data and
	// its functions json and form) for the request body. Empty means the
	// raw message payload.
	BodyTemplate string
	// ContentType is the media type of every request, such as
	// "application/x-www-form-urlencoded". Default application/json.
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

// Validate checks cfg without building anything, as New does first. It
// returns nil or every problem found, each a *sinks.FieldError naming the
// Go field at fault (joined with errors.Join; read them with
// sinks.FieldErrors). Errors never quote a header value nor the URL, which
// may hold credentials.
func (cfg Config) Validate() error {
	_, _, err := cfg.parse()
	return err
}

// parse validates cfg and returns its URL and body template.
func (cfg Config) parse() (*url.URL, *template.Template, error) {
	var errs []error
	bad := func(field, key, format string, args ...any) {
		errs = append(errs, &sinks.FieldError{Field: field, Key: key, Err: fmt.Errorf(format, args...)})
	}
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		bad("URL", "", "required")
	case err != nil:
		bad("URL", "", "not a valid URL")
	case u.Scheme != "http" && u.Scheme != "https":
		bad("URL", "", "scheme must be http or https, got %q", u.Scheme)
	case u.Host == "":
		bad("URL", "", "has no host")
	}
	if cfg.Method != "" && !validToken(cfg.Method) {
		bad("Method", "", "must be an HTTP method such as POST, got %q", cfg.Method)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"Timeout", cfg.Timeout}, {"DefaultRetryAfter", cfg.DefaultRetryAfter}, {"MaxRetryAfter", cfg.MaxRetryAfter}} {
		if d.v < 0 {
			bad(d.field, "", "must not be negative, got %v", d.v)
		}
	}
	if cfg.MaxConns < 0 {
		bad("MaxConns", "", "must not be negative, got %d", cfg.MaxConns)
	}
	if cfg.ContentType != "" {
		if _, _, err := mime.ParseMediaType(cfg.ContentType); err != nil || !validHeaderValue(cfg.ContentType) {
			bad("ContentType", "", "not a media type such as application/json, got %q", cfg.ContentType)
		}
	}
	// Sorted, so that problems are always reported in the same order.
	names := make([]string, 0, len(cfg.Headers))
	for name := range cfg.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !validToken(name) {
			bad("Headers", name, "not a valid header name")
		}
		if !validHeaderValue(cfg.Headers[name]) {
			// Never echo the value: it may be a credential.
			bad("Headers", name, "value holds a control character (CR, LF, NUL, ...)")
		}
	}
	var tmpl *template.Template
	if cfg.BodyTemplate != "" {
		if tmpl, err = msgtmpl.Parse(templateName, cfg.BodyTemplate); err != nil {
			bad("BodyTemplate", "", "%w", err)
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return u, tmpl, nil
}

// New validates cfg (see Validate) and returns a Sink. It makes no network
// call.
func New(cfg Config) (*Sink, error) {
	u, tmpl, err := cfg.parse()
	if err != nil {
		return nil, fmt.Errorf("httpsink: %w", err)
	}
	method := cfg.Method
	if method == "" {
		method = DefaultMethod
	}
	s := &Sink{
		method:            method,
		url:               u.String(),
		endpoint:          method + " " + (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String(),
		header:            make(http.Header, len(cfg.Headers)+1),
		timeout:           orDefault(cfg.Timeout, DefaultTimeout),
		tmpl:              tmpl,
		defaultRetryAfter: orDefault(cfg.DefaultRetryAfter, DefaultDefaultRetryAfter),
		maxRetryAfter:     orDefault(cfg.MaxRetryAfter, DefaultMaxRetryAfter),
	}
	s.header.Set("Content-Type", DefaultContentType)
	if cfg.ContentType != "" {
		s.header.Set("Content-Type", cfg.ContentType)
	}
	for name, v := range cfg.Headers {
		s.header.Set(name, v)
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
	b, err := msgtmpl.Render(s.tmpl, msgtmpl.NewData(msg))
	if err != nil {
		return nil, consumer.Permanent(err)
	}
	return b, nil
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
