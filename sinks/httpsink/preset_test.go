package httpsink_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/examples/mocksink/providers"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// presetCase is a preset, its mock, and messages with known fates.
type presetCase struct {
	preset        string
	mock          providers.Config
	tls           bool
	creds         func(t *testing.T, p *providers.Provider, srv *httptest.Server) httpsink.Credentials
	headers       map[string]string
	ok, gone, bad string // message bodies
	throttled     string // what a throttled answer is: "push_back" or "retry"
}

func sms(to string) string { return `{"to":"` + to + `","from":"+15550100","text":"hello"}` }

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func presetCases() []presetCase {
	basic := func(u, p string) func(*testing.T, *providers.Provider, *httptest.Server) httpsink.Credentials {
		return func(*testing.T, *providers.Provider, *httptest.Server) httpsink.Credentials {
			return httpsink.Credentials{Username: u, Password: p}
		}
	}
	return []presetCase{
		{preset: "twilio", mock: providers.Config{Username: "AC1", Password: "tok"}, creds: basic("AC1", "tok"),
			ok: sms("+15551234567"), gone: sms("+15550000000"), bad: sms("+15559999999"), throttled: "retry"},
		{preset: "vonage", mock: providers.Config{Username: "k", Password: "s"}, creds: basic("k", "s"),
			ok: sms("15551234567"), gone: "", bad: sms("15559999999"), throttled: "push_back"},
		{preset: "vonage_sms", mock: providers.Config{Username: "k", Password: "s"}, creds: basic("k", "s"),
			ok: sms("15551234567"), gone: sms("15550000000"), bad: sms("15559999999"), throttled: "push_back"},
		{preset: "fcm", creds: func(t *testing.T, p *providers.Provider, srv *httptest.Server) httpsink.Credentials {
			return httpsink.Credentials{KeyFile: writeTemp(t, "sa.json", p.ServiceAccountJSON(srv.URL+"/token"))}
		}, ok: `{"token":"dev1","notification":{"title":"t"}}`, gone: `{"token":"gone1"}`, bad: `{"token":"bad1"}`, throttled: "push_back"},
		{preset: "apns", tls: true, mock: providers.Config{KeyID: "K1", TeamID: "T1"}, headers: map[string]string{"apns-topic": "com.example"},
			creds: func(t *testing.T, p *providers.Provider, _ *httptest.Server) httpsink.Credentials {
				return httpsink.Credentials{KeyFile: writeTemp(t, "k.p8", p.SigningKeyPEM()), KeyID: "K1", TeamID: "T1"}
			}, ok: `{"token":"abc123","payload":{"aps":{"alert":"hi"}}}`, gone: `{"token":"gone1","payload":{"aps":{}}}`,
			bad: `{"token":"bad1","payload":{"aps":{}}}`, throttled: "retry"},
	}
}

// TestPresetsAgainstMocks sends through each preset to its mock provider,
// in process: delivered, the rate-limit answer, recipient gone, rejected,
// and wrong credentials.
func TestPresetsAgainstMocks(t *testing.T) {
	for _, c := range presetCases() {
		t.Run(c.preset, func(t *testing.T) {
			// The mock's clock starts now: APNs tokens carry the real time.
			now := time.Now()
			mc := c.mock
			mc.Mode, mc.Limit, mc.Now = c.preset, 1, func() time.Time { return now }
			p, err := providers.New(mc)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewUnstartedServer(p)
			cfg := httpsink.Config{Preset: c.preset, Headers: c.headers, Timeout: 5 * time.Second}
			if c.tls {
				srv.EnableHTTP2 = true
				srv.StartTLS()
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
				cfg.TLS = &tls.Config{RootCAs: pool}
			} else {
				srv.Start()
			}
			defer srv.Close()
			cfg.URL = srv.URL
			cfg.Credentials = c.creds(t, p, srv)
			s, err := httpsink.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			if err := s.Check(ctx); err != nil {
				t.Fatalf("Check: %v", err)
			}
			send := func(body string) error { return s.Send(ctx, consumer.Message{Body: []byte(body)}) }

			if err := send(c.ok); err != nil {
				t.Fatalf("first message: %v", err)
			}
			// Limit 1 per second: the second in the same second is throttled.
			err = send(c.ok)
			d, hasDelay := consumer.RetryAfterOf(err)
			switch {
			case err == nil || consumer.IsPermanent(err):
				t.Errorf("throttled answer: %v, want retryable", err)
			case c.throttled == "push_back" && (!hasDelay || d <= 0):
				t.Errorf("throttled answer %v carries no delay, want push back", err)
			}
			now = now.Add(time.Second)
			if c.gone != "" {
				err := send(c.gone)
				var serr *httpsink.StatusError
				if !consumer.IsPermanent(err) || !httpsink.IsRecipientGone(err) || !errors.As(err, &serr) ||
					serr.DeadLetterHeaders()[httpsink.HeaderRecipientGone] != "true" || serr.Rule == "" {
					t.Errorf("gone recipient: %v (rule %q), want permanent and recipient gone", err, serr.Rule)
				}
				now = now.Add(time.Second)
			}
			err = send(c.bad)
			if !consumer.IsPermanent(err) || httpsink.IsRecipientGone(err) {
				t.Errorf("bad recipient: %v, want permanent, not gone", err)
			}
			if st := p.Stats(); st.Delivered != 1 {
				t.Errorf("stats %+v, want 1 delivered", st)
			}
		})
	}
}

// TestPresetBadCredentials: wrong credentials fail Check where the
// provider allows a check, and otherwise the first send, with a message
// that says so and never holds the secret.
func TestPresetBadCredentials(t *testing.T) {
	for _, c := range presetCases() {
		t.Run(c.preset, func(t *testing.T) {
			mc := c.mock
			mc.Mode = c.preset
			p, err := providers.New(mc)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewUnstartedServer(p)
			cfg := httpsink.Config{Preset: c.preset, Headers: c.headers}
			if c.tls {
				srv.EnableHTTP2 = true
				srv.StartTLS()
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
				cfg.TLS = &tls.Config{RootCAs: pool}
			} else {
				srv.Start()
			}
			defer srv.Close()
			cfg.URL = srv.URL
			// Credentials of another provider instance: same shape, wrong keys.
			other, err := providers.New(mc)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Credentials = c.creds(t, other, srv)
			if cfg.Credentials.Password != "" {
				cfg.Credentials.Password = "wrong-secret-value"
			}
			s, err := httpsink.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = s.Check(context.Background())
			if err == nil {
				err = s.Send(context.Background(), consumer.Message{Body: []byte(c.ok)})
			}
			if err == nil {
				t.Fatal("bad credentials were accepted")
			}
			if strings.Contains(err.Error(), "wrong-secret-value") || strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("the error quotes a secret: %v", err)
			}
			if p.Stats().Unauthorized == 0 {
				t.Errorf("error %v, but the provider saw no unauthorized request", err)
			}
			t.Logf("%s: %v", c.preset, err)
		})
	}
}

// TestPresetNeedsCredentials: a preset without its credentials fails in
// New, naming the field and the environment variable.
func TestPresetNeedsCredentials(t *testing.T) {
	for _, tt := range []struct{ preset, want string }{
		{"twilio", "TWILIO_ACCOUNT_SID"},
		{"vonage", "VONAGE_API_KEY"},
		{"vonage_sms", "VONAGE_API_SECRET"},
		{"fcm", "GOOGLE_APPLICATION_CREDENTIALS"},
		{"apns", "APNS_KEY_FILE"},
	} {
		for _, v := range []string{"TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "VONAGE_API_KEY", "VONAGE_API_SECRET",
			"GOOGLE_APPLICATION_CREDENTIALS", "APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID"} {
			t.Setenv(v, "")
		}
		_, err := httpsink.New(httpsink.Config{Preset: tt.preset})
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Credentials.") {
			t.Errorf("%s: err = %v, want one naming Credentials.* and %s", tt.preset, err, tt.want)
		}
	}
	if err := (httpsink.Config{Preset: "sinch"}).Validate(); err == nil || !strings.Contains(err.Error(), "twilio, vonage, vonage_sms, fcm, apns") {
		t.Errorf("unknown preset: %v", err)
	}
}

// TestPresetFromEnvironment: credentials left zero come from the
// environment variables the preset names.
func TestPresetFromEnvironment(t *testing.T) {
	p, err := providers.New(providers.Config{Mode: "twilio", Username: "ACenv", Password: "envtok"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	t.Setenv("TWILIO_ACCOUNT_SID", "ACenv")
	t.Setenv("TWILIO_AUTH_TOKEN", "envtok")
	s, err := httpsink.New(httpsink.Config{Preset: "twilio", URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Send(context.Background(), consumer.Message{Body: []byte(sms("+15551234567"))}); err != nil {
		t.Fatal(err)
	}
}

// TestVonageSMSUnicodeType: the legacy Vonage API must be told type=unicode
// for UCS-2 text; GSM-7 text goes as type=text.
func TestVonageSMSUnicodeType(t *testing.T) {
	got := make(chan url.Values, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		got <- r.PostForm
		fmt.Fprint(w, `{"message-count":"1","messages":[{"status":"0"}]}`)
	}))
	defer srv.Close()
	s, err := httpsink.New(httpsink.Config{Preset: "vonage_sms", URL: srv.URL, Credentials: httpsink.Credentials{Username: "k", Password: "s"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tt := range []struct{ text, want string }{{"hello {€}", "text"}, {"привет", "unicode"}} {
		if err := s.Send(context.Background(), consumer.Message{Body: []byte(`{"to":"1555","from":"Acme","text":"` + tt.text + `"}`)}); err != nil {
			t.Fatal(err)
		}
		f := <-got
		if f.Get("type") != tt.want || f.Get("text") != tt.text || f.Get("api_key") != "k" || f.Get("api_secret") != "s" {
			t.Errorf("%q: form %v, want type=%s with the credentials", tt.text, f, tt.want)
		}
	}
}
