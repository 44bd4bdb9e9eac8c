package providers

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestTwilioAnswers: auth check, recipients that pick the answer, and the
// hidden limit with Twilio's 429 shape, step by step at fixed instants.
func TestTwilioAnswers(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	p, err := New(Config{Mode: "twilio", Username: "AC1", Password: "tok", Limit: 2, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	post := func(user, pass, to string) (int, map[string]any) {
		form := url.Values{"To": {to}, "From": {"+15550001"}, "Body": {"hi"}}
		req := httptest.NewRequest(http.MethodPost, "/2010-04-01/Accounts/AC1/Messages.json", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth(user, pass)
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		var m map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &m)
		return rec.Code, m
	}
	steps := []struct {
		user, pass, to string
		at             time.Duration
		status         int
		code           float64 // Twilio error code; 0 for none
	}{
		{"AC1", "wrong", "+15551234", 0, 401, 20003},
		{"AC1", "tok", "+15551234", 0, 201, 0},
		{"AC1", "tok", "+15550000", 0, 400, 21610}, // counts towards the limit
		{"AC1", "tok", "+15551235", 0, 429, 20429},
		{"AC1", "tok", "+15551235", time.Second, 201, 0},
		{"AC1", "tok", "+15559999", time.Second, 400, 21211},
	}
	for i, s := range steps {
		now = time.Unix(1_800_000_000, 0).Add(s.at)
		status, body := post(s.user, s.pass, s.to)
		code, _ := body["code"].(float64)
		if status != s.status || code != s.code {
			t.Errorf("step %d: %d code %v; want %d code %v (%v)", i, status, code, s.status, s.code, body)
		}
	}
	st := p.Stats()
	if st.Delivered != 2 || st.Throttled != 1 || st.Rejected != 2 || st.Unauthorized != 1 {
		t.Errorf("stats = %+v", st)
	}
}

// TestAPNsNeedsHTTP2AndAValidToken serves the apns mode over TLS with
// HTTP/2, as the binary meets it.
func TestAPNsNeedsHTTP2AndAValidToken(t *testing.T) {
	p, err := New(Config{Mode: "apns", KeyID: "K", TeamID: "T"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(p)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = false
	tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	h1 := &http.Client{Transport: tr}
	resp, err := h1.Post(srv.URL+"/3/device/abc", "application/json", strings.NewReader(`{"aps":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusHTTPVersionNotSupported {
		t.Errorf("HTTP/1.1: %d, want 505", resp.StatusCode)
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/3/device/abc", strings.NewReader(`{"aps":{}}`))
	req.Header.Set("apns-topic", "com.example")
	req.Header.Set("authorization", "bearer not.a.jwt")
	resp, err = srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "InvalidProviderToken") {
		t.Errorf("bad token over HTTP/%d: %d %s, want 403 InvalidProviderToken", resp.ProtoMajor, resp.StatusCode, b)
	}
}
