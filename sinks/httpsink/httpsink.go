package httpsink

import (
	"bytes"
	"context"
	"crypto/tls"
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
	"time"
	"unicode"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/redact"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/internal/sinktrace"
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
	// beyond it wait for a free connection, within Timeout. Over HTTP/1.1
	// it thus bounds the Sends in flight too. Default 64.
	MaxConns int
	// DefaultRetryAfter is the delay a 429 without a usable Retry-After
	// header asks for. Default 1s.
	DefaultRetryAfter time.Duration
	// MaxRetryAfter caps the delay taken from a Retry-After header, so a
	// provider cannot stop delivery for hours. Default 60s.
	MaxRetryAfter time.Duration
	// Preset is a provider preset, one of Presets, or empty for none. With
	// a preset, URL is optional and, when set, replaces the provider's
	// base URL (scheme, host and an optional path prefix).
	Preset string
	// Credentials are the preset's credentials. Zero fields are read from
	// the environment variables the preset names.
	Credentials Credentials
	// Rules classify responses; they are tried in order before the
	// preset's rules and DefaultRules.
	Rules []Rule
	// Auth adds credentials to every request. Nil means the preset's, or
	// none.
	Auth Authorizer
	// TLS is the TLS configuration for https URLs, for example with the
	// RootCAs of a private CA. Nil means Go's defaults and the system's
	// roots (which honour SSL_CERT_FILE).
	TLS *tls.Config
}

// StatusError is the error for a response that the rules did not classify
// as delivered: with DefaultRules, one whose status is not 2xx; with a
// body rule, possibly a 200. The sink wraps it with consumer.Permanent or
// consumer.RetryAfter as the rule says; use errors.As to read it.
type StatusError struct {
	// StatusCode is the response status code.
	StatusCode int
	// Body is a snippet of the response body: at most 256 bytes, with
	// control characters replaced by spaces.
	Body string
	// Rule is the Name of the rule that classified the response, empty
	// for DefaultRules.
	Rule string
	// RecipientGone is set when that rule says the recipient (number,
	// device token) no longer exists.
	RecipientGone bool

	endpoint string
	status   string
}

func (e *StatusError) Error() string {
	status := e.status
	if e.Rule != "" {
		status += " (" + e.Rule + ")"
	}
	if e.Body == "" {
		return fmt.Sprintf("%s: %s", e.endpoint, status)
	}
	return fmt.Sprintf("%s: %s: %s", e.endpoint, status, e.Body)
}

// DeadLetterHeaders are the headers the consumer adds to the message when
// it dead-letters it for this error: x-throttle-recipient-gone: true when
// the recipient is gone, none otherwise.
func (e *StatusError) DeadLetterHeaders() map[string]string {
	if !e.RecipientGone {
		return nil
	}
	return map[string]string{HeaderRecipientGone: "true"}
}

// IsRecipientGone reports whether err is, or wraps, a *StatusError whose
// rule says the recipient is gone.
func IsRecipientGone(err error) bool {
	var serr *StatusError
	return errors.As(err, &serr) && serr.RecipientGone
}

// Sink delivers messages as HTTP requests. It is safe for concurrent use.
// Close releases its idle connections.
type Sink struct {
	client            *http.Client
	transport         *http.Transport
	method            string
	url               string            // the URL, unless urlTmpl is set
	urlTmpl           *msgtmpl.Template // the URL when it holds template actions
	endpoint          string            // method and URL without userinfo and query, for errors
	serverAddr        string            // the URL's host, for spans, when it is not a template
	serverPort        int               // the URL's port, or its scheme's default
	header            http.Header       // never modified after New
	timeout           time.Duration
	tmpl              *msgtmpl.Template
	rules             *ruleSet
	auth              Authorizer
	checker           Checker
	defaultRetryAfter time.Duration
	maxRetryAfter     time.Duration
}

// Validate checks cfg without building anything, as New does first. It
// returns nil or every problem found, each a *sinks.FieldError naming the
// Go field at fault (joined with errors.Join; read them with
// sinks.FieldErrors). Errors never quote a header value nor the URL, which
// may hold credentials. It does not read a preset's credentials: New does.
func (cfg Config) Validate() error {
	_, err := cfg.parse()
	return err
}

// parsed is what parse makes of a Config.
type parsed struct {
	tmpl  *msgtmpl.Template // the body template, nil for the raw payload
	rules *ruleSet          // Rules, the preset's rules, DefaultRules
}

// parse validates cfg, with a preset's parts where cfg leaves them zero.
func (cfg Config) parse() (*parsed, error) {
	var errs []error
	bad := func(field, key, format string, args ...any) {
		errs = append(errs, &sinks.FieldError{Field: field, Key: key, Err: fmt.Errorf(format, args...)})
	}
	var spec presetSpec
	if cfg.Preset != "" {
		var ok bool
		if spec, ok = presetSpecs[cfg.Preset]; !ok {
			bad("Preset", "", "must be one of %s, got %q", strings.Join(Presets, ", "), cfg.Preset)
		}
	}
	if cfg.URL != "" || cfg.Preset == "" {
		// A template action may stand in the path or query: check what
		// comes before the first one.
		static, _, _ := strings.Cut(cfg.URL, "{{")
		u, err := url.Parse(static)
		switch {
		case cfg.URL == "":
			bad("URL", "", "required")
		case err != nil:
			bad("URL", "", "not a valid URL")
		case u.Scheme != "http" && u.Scheme != "https":
			bad("URL", "", "scheme must be http or https, got %q", u.Scheme)
		case u.Host == "":
			bad("URL", "", "has no host")
		case strings.Contains(cfg.URL, "{{"):
			if _, err := msgtmpl.Parse("url", cfg.URL); err != nil {
				bad("URL", "", "%w", err)
			}
		}
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
	p := &parsed{}
	body := cfg.BodyTemplate
	if body == "" {
		body = spec.bodyTemplate
	}
	if body != "" {
		var err error
		if p.tmpl, err = msgtmpl.Compile(templateName, body); err != nil {
			bad("BodyTemplate", "", "%w", err)
		}
	}
	for i, r := range cfg.Rules {
		if _, err := compileRule(r); err != nil {
			name := ""
			if r.Name != "" {
				name = fmt.Sprintf(" (%s)", r.Name)
			}
			bad("Rules", "", "rule %d%s: %w", i, name, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var err error
	p.rules, err = compileRules(
		namedRules{name: "Rules", rules: cfg.Rules},
		namedRules{name: "preset " + cfg.Preset, rules: spec.rules},
		namedRules{name: "DefaultRules", rules: DefaultRules, builtin: true},
	)
	if err != nil { // the preset's or the default rules: a bug, tested
		return nil, err
	}
	return p, nil
}

// New validates cfg (see Validate), loads a preset's credentials and
// returns a Sink. It makes no network call: Check does.
func New(cfg Config) (*Sink, error) {
	p, err := cfg.parse()
	if err != nil {
		return nil, fmt.Errorf("httpsink: %w", err)
	}
	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	s := &Sink{
		method:            cfg.Method,
		header:            make(http.Header, len(cfg.Headers)+1),
		timeout:           orDefault(cfg.Timeout, DefaultTimeout),
		tmpl:              p.tmpl,
		rules:             p.rules,
		auth:              cfg.Auth,
		defaultRetryAfter: orDefault(cfg.DefaultRetryAfter, DefaultDefaultRetryAfter),
		maxRetryAfter:     orDefault(cfg.MaxRetryAfter, DefaultMaxRetryAfter),
	}
	s.transport = newTransport(maxConns, cfg.TLS)
	s.client = &http.Client{
		Transport: s.transport,
		// A redirect is answered as is: a POST must not silently turn
		// into a GET, nor its credentials follow it elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	target, contentType := cfg.URL, cfg.ContentType
	if cfg.Preset != "" {
		rp, err := resolvePreset(cfg.Preset, cfg.URL, cfg.Credentials, cfg.Headers, defaultPresetEnv(), s.client)
		if err != nil {
			return nil, fmt.Errorf("httpsink: %w", err)
		}
		target = rp.url
		if s.method == "" {
			s.method = rp.method
		}
		if contentType == "" {
			contentType = rp.contentType
		}
		for name, v := range rp.headers {
			s.header.Set(name, v)
		}
		if s.auth == nil {
			s.auth, s.checker = rp.auth, rp.checker
		}
	}
	if s.checker == nil {
		s.checker, _ = s.auth.(Checker)
	}
	if s.method == "" {
		s.method = DefaultMethod
	}
	s.header.Set("Content-Type", DefaultContentType)
	if contentType != "" {
		s.header.Set("Content-Type", contentType)
	}
	for name, v := range cfg.Headers {
		s.header.Set(name, v)
	}
	// The endpoint names the method and the URL without its query and
	// user information; a template action stays as its text, never a
	// message's data.
	pathPart, _, _ := strings.Cut(target, "?")
	staticPath, rest, inPath := strings.Cut(pathPart, "{{")
	endpoint := redact.Endpoint(staticPath)
	if endpoint == "" {
		return nil, errors.New("httpsink: the URL is not valid")
	}
	s.endpoint = s.method + " " + endpoint
	if u, err := url.Parse(staticPath); err == nil && !strings.Contains(u.Host, "{{") {
		s.serverAddr = u.Hostname()
		if s.serverPort, err = strconv.Atoi(u.Port()); err != nil {
			s.serverPort = map[string]int{"http": 80, "https": 443}[u.Scheme]
		}
	}
	if inPath {
		s.endpoint += "{{" + rest
	}
	if strings.Contains(target, "{{") {
		if s.urlTmpl, err = msgtmpl.Compile("url", target); err != nil {
			return nil, fmt.Errorf("httpsink: url: %w", err)
		}
	} else {
		full, err := url.Parse(target)
		if err != nil {
			return nil, errors.New("httpsink: the URL is not valid")
		}
		s.url = full.String()
	}
	return s, nil
}

// Check verifies the credentials where the preset or Config.Auth can do so
// without sending a message (see Checker), so that wrong credentials stop
// the program at start-up. It returns nil when there is nothing to check.
func (s *Sink) Check(ctx context.Context) error {
	if s.checker == nil {
		return nil
	}
	if err := s.checker.Check(ctx); err != nil {
		return fmt.Errorf("httpsink: %w", err)
	}
	return nil
}

func newTransport(maxConns int, tlsConf *tls.Config) *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if tlsConf != nil {
		tlsConf = tlsConf.Clone()
	}
	return &http.Transport{
		TLSClientConfig:       tlsConf,
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
	target, body, err := s.render(msg)
	if err != nil {
		return err
	}
	ctx, span := sinktrace.Start(ctx, s.method, s.spanAttrs)
	status, err := s.send(ctx, target, body)
	if span != nil {
		var attrs []attribute.KeyValue
		if status > 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(status))
			if err != nil {
				attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(status)))
			}
		}
		sinktrace.End(span, err, attrs...)
	}
	return err
}

// send is Send for the rendered request; it returns the response's status
// code too, or 0 without a response.
func (s *Sink) send(ctx context.Context, target string, body []byte) (int, error) {
	reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, s.method, target, bytes.NewReader(body))
	if err != nil {
		// New validated the method and URL; a URL template may still
		// render something unusable for this message.
		return 0, consumer.Permanent(fmt.Errorf("%s: building request: %w", s.endpoint, err))
	}
	sc := trace.SpanContextFromContext(ctx)
	if s.auth == nil && !sc.IsValid() {
		// net/http never writes to a request's headers, so the shared,
		// never-modified header map is safe to hand over as is.
		req.Header = s.header
	} else {
		req.Header = s.header.Clone()
	}
	if sc.IsValid() {
		// The message's trace goes on to the provider: traceparent (and
		// tracestate) of this request's span, or of the message's span
		// when that one is not sampled.
		traceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
	}
	if s.auth != nil {
		if err := s.auth.Authorize(reqCtx, req); err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("%s: %w", s.endpoint, ctx.Err())
			}
			return 0, fmt.Errorf("%s: authorizing: %w", s.endpoint, err)
		}
	}

	resp, err := s.client.Do(req)
	if err != nil {
		return 0, s.transportError(ctx, err)
	}
	defer drain(resp.Body)
	return resp.StatusCode, s.classify(resp)
}

// drain reads what is left of a response body, up to drainLimit, so that
// its connection can serve the next request, and closes it. A body known
// to be empty (http.NoBody: a Content-Length of 0, or a HEAD) has nothing
// to read.
func drain(body io.ReadCloser) {
	if body != http.NoBody {
		_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	}
	_ = body.Close()
}

// traceContext is the W3C Trace Context propagator: traceparent and
// tracestate.
var traceContext propagation.TraceContext

// spanAttrs returns the attributes of a request's client span: the method
// and the server of the URL (not its path or query, which may hold a
// recipient or a credential).
func (s *Sink) spanAttrs() []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(s.method)}
	if s.serverAddr != "" {
		attrs = append(attrs, semconv.ServerAddress(s.serverAddr))
	}
	if s.serverPort > 0 {
		attrs = append(attrs, semconv.ServerPort(s.serverPort))
	}
	return attrs
}

// render returns the URL and body of msg's request.
func (s *Sink) render(msg consumer.Message) (string, []byte, error) {
	if s.tmpl == nil && s.urlTmpl == nil {
		return s.url, msg.Body, nil
	}
	// The templates decode the message at most once between them, and
	// not at all when they take the fast path (msgtmpl.Template).
	var data *msgtmpl.Data
	target, body := s.url, msg.Body
	if s.urlTmpl != nil {
		var err error
		if target, err = s.urlTmpl.Execute(msg, &data); err != nil {
			return "", nil, consumer.Permanent(err)
		}
	}
	if s.tmpl != nil {
		b, err := s.tmpl.Execute(msg, &data)
		if err != nil {
			return "", nil, consumer.Permanent(err)
		}
		body = []byte(b)
	}
	return target, body, nil
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

// classify applies the rules to resp. It reads the body only when a rule
// looks at it or the answer is not 2xx (for the error's snippet).
func (s *Sink) classify(resp *http.Response) error {
	var raw []byte
	switch {
	case s.rules.needBody:
		raw, _ = io.ReadAll(io.LimitReader(resp.Body, drainLimit))
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		raw, _ = io.ReadAll(io.LimitReader(resp.Body, snippetLen+1))
	}
	d := s.rules.decide(&response{status: resp.StatusCode, header: resp.Header, body: raw},
		time.Now, s.defaultRetryAfter, s.maxRetryAfter)
	if d.rule.Action == Delivered {
		return nil
	}
	serr := &StatusError{
		StatusCode:    resp.StatusCode,
		Body:          snippet(raw),
		RecipientGone: d.rule.RecipientGone,
		endpoint:      s.endpoint,
		status:        resp.Status,
	}
	if !d.rule.builtin {
		serr.Rule = d.rule.Name
	}
	if serr.status == "" {
		serr.status = strconv.Itoa(resp.StatusCode)
	}
	switch {
	case d.rule.Action == Permanent:
		return consumer.Permanent(serr)
	case d.hasDelay:
		return consumer.RetryAfter(serr, d.delay)
	}
	return serr
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
