package console

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

const testToken = "0123456789abcdef-console"

// fakeBackend records the actions it is asked for.
type fakeBackend struct {
	mu      sync.Mutex
	actions []Action
	err     error // returned by Do
	samples int
}

func (b *fakeBackend) Buckets() []string { return []string{"sms"} }

func (b *fakeBackend) Status(context.Context) (any, error) {
	return []map[string]any{{"bucket": "sms", "rate": 10}}, nil
}

func (b *fakeBackend) Sample(context.Context) ([]BucketFrame, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.samples++
	d := float64(b.samples)
	return []BucketFrame{{Name: "sms", Status: map[string]any{"rate": 10}, Mode: "shared", Delivered: &d}}, nil
}

func (b *fakeBackend) Do(_ context.Context, a Action) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.actions = append(b.actions, a)
	if b.err != nil {
		return "", b.err
	}
	return "done " + a.Op, nil
}

func (b *fakeBackend) done() []Action {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Action(nil), b.actions...)
}

func newTestServer(t *testing.T, token string, b Backend, log *bytes.Buffer) *httptest.Server {
	t.Helper()
	var l *slog.Logger
	if log != nil {
		l = slog.New(slog.NewTextHandler(log, nil))
	}
	s, err := New(Config{Backend: b, Token: token, Log: l, LoopbackOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	srv := httptest.NewServer(s)
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return srv
}

func do(t *testing.T, method, url, auth, body string) (int, map[string]string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]string
	data, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out, resp.Header
}

// TestActionsNeedTheToken: every action without the token, with a wrong
// one, with the token's prefix or in another scheme is refused with 401
// and never reaches the backend; with the token it does, and the log line
// names the client and the change but never the token.
func TestActionsNeedTheToken(t *testing.T) {
	b := &fakeBackend{}
	var log bytes.Buffer
	srv := newTestServer(t, testToken, b, &log)
	actions := []struct{ method, path, body string }{
		{"POST", "/api/buckets/sms/rate", `{"rate": "10/s"}`},
		{"DELETE", "/api/buckets/sms/rate", ""},
		{"POST", "/api/buckets/sms/fill", ""},
		{"POST", "/api/buckets/sms/pause", `{"for": "30s"}`},
		{"POST", "/api/buckets/sms/resume", ""},
	}
	for _, a := range actions {
		for _, auth := range []string{"", "Bearer ", "Bearer wrong", "Bearer " + testToken[:len(testToken)-1], "Bearer " + testToken + "x",
			"Basic " + testToken, "Bearer  " + testToken, testToken} {
			code, body, h := do(t, a.method, srv.URL+a.path, auth, a.body)
			if code != http.StatusUnauthorized || body["error"] == "" || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with Authorization %q: %d %v; want 401 with an error", a.method, a.path, auth, code, body)
			}
		}
	}
	if got := b.done(); len(got) != 0 {
		t.Fatalf("refused actions reached the backend: %+v", got)
	}
	for _, a := range actions {
		if code, body, _ := do(t, a.method, srv.URL+a.path, "Bearer "+testToken, a.body); code != http.StatusOK || body["message"] == "" {
			t.Errorf("%s %s with the token: %d %v; want 200", a.method, a.path, code, body)
		}
	}
	want := []Action{
		{Bucket: "sms", Op: "set", Rate: "10/s"}, {Bucket: "sms", Op: "clear"}, {Bucket: "sms", Op: "fill"},
		{Bucket: "sms", Op: "pause", For: "30s"}, {Bucket: "sms", Op: "resume"},
	}
	got := b.done()
	if len(got) != len(want) {
		t.Fatalf("backend got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("action %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	logs := log.String()
	if strings.Contains(logs, testToken[:8]) {
		t.Errorf("the log shows the token:\n%s", logs)
	}
	if !strings.Contains(logs, `msg="console: action" remote=127.0.0.1 bucket=sms action=set done="done set"`) ||
		!strings.Contains(logs, `msg="console: action refused" remote=127.0.0.1 bucket=sms action=fill status=401`) {
		t.Errorf("the log does not name the client and the change of every action:\n%s", logs)
	}
}

// TestTokenMatches: the comparison accepts exactly the token, and an
// empty configured token matches nothing, not even an empty one.
func TestTokenMatches(t *testing.T) {
	s, err := New(Config{Backend: &fakeBackend{}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]bool{testToken: true, "": false, testToken[:10]: false, testToken + " ": false, strings.ToUpper(testToken): false} {
		if got := s.tokenMatches(tok); got != want {
			t.Errorf("tokenMatches(%q) = %v, want %v", tok, got, want)
		}
	}
	ro, err := New(Config{Backend: &fakeBackend{}})
	if err != nil {
		t.Fatal(err)
	}
	if ro.tokenMatches("") {
		t.Error("a console without a token accepts the empty token")
	}
}

// TestReadOnlyConsole: without a token every action is refused with 403
// (even with some bearer), the backend is never asked, and the frames say
// read_only, which the page shows.
func TestReadOnlyConsole(t *testing.T) {
	b := &fakeBackend{}
	srv := newTestServer(t, "", b, nil)
	for _, auth := range []string{"", "Bearer ", "Bearer anything"} {
		code, body, _ := do(t, "POST", srv.URL+"/api/buckets/sms/fill", auth, "")
		if code != http.StatusForbidden || !strings.Contains(body["error"], "read-only") {
			t.Errorf("fill with %q on a read-only console: %d %v; want 403 read-only", auth, code, body)
		}
	}
	if got := b.done(); len(got) != 0 {
		t.Fatalf("a read-only console passed actions on: %+v", got)
	}
	resp, err := http.Get(srv.URL + "/api/frame")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var f Frame
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || !f.ReadOnly || len(f.Buckets) != 1 {
		t.Fatalf("frame = %+v, %v; want read_only and one bucket", f, err)
	}
	js, err := fs.ReadFile(assets, "assets/console.js")
	if err != nil || !bytes.Contains(js, []byte("read-only: console.token is not set")) {
		t.Errorf("the page does not say it is read-only (%v)", err)
	}
}

// TestBadInput: the backend's InputError is 400 with its message (404 for
// a bucket it does not show), a body that is not the expected JSON is 400
// before the backend is asked, and a failure of Redis is 502.
func TestBadInput(t *testing.T) {
	b := &fakeBackend{}
	srv := newTestServer(t, testToken, b, nil)
	auth := "Bearer " + testToken
	for _, c := range []struct{ path, body, want string }{
		{"/api/buckets/sms/rate", `{"rate": 10}`, "the body must be a JSON object"},
		{"/api/buckets/sms/rate", `{"rate": "1/s", "burst": 3}`, "unknown field"},
		{"/api/buckets/sms/rate", `{}`, `the body must be {"rate": R}`},
		{"/api/buckets/sms/rate", `not json`, "the body must be a JSON object"},
		{"/api/buckets/sms/pause", `{"rate": "1/s"}`, `the body must be {"for": D}`},
		{"/api/buckets/sms/pause", strings.Repeat(" ", maxBody+1) + `{"for": "1s"}`, "the body must be a JSON object"},
	} {
		code, body, _ := do(t, "POST", srv.URL+c.path, auth, c.body)
		if code != http.StatusBadRequest || !strings.Contains(body["error"], c.want) {
			t.Errorf("POST %s %.40q: %d %v; want 400 %q", c.path, c.body, code, body, c.want)
		}
	}
	if got := b.done(); len(got) != 0 {
		t.Fatalf("malformed bodies reached the backend: %+v", got)
	}
	b.err = &InputError{Msg: "rate must be a number > 0 and <= 1e+09, got 0/s"}
	if code, body, _ := do(t, "POST", srv.URL+"/api/buckets/sms/rate", auth, `{"rate": "0/s"}`); code != http.StatusBadRequest || body["error"] != b.err.Error() {
		t.Errorf("a rate out of range: %d %v; want 400 with the backend's message", code, body)
	}
	b.err = &InputError{Msg: "bucket other is not one this console shows (sms)", NotFound: true}
	if code, _, _ := do(t, "POST", srv.URL+"/api/buckets/other/fill", auth, ""); code != http.StatusNotFound {
		t.Errorf("an unknown bucket: %d; want 404", code)
	}
	b.err = io.ErrUnexpectedEOF
	if code, _, _ := do(t, "POST", srv.URL+"/api/buckets/sms/fill", auth, ""); code != http.StatusBadGateway {
		t.Errorf("a failing Redis: %d; want 502", code)
	}
	if code, _, _ := do(t, "GET", srv.URL+"/api/buckets/sms/fill", auth, ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET of an action: %d; want 405", code)
	}
}

// TestLoopbackOnly: a console on loopback refuses a request whose Host
// names something else, as a page using DNS rebinding sends.
func TestLoopbackOnly(t *testing.T) {
	srv := newTestServer(t, testToken, &fakeBackend{}, nil)
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "evil.example:80": http.StatusMisdirectedRequest,
		"localhost:8090": http.StatusOK, "127.0.0.1": http.StatusOK, "[::1]:8090": http.StatusOK} {
		req, _ := http.NewRequest("GET", srv.URL+"/api/status", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestEventsStream: /api/events sends the latest frame at once and each
// new one after, with the delivered rate in the chart's history.
func TestEventsStream(t *testing.T) {
	srv := newTestServer(t, testToken, &fakeBackend{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var frames []Frame
	for len(frames) < 2 && sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var f Frame
		if err := json.Unmarshal([]byte(data), &f); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	if len(frames) < 2 {
		t.Fatalf("got %d frames: %v", len(frames), sc.Err())
	}
	h := frames[1].Buckets[0].History
	if len(h) != 300 || h[len(h)-1] == nil || h[len(h)-2] == nil || *h[len(h)-1] <= *h[len(h)-2] {
		t.Fatalf("the history does not end with the last two samples: %d points, last %v %v", len(h), h[len(h)-2], h[len(h)-1])
	}
}

// TestPageIsSelfContained: the page, its style and script are embedded
// and load nothing from elsewhere (no CDN), and the security headers
// forbid it too.
func TestPageIsSelfContained(t *testing.T) {
	srv := newTestServer(t, testToken, &fakeBackend{}, nil)
	for _, path := range []string{"/", "/console.css", "/console.js"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) < 500 {
			t.Errorf("GET %s: %d, %d bytes", path, resp.StatusCode, len(body))
		}
		if bytes.Contains(body, []byte("http://")) || bytes.Contains(body, []byte("https://")) || bytes.Contains(body, []byte("//cdn")) {
			t.Errorf("%s loads something from elsewhere", path)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("%s: Content-Security-Policy %q", path, csp)
		}
	}
}
