package httpsink

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func p8(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// TestAPNsTokenReuse: one token is reused until DefaultAPNsTokenAge, which
// lies within APNs's 20..60 minute window, and then replaced.
func TestAPNsTokenReuse(t *testing.T) {
	if DefaultAPNsTokenAge < MinAPNsTokenAge || DefaultAPNsTokenAge > MaxAPNsTokenAge {
		t.Fatalf("DefaultAPNsTokenAge %v is outside [%v, %v]", DefaultAPNsTokenAge, MinAPNsTokenAge, MaxAPNsTokenAge)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	a, err := newAPNsAuth(p8(t, key), "KEY1", "TEAM1")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_800_000_000, 0)
	now := start
	a.now = func() time.Time { return now }
	token := func() string {
		req := httptest.NewRequest(http.MethodPost, "/3/device/x", nil)
		if err := a.Authorize(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "bearer ")
		if !ok {
			t.Fatalf("Authorization = %q", req.Header.Get("Authorization"))
		}
		return tok
	}
	steps := []struct {
		at     time.Duration
		issued time.Duration // the iat the token must carry
	}{
		{0, 0},
		{time.Minute, 0},
		{20 * time.Minute, 0}, // not replaced at the minimum age
		{DefaultAPNsTokenAge - time.Second, 0},
		{DefaultAPNsTokenAge, DefaultAPNsTokenAge},
		{DefaultAPNsTokenAge + 30*time.Minute, DefaultAPNsTokenAge},
		{2 * DefaultAPNsTokenAge, 2 * DefaultAPNsTokenAge},
	}
	for _, s := range steps {
		now = start.Add(s.at)
		kid, team, iat, err := VerifyES256(token(), &key.PublicKey)
		if err != nil || kid != "KEY1" || team != "TEAM1" {
			t.Fatalf("at %v: VerifyES256 = %q %q %v", s.at, kid, team, err)
		}
		if want := start.Add(s.issued); !iat.Equal(want) {
			t.Errorf("at %v: token issued at +%v, want +%v", s.at, iat.Sub(start), s.issued)
		}
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if _, _, _, err := VerifyES256(token(), &other.PublicKey); err == nil {
		t.Error("a token verified with another key")
	}
}

func TestNewAPNsAuthRejects(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rk, _ := rsa.GenerateKey(rand.Reader, 1024)
	tests := []struct {
		name       string
		key        []byte
		kid, team  string
		wantSubstr string
	}{
		{"not pem", []byte("secret-ish"), "K", "T", "no PEM block"},
		{"rsa", p8(t, rk), "K", "T", "not an ECDSA P-256"},
		{"p384", p8(t, p384), "K", "T", "not an ECDSA P-256"},
		{"no key id", p8(t, ec), "", "T", "key id"},
		{"no team id", p8(t, ec), "K", "", "team id"},
	}
	for _, tt := range tests {
		_, err := newAPNsAuth(tt.key, tt.kid, tt.team)
		if err == nil || !strings.Contains(err.Error(), tt.wantSubstr) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantSubstr)
		}
	}
}

// serviceAccount returns a service-account key file for a new key.
func serviceAccount(t *testing.T, tokenURI string) []byte {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "proj-1", "private_key_id": "k1",
		"private_key": string(p8(t, key)), "client_email": "a@proj-1.iam.gserviceaccount.com", "token_uri": tokenURI,
	})
	return b
}

// TestOAuthRefreshesEarly: the access token is replaced once it is within
// the refresh margin of its expiry, not at expiry; a failed refresh keeps
// a token that is still valid; an expired one is an error that names the
// endpoint's answer and not the key.
func TestOAuthRefreshesEarly(t *testing.T) {
	var issued atomic.Int32
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`)
			return
		}
		n := issued.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":"tok-%d","token_type":"Bearer","expires_in":3600}`, n)
	}))
	defer srv.Close()
	keyJSON := serviceAccount(t, srv.URL+"/token")
	a, project, err := newOAuthAuth(keyJSON, srv.Client())
	if err != nil || project != "proj-1" {
		t.Fatalf("newOAuthAuth = %v, %q", err, project)
	}
	// The oauth2 package stamps expiry with the real clock; the test
	// moves its own clock relative to the real now.
	base := time.Now()
	now := base
	a.now = func() time.Time { return now }
	bearer := func() (string, error) {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		err := a.Authorize(context.Background(), req)
		return req.Header.Get("Authorization"), err
	}
	steps := []struct {
		at   time.Duration
		fail bool
		want string // "" means an error
	}{
		{0, false, "Bearer tok-1"},
		{50 * time.Minute, false, "Bearer tok-1"},
		{56 * time.Minute, false, "Bearer tok-2"}, // within 5 min of expiry: replaced
		{57 * time.Minute, false, "Bearer tok-2"},
		{56*time.Minute + 56*time.Minute, true, "Bearer tok-2"}, // refresh fails, old still valid
		{56*time.Minute + 61*time.Minute, true, ""},             // expired, refresh fails
		{56*time.Minute + 62*time.Minute, false, "Bearer tok-3"},
	}
	for _, s := range steps {
		now = base.Add(s.at)
		fail.Store(s.fail)
		got, err := bearer()
		if s.want == "" {
			if err == nil || !strings.Contains(err.Error(), "invalid_grant") || strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("at %v: err = %v, want one naming invalid_grant and not the key", s.at, err)
			}
			continue
		}
		if err != nil || got != s.want {
			t.Errorf("at %v: %q, %v; want %q", s.at, got, err, s.want)
		}
	}
}

func TestNewOAuthAuthRejects(t *testing.T) {
	for _, tt := range []struct{ name, key, want string }{
		{"not json", "nope", "not a JSON"},
		{"user credentials", `{"type":"authorized_user"}`, `"authorized_user" is not service_account`},
		{"no private key", `{"type":"service_account","client_email":"a@b"}`, "no usable private key"},
	} {
		if _, _, err := newOAuthAuth([]byte(tt.key), http.DefaultClient); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestOAuthCheck: Check fails when the token endpoint refuses the key, not
// when it cannot be reached.
func TestOAuthCheck(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":"invalid_grant"}`)
	}))
	defer refuse.Close()
	a, _, err := newOAuthAuth(serviceAccount(t, refuse.URL+"/token"), refuse.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "invalid_grant") {
		t.Errorf("refused: Check = %v", err)
	}
	down := httptest.NewServer(http.NotFoundHandler())
	url := down.URL
	down.Close() // nothing listens there any more
	a, _, err = newOAuthAuth(serviceAccount(t, url+"/token"), http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(context.Background()); err != nil {
		t.Errorf("unreachable: Check = %v, want nil (sends retry)", err)
	}
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	if err := a.Authorize(context.Background(), req); err == nil {
		t.Error("unreachable: Authorize succeeded")
	}
}
