package httpsink_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

func newSink(t *testing.T, cfg httpsink.Config) *httpsink.Sink {
	t.Helper()
	s, err := httpsink.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// hang answers no request until the client gives up. The body is read
// first: the server notices a closed connection only after that.
func hang(_ http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
}

func jsonMsg(body string) consumer.Message {
	return consumer.Message{
		Key:     []byte("k1"),
		Body:    []byte(body),
		Headers: map[string]string{"tenant": "acme"},
		Attempt: 1,
		Source:  consumer.Source{Broker: "kafka", Topic: "sms", Partition: 0, Offset: 42},
	}
}

func TestSendClassification(t *testing.T) {
	httpDate := func() string { return time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat) }
	tests := []struct {
		name       string
		status     int
		retryAfter func() string
		sleep      bool
		wantOK     bool
		wantPerm   bool
		wantStatus int                      // 0: no *StatusError expected
		wantAfter  func(time.Duration) bool // nil: no RetryAfter expected
		wantText   string                   // substring of the error
	}{
		{name: "200", status: 200, wantOK: true},
		{name: "204", status: 204, wantOK: true},
		{name: "429 seconds", status: 429, retryAfter: func() string { return "2" }, wantStatus: 429,
			wantAfter: func(d time.Duration) bool { return d == 2*time.Second }, wantText: "429 Too Many Requests"},
		{name: "429 http date", status: 429, retryAfter: httpDate, wantStatus: 429,
			wantAfter: func(d time.Duration) bool { return d > time.Second && d <= 3*time.Second }},
		{name: "429 without header uses default", status: 429, wantStatus: 429,
			wantAfter: func(d time.Duration) bool { return d == time.Second }},
		{name: "429 unparsable header uses default", status: 429, retryAfter: func() string { return "soon" }, wantStatus: 429,
			wantAfter: func(d time.Duration) bool { return d == time.Second }},
		{name: "429 capped", status: 429, retryAfter: func() string { return "3600" }, wantStatus: 429,
			wantAfter: func(d time.Duration) bool { return d == time.Minute }},
		{name: "503", status: 503, wantStatus: 503, wantText: "503 Service Unavailable"},
		{name: "503 retry after", status: 503, retryAfter: func() string { return "2" }, wantStatus: 503,
			wantAfter: func(d time.Duration) bool { return d == 2*time.Second }},
		{name: "500", status: 500, wantStatus: 500},
		{name: "502", status: 502, wantStatus: 502},
		{name: "408", status: 408, wantStatus: 408},
		{name: "400", status: 400, wantPerm: true, wantStatus: 400, wantText: "400 Bad Request: bad number"},
		{name: "401", status: 401, wantPerm: true, wantStatus: 401},
		{name: "404", status: 404, wantPerm: true, wantStatus: 404},
		{name: "422 ignores retry after", status: 422, retryAfter: func() string { return "2" }, wantPerm: true, wantStatus: 422},
		{name: "302 is not followed", status: 302, wantPerm: true, wantStatus: 302},
		{name: "timeout", sleep: true, wantText: "no response within 50ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.sleep {
					hang(w, r)
					return
				}
				if tt.retryAfter != nil {
					w.Header().Set("Retry-After", tt.retryAfter())
				}
				if tt.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, "bad number\n")
			}))
			defer srv.Close()
			timeout := 10 * time.Second // generous: a loaded CI machine is slow
			if tt.sleep {
				timeout = 50 * time.Millisecond
			}
			s := newSink(t, httpsink.Config{URL: srv.URL + "/send", Timeout: timeout})

			err := s.Send(context.Background(), jsonMsg(`{"to":"+15550100"}`))
			if tt.wantOK {
				if err != nil {
					t.Fatalf("Send: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Send: nil error, want one")
			}
			if got := consumer.IsPermanent(err); got != tt.wantPerm {
				t.Errorf("IsPermanent = %v, want %v (err: %v)", got, tt.wantPerm, err)
			}
			var serr *httpsink.StatusError
			if got := errors.As(err, &serr); got != (tt.wantStatus != 0) {
				t.Errorf("errors.As StatusError = %v, want %v", got, tt.wantStatus != 0)
			} else if got && serr.StatusCode != tt.wantStatus {
				t.Errorf("StatusCode = %d, want %d", serr.StatusCode, tt.wantStatus)
			}
			d, ok := consumer.RetryAfterOf(err)
			switch {
			case tt.wantAfter == nil && ok:
				t.Errorf("RetryAfterOf = %v, want none", d)
			case tt.wantAfter != nil && !ok:
				t.Errorf("RetryAfterOf: none, want a delay")
			case tt.wantAfter != nil && !tt.wantAfter(d):
				t.Errorf("RetryAfterOf = %v, not the expected delay", d)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not contain %q", err, tt.wantText)
			}
			if !strings.Contains(err.Error(), "POST "+srv.URL+"/send") {
				t.Errorf("error %q does not name the endpoint", err)
			}
		})
	}
}

func TestSendNetworkErrorIsRetryable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now

	s := newSink(t, httpsink.Config{URL: "http://" + addr + "/"})
	err = s.Send(context.Background(), jsonMsg(`{}`))
	if err == nil || consumer.IsPermanent(err) {
		t.Fatalf("Send = %v, want a retryable error", err)
	}
	if _, ok := consumer.RetryAfterOf(err); ok {
		t.Errorf("a network error asks for RetryAfter: %v", err)
	}
}

func TestSendStopsWhenContextEnds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(hang))
	defer srv.Close()
	s := newSink(t, httpsink.Config{URL: srv.URL, Timeout: time.Minute})

	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	err := s.Send(ctx, jsonMsg(`{}`))
	if !errors.Is(err, context.Canceled) || consumer.IsPermanent(err) {
		t.Fatalf("Send = %v, want a retryable error wrapping context.Canceled", err)
	}
}

// scripted is a server that answers with the given statuses in turn, then
// 200, and records when each request arrived.
type scripted struct {
	mu       sync.Mutex
	statuses []int
	header   http.Header
	times    []time.Time
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.times = append(s.times, time.Now())
	if len(s.statuses) == 0 {
		return
	}
	code := s.statuses[0]
	s.statuses = s.statuses[1:]
	for k, v := range s.header {
		w.Header()[k] = v
	}
	w.WriteHeader(code)
}

func (s *scripted) requests() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.times...)
}

// sendUntil calls h for msg up to attempts times, as a consumer's retry
// policy does: again after a retryable error, not after a permanent one.
// It returns the last error and the calls made.
func sendUntil(h consumer.Handler, msg consumer.Message, attempts int) (err error, calls int) {
	for calls < attempts {
		calls++
		if err = h(context.Background(), msg); err == nil || consumer.IsPermanent(err) {
			break
		}
	}
	return err, calls
}

func TestRetryPolicyWithSink(t *testing.T) {
	tests := []struct {
		name          string
		statuses      []int
		wantDelivered bool
		wantAttempts  int
	}{
		{"503 then success", []int{503, 503}, true, 3},
		{"400 is dead-lettered at once", []int{400}, false, 1},
		{"503 until attempts run out", []int{503, 503, 503, 503}, false, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script := &scripted{statuses: tt.statuses}
			srv := httptest.NewServer(script)
			defer srv.Close()
			s := newSink(t, httpsink.Config{URL: srv.URL})

			err, calls := sendUntil(sinks.Handler(s), jsonMsg(`{}`), 3)
			if (err == nil) != tt.wantDelivered || calls != tt.wantAttempts {
				t.Fatalf("%d attempts ended with %v, want delivered=%v after %d", calls, err, tt.wantDelivered, tt.wantAttempts)
			}
			if got := len(script.requests()); got != tt.wantAttempts {
				t.Errorf("server saw %d requests, want %d", got, tt.wantAttempts)
			}
		})
	}
}

// TestRetryAfterIsHonoured: a 429 with Retry-After: 2 is a retryable
// error that asks for at least 2 s, which the consumers' retry policy
// waits (kit's TestDelayBackoffJitterAndRetryAfter) and PushBack pauses the
// bucket for.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	script := &scripted{statuses: []int{429}, header: http.Header{"Retry-After": {"2"}}}
	srv := httptest.NewServer(script)
	defer srv.Close()
	s := newSink(t, httpsink.Config{URL: srv.URL})

	err := s.Send(context.Background(), jsonMsg(`{}`))
	if d, ok := consumer.RetryAfterOf(err); !ok || d < 2*time.Second || consumer.IsPermanent(err) {
		t.Errorf("a 429 with Retry-After: 2 = %v (retry after %v, %v), want retryable after >= 2s", err, d, ok)
	}
	if err, calls := sendUntil(sinks.Handler(s), jsonMsg(`{}`), 3); err != nil || calls != 1 {
		t.Fatalf("after the 429: %v after %d calls, want delivered at once", err, calls)
	}
}

func TestBodyTemplate(t *testing.T) {
	tests := []struct {
		name     string
		tmpl     string
		body     string
		want     string
		wantPerm string // non-empty: Send fails permanently, error contains this
	}{
		{
			name: "form-encoded SMS",
			tmpl: `To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}`,
			body: `{"to":"+15550100","text":"Hi & bye, 100%"}`,
			want: "To=%2B15550100&Body=Hi+%26+bye%2C+100%25",
		},
		{
			name: "form func with pairs",
			tmpl: `{{form "To" .JSON.to "Body" .JSON.text}}`,
			body: `{"to":"+15550100","text":"Hi & bye"}`,
			want: "Body=Hi+%26+bye&To=%2B15550100",
		},
		{
			name: "form func with a map",
			tmpl: `{{form .JSON}}`,
			body: `{"to":"+15550100","n":12345678901234567890}`,
			want: "n=12345678901234567890&to=%2B15550100",
		},
		{
			name: "json func",
			tmpl: `{"token":{{json .JSON.device}},"data":{{json .JSON}}}`,
			body: `{"device":"abc","n":1}`,
			want: `{"token":"abc","data":{"device":"abc","n":1}}`,
		},
		{
			name: "key, headers, source and attempt",
			tmpl: `{{.Key}} {{.Headers.tenant}} {{.Source.Topic}}/{{.Source.Offset}} {{.Attempt}} {{index .Headers "absent"}}`,
			body: `not json`,
			want: "k1 acme sms/42 1 ",
		},
		{
			name: "raw body string",
			tmpl: `text={{.Body | urlquery}}`,
			body: `plain text`,
			want: "text=plain+text",
		},
		{
			name:     "missing field",
			tmpl:     `To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}`,
			body:     `{"to":"+15550100"}`,
			wantPerm: `"text"`,
		},
		{
			name:     "body is not JSON",
			tmpl:     `To={{.JSON.to}}`,
			body:     `to=+15550100`,
			wantPerm: "<.JSON.to>",
		},
		{
			name:     "trailing garbage is not JSON",
			tmpl:     `To={{.JSON.to}}`,
			body:     `{"to":"x"} extra`,
			wantPerm: "<.JSON.to>",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				mu   sync.Mutex
				got  string
				ct   string
				hits int
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				got, ct, hits = string(b), r.Header.Get("Content-Type"), hits+1
				mu.Unlock()
			}))
			defer srv.Close()
			s := newSink(t, httpsink.Config{
				URL:          srv.URL,
				BodyTemplate: tt.tmpl,
				ContentType:  "application/x-www-form-urlencoded",
			})

			err := s.Send(context.Background(), jsonMsg(tt.body))
			mu.Lock()
			defer mu.Unlock()
			if tt.wantPerm != "" {
				if !consumer.IsPermanent(err) {
					t.Fatalf("Send = %v, want a permanent error", err)
				}
				for _, want := range []string{"body_template", tt.wantPerm} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				if hits != 0 {
					t.Errorf("server saw %d requests, want 0", hits)
				}
				return
			}
			if err != nil {
				t.Fatalf("Send: %v", err)
			}
			if got != tt.want {
				t.Errorf("body = %q, want %q", got, tt.want)
			}
			if ct != "application/x-www-form-urlencoded" {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
}

func TestRequestShape(t *testing.T) {
	t.Setenv("HTTPSINK_TEST_TOKEN", "expanded-again")
	var (
		mu  sync.Mutex
		req *http.Request
		raw string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		req, raw = r, string(b)
		mu.Unlock()
	}))
	defer srv.Close()
	s := newSink(t, httpsink.Config{
		URL:    srv.URL + "/v1/push?x=1",
		Method: http.MethodPut,
		Headers: map[string]string{
			// Values are used as given: the config package expanded the
			// environment once already, and a password holding "$$" or
			// "${" must not be expanded a second time.
			"Authorization": "Bearer p$$w${HTTPSINK_TEST_TOKEN}",
			"X-Region":      "eu",
		},
	})
	body := `{"device":"abc","title":"hi"}`
	if err := s.Send(context.Background(), jsonMsg(body)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	checks := map[string][2]string{
		"method":        {req.Method, http.MethodPut},
		"path":          {req.URL.Path, "/v1/push"},
		"query":         {req.URL.RawQuery, "x=1"},
		"body":          {raw, body},
		"Content-Type":  {req.Header.Get("Content-Type"), "application/json"},
		"Authorization": {req.Header.Get("Authorization"), "Bearer p$$w${HTTPSINK_TEST_TOKEN}"},
		"X-Region":      {req.Header.Get("X-Region"), "eu"},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s = %q, want %q", name, c[0], c[1])
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  httpsink.Config
		want string
	}{
		{"no url", httpsink.Config{}, "URL: required"},
		{"bad scheme", httpsink.Config{URL: "ftp://example.com/"}, `URL: scheme must be http or https, got "ftp"`},
		{"no host", httpsink.Config{URL: "http:///path"}, "URL: has no host"},
		{"bad method", httpsink.Config{URL: "http://x/", Method: "PO ST"}, "Method"},
		{"bad header name", httpsink.Config{URL: "http://x/", Headers: map[string]string{"X Bad": "v"}}, `Headers["X Bad"]: not a valid header name`},
		{"header injection", httpsink.Config{URL: "http://x/", Headers: map[string]string{"X-A": "v\r\nX-B: w"}}, `Headers["X-A"]: value holds a control character`},
		{"bad template", httpsink.Config{URL: "http://x/", BodyTemplate: "{{.JSON.to"}, "BodyTemplate: template: body_template:1"},
		{"unknown template func", httpsink.Config{URL: "http://x/", BodyTemplate: "{{nope .Body}}"}, `function "nope" not defined`},
		{"bad content type", httpsink.Config{URL: "http://x/", ContentType: "json; ="}, "ContentType"},
		{"negative timeout", httpsink.Config{URL: "http://x/", Timeout: -time.Second}, "Timeout: must not be negative"},
		{"negative max conns", httpsink.Config{URL: "http://x/", MaxConns: -1}, "MaxConns: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := httpsink.New(tt.cfg)
			if err == nil {
				_ = s.Close()
				t.Fatalf("New succeeded, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

// TestConnectionReuse counts the TCP connections the server accepts.
func TestConnectionReuse(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond)
		_, _ = io.WriteString(w, strings.Repeat("ok", 1000)) // a body the sink must drain
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	t.Run("sequential sends share one connection", func(t *testing.T) {
		conns.Store(0)
		s := newSink(t, httpsink.Config{URL: srv.URL})
		for i := range 50 {
			if err := s.Send(context.Background(), jsonMsg(`{}`)); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("50 sequential sends opened %d connections, want 1", n)
		}
	})

	t.Run("error responses keep the connection", func(t *testing.T) {
		errSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, strings.Repeat("x", 4000)) // longer than the snippet
		}))
		var errConns atomic.Int32
		errSrv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				errConns.Add(1)
			}
		}
		errSrv.Start()
		defer errSrv.Close()
		s := newSink(t, httpsink.Config{URL: errSrv.URL})
		for range 20 {
			if err := s.Send(context.Background(), jsonMsg(`{}`)); err == nil {
				t.Fatal("Send: nil error from a 503")
			}
		}
		if n := errConns.Load(); n != 1 {
			t.Errorf("20 sends answered 503 opened %d connections, want 1", n)
		}
	})

	t.Run("concurrent sends stay within MaxConns", func(t *testing.T) {
		conns.Store(0)
		s := newSink(t, httpsink.Config{URL: srv.URL, MaxConns: 3})
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() {
				if err := s.Send(context.Background(), jsonMsg(`{}`)); err != nil {
					t.Errorf("Send: %v", err)
				}
			})
		}
		wg.Wait()
		if n := conns.Load(); n < 1 || n > 3 {
			t.Errorf("30 concurrent sends opened %d connections, want 1..3", n)
		}
	})
}

func TestErrorsHideSecrets(t *testing.T) {
	const token, key, pw = "s3cret-token", "s3cret-key", "s3cret-pw"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "invalid credentials")
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()

	for _, base := range []string{srv.URL, "http://" + dead} {
		u := strings.Replace(base, "http://", "http://user:"+pw+"@", 1) + "/send?api_key=" + key
		s := newSink(t, httpsink.Config{
			URL:     u,
			Headers: map[string]string{"Authorization": "Bearer " + token},
		})
		err := s.Send(context.Background(), jsonMsg(`{}`))
		if err == nil {
			t.Fatalf("Send to %s: nil error", base)
		}
		for _, secret := range []string{token, key, pw} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q leaks %q", err, secret)
			}
		}
	}

	_, err = httpsink.New(httpsink.Config{URL: "http://x/", Headers: map[string]string{"Authorization": "Bearer " + token + "\n"}})
	if err == nil || strings.Contains(err.Error(), token) {
		t.Errorf("New error %v: want an error that does not quote the value", err)
	}
}

func TestErrorBodySnippetIsTruncated(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "line one\nline two "+strings.Repeat("y", 10000))
	}))
	defer srv.Close()
	s := newSink(t, httpsink.Config{URL: srv.URL})
	err := s.Send(context.Background(), jsonMsg(`{}`))
	var serr *httpsink.StatusError
	if !errors.As(err, &serr) {
		t.Fatalf("Send = %v, want a StatusError", err)
	}
	if !strings.HasPrefix(serr.Body, "line one line two yyy") || !strings.HasSuffix(serr.Body, "…") {
		t.Errorf("Body = %q, want the start of the body on one line, marked as truncated", serr.Body)
	}
	if len(err.Error()) > 400 {
		t.Errorf("error is %d bytes long, want a short snippet", len(err.Error()))
	}
}

// TestValidateTemplateFunctions is a regression test:
// the documented push-webhook and SMS templates call json and form, which
// Validate (what the config package calls) must know, exactly as New does.
func TestValidateTemplateFunctions(t *testing.T) {
	for _, tmpl := range []string{
		`{"token":{{json .JSON.device}}}`,
		`{{form "To" .JSON.to "Body" .JSON.text}}`,
		`To={{.JSON.to | urlquery}}&Body={{.JSON.text | urlquery}}`,
	} {
		if err := (httpsink.Config{URL: "http://x/", BodyTemplate: tmpl}).Validate(); err != nil {
			t.Errorf("Validate(%s) = %v", tmpl, err)
		}
	}
}

// TestValidateReportsEveryField checks that Validate lists every problem
// as a *sinks.FieldError naming the Go field, and never quotes a header
// value.
func TestValidateReportsEveryField(t *testing.T) {
	err := httpsink.Config{
		URL:          "ftp://user:hunter2@x/",
		Method:       "A B",
		Headers:      map[string]string{"Authorization": "Bearer hunter2\n", "X Y": "v"},
		BodyTemplate: "{{jsn .}}",
		Timeout:      -1,
	}.Validate()
	var got []string
	for _, fe := range sinks.FieldErrors(err) {
		got = append(got, fe.Field+"/"+fe.Key)
	}
	want := []string{"URL/", "Method/", "Timeout/", "Headers/Authorization", "Headers/X Y", "BodyTemplate/"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("fields = %q, want %q (error: %v)", got, want, err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error quotes a secret: %v", err)
	}
}
