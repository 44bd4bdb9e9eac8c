package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/examples/mocksink/providers"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// provCase is one preset against its mock provider.
type provCase struct {
	preset string
	// mock is the provider's configuration (Mode and Limit are set by
	// the test).
	mock providers.Config
	// message returns the body of message i; gone makes the message go
	// to a recipient the provider reports gone.
	message func(i int, gone bool) string
	// env returns the binary's environment for the mock at url, with
	// good or bad credentials.
	env func(t *testing.T, p *providers.Provider, srv *httptest.Server, good bool) []string
	// authAtStart: bad credentials stop the binary at start-up; else the
	// first message is dead-lettered with authError in its error.
	authAtStart bool
	authError   string
	// sms: the cost template counts segments.
	sms bool
	// tls: the mock serves HTTP/2 over TLS.
	tls bool
	// noGone: the provider has no synchronous "recipient gone" answer
	// (Vonage's Messages API reports it later, by webhook); its
	// rejection is a plain permanent error.
	noGone bool
}

func provSMSMessage(i int, gone bool) string {
	to := fmt.Sprintf("+1555%07d", 1000+i)
	if gone {
		to = "+15550000000"
	}
	return fmt.Sprintf(`{"to":%q,"from":"+15550100","text":"hello %d"}`, to, i)
}

func provCases() []provCase {
	basic := func(userEnv, passEnv, user, pass string) func(*testing.T, *providers.Provider, *httptest.Server, bool) []string {
		return func(_ *testing.T, _ *providers.Provider, _ *httptest.Server, good bool) []string {
			if !good {
				pass = "wrong-" + pass
			}
			return []string{userEnv + "=" + user, passEnv + "=" + pass}
		}
	}
	return []provCase{
		{
			preset: httpsink.PresetTwilio, sms: true, authAtStart: true, authError: "rejected the credentials",
			mock:    providers.Config{Username: "ACmock1", Password: "tok-1"},
			message: provSMSMessage,
			env:     basic("TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "ACmock1", "tok-1"),
		},
		{
			preset: httpsink.PresetVonage, sms: true, noGone: true, authError: "vonage credentials rejected",
			mock:    providers.Config{Username: "key1", Password: "secret1"},
			message: provSMSMessage,
			env:     basic("VONAGE_API_KEY", "VONAGE_API_SECRET", "key1", "secret1"),
		},
		{
			preset: httpsink.PresetVonageSMS, sms: true, authError: "status 4 invalid credentials",
			mock:    providers.Config{Username: "key1", Password: "secret1"},
			message: provSMSMessage,
			env:     basic("VONAGE_API_KEY", "VONAGE_API_SECRET", "key1", "secret1"),
		},
		{
			preset: httpsink.PresetFCM, authAtStart: true, authError: "invalid_grant",
			message: func(i int, gone bool) string {
				tok := fmt.Sprintf("device-%d", i)
				if gone {
					tok = "gone-device"
				}
				return fmt.Sprintf(`{"token":%q,"notification":{"title":"hi","body":"n %d"}}`, tok, i)
			},
			env: func(t *testing.T, p *providers.Provider, srv *httptest.Server, good bool) []string {
				key := p.ServiceAccountJSON(srv.URL + "/token")
				if !good {
					other, err := rsa.GenerateKey(rand.Reader, 2048)
					if err != nil {
						t.Fatal(err)
					}
					key = providers.ServiceAccountJSON(other, "mock-project", srv.URL+"/token")
				}
				path := filepath.Join(t.TempDir(), "sa.json")
				if err := os.WriteFile(path, key, 0o600); err != nil {
					t.Fatal(err)
				}
				return []string{"GOOGLE_APPLICATION_CREDENTIALS=" + path}
			},
		},
		{
			preset: httpsink.PresetAPNs, tls: true, authError: "InvalidProviderToken",
			mock: providers.Config{KeyID: "KEY123", TeamID: "TEAM123"},
			message: func(i int, gone bool) string {
				tok := fmt.Sprintf("%064x", i)
				if gone {
					tok = "gone" + tok[4:]
				}
				return fmt.Sprintf(`{"token":%q,"payload":{"aps":{"alert":"n %d"}}}`, tok, i)
			},
			env: func(t *testing.T, p *providers.Provider, srv *httptest.Server, good bool) []string {
				dir := t.TempDir()
				key := p.SigningKeyPEM()
				if !good {
					other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
					key = providers.SigningKeyPEM(other)
				}
				keyPath, caPath := filepath.Join(dir, "apns.p8"), filepath.Join(dir, "ca.pem")
				ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
				if err := os.WriteFile(keyPath, key, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(caPath, ca, 0o600); err != nil {
					t.Fatal(err)
				}
				return []string{"APNS_KEY_FILE=" + keyPath, "APNS_KEY_ID=KEY123", "APNS_TEAM_ID=TEAM123",
					"APNS_TOPIC=com.example.app", "SSL_CERT_FILE=" + caPath}
			},
		},
	}
}

// provServe starts the mock: plain HTTP, or HTTP/2 over TLS.
func provServe(t *testing.T, p *providers.Provider, tls bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(p)
	if tls {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// provConfig is the binary's configuration for one case.
func provConfig(t *testing.T, c provCase, name, redisAddr, amqpURL, baseURL, metrics string) string {
	t.Helper()
	cost := ""
	if c.sms {
		cost = "  cost_template: '{{sms_segments .JSON.text}}'\n"
	}
	cfg := fmt.Sprintf(`
redis:
  addr: %q
  timeout: 2s
limit:
  bucket: %s
  rate: 100
  burst: 20
%ssource:
  rabbitmq:
    url: %q
    queue: %s
    prefetch: 20
    declare: true
sink:
  http:
    preset: %s
    url: %q
    timeout: 5s
    max_pause: 2s
delivery:
  max_attempts: 30
  backoff: 20ms
  max_backoff: 300ms
  drain_timeout: 10s
metrics:
  listen: %q
`, redisAddr, name, cost, amqpURL, name, c.preset, baseURL, metrics)
	path := filepath.Join(t.TempDir(), "throttle.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func provPublish(t *testing.T, ch *amqp.Channel, queue string, bodies ...string) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	for _, b := range bodies {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{ContentType: "application/json", Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
}

// provDead waits for n dead-lettered messages and returns them.
func provDead(t *testing.T, ch *amqp.Channel, queue string, n int, d time.Duration) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	cliWait(t, d, fmt.Sprintf("%d dead-lettered message(s) in %s", n, queue), func() bool {
		for {
			m, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				break
			}
			got = append(got, m)
		}
		return len(got) >= n
	})
	return got
}

func provHeader(m amqp.Delivery, name string) string {
	v, _ := m.Headers[name].(string)
	return v
}

// TestProvidersEndToEnd runs every preset through the binary against its
// mock provider: messages are delivered, the provider's hidden rate limit
// throttles some first, a message to a gone recipient is dead-lettered
// with x-throttle-recipient-gone and counted, a cost template that cannot
// render dead-letters its message with the reason, and bad credentials are
// a clear error at start-up or on the first send.
func TestProvidersEndToEnd(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	for _, c := range provCases() {
		t.Run(c.preset, func(t *testing.T) {
			t.Parallel()
			t.Run("delivered, throttled, dead-lettered", func(t *testing.T) { provTestFlow(t, c, bin, redisAddr, amqpURL) })
			t.Run("bad credentials", func(t *testing.T) { provTestBadAuth(t, c, bin, redisAddr, amqpURL) })
		})
	}
}

func provTestFlow(t *testing.T, c provCase, bin, redisAddr, amqpURL string) {
	const n = 20 // messages to good recipients
	mockCfg := c.mock
	mockCfg.Mode, mockCfg.Limit = c.preset, 3
	p, err := providers.New(mockCfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := provServe(t, p, c.tls)
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	cfg := provConfig(t, c, name, redisAddr, amqpURL, srv.URL, cliMetricsListen)
	proc := cliStartEnv(t, bin, c.env(t, p, srv, true), "run", "--config", cfg)
	metrics := cliServingAddr(t, proc)
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	cliWait(t, 20*time.Second, "the consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })

	bodies := make([]string, 0, n+2)
	for i := range n {
		bodies = append(bodies, c.message(i, false))
	}
	bodies = append(bodies, c.message(n, true))
	if c.sms {
		bodies = append(bodies, `{"to":"+15551112222","from":"+15550100","text":null}`)
	}
	provPublish(t, ch, name, bodies...)

	cliWait(t, 60*time.Second, fmt.Sprintf("%d recipients served", n), func() bool { return len(p.Stats().ByRecipient) == n })
	wantDead := 1
	if c.sms {
		wantDead = 2
	}
	dead := provDead(t, ch, name+".dlq", wantDead, 20*time.Second)
	st := p.Stats()
	if st.Throttled == 0 {
		t.Errorf("the provider never throttled (limit %d/s): the test did not exercise throttled-then-delivered", mockCfg.Limit)
	}
	gone, rejected := 0, 0
	for _, m := range dead {
		errText := provHeader(m, consumer.HeaderError)
		isGone := strings.Contains(string(m.Body), "gone") || strings.Contains(string(m.Body), "0000000")
		switch {
		case provHeader(m, httpsink.HeaderRecipientGone) == "true":
			gone++
			if !isGone {
				t.Errorf("recipient-gone header on %s", m.Body)
			}
		case c.noGone && isGone:
			// Dead-lettered for the rejection (permanent), not for running
			// out of attempts; an attempt before it may have been throttled.
			rejected++
			if !strings.Contains(errText, "422") {
				t.Errorf("rejection dead-lettered with %q, want the provider's 422", errText)
			}
		case c.sms && strings.Contains(errText, "limit.cost_template"):
			if provHeader(m, consumer.HeaderAttempts) != "1" {
				t.Errorf("cost failure took %s attempts, want 1 (permanent)", provHeader(m, consumer.HeaderAttempts))
			}
		default:
			t.Errorf("unexpected dead letter %s: headers %v", m.Body, m.Headers)
		}
	}
	wantGone := 1
	if c.noGone {
		wantGone = 0
		if rejected != 1 {
			t.Errorf("%d rejections dead-lettered, want 1", rejected)
		}
	}
	if gone != wantGone {
		t.Errorf("%d dead letters say recipient gone, want %d", gone, wantGone)
	}
	series := `throttle_sink_recipient_gone_total{preset="` + c.preset + `"}`
	cliWait(t, 5*time.Second, fmt.Sprintf("%s %d", series, wantGone), func() bool {
		_, body := cliGet("http://" + metrics + "/metrics")
		return strings.Contains(body, series) && cliMetric(body, series) == float64(wantGone)
	})
	if code := proc.stop(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

func provTestBadAuth(t *testing.T, c provCase, bin, redisAddr, amqpURL string) {
	mockCfg := c.mock
	mockCfg.Mode = c.preset
	p, err := providers.New(mockCfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := provServe(t, p, c.tls)
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	cfg := provConfig(t, c, name, redisAddr, amqpURL, srv.URL, cliMetricsListen)
	proc := cliStartEnv(t, bin, c.env(t, p, srv, false), "run", "--config", cfg)
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	if c.authAtStart {
		select {
		case <-proc.done:
		case <-time.After(20 * time.Second):
			t.Fatal("the binary did not stop on bad credentials")
		}
		if code := proc.cmd.ProcessState.ExitCode(); code == 0 {
			t.Errorf("exit code 0 on bad credentials")
		}
		if out := proc.stderr.String(); !strings.Contains(out, c.authError) {
			t.Errorf("output does not name the cause %q:\n%s", c.authError, out)
		}
		return
	}
	cliWait(t, 20*time.Second, "the consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })
	provPublish(t, ch, name, c.message(1, false))
	dead := provDead(t, ch, name+".dlq", 1, 20*time.Second)
	if e := provHeader(dead[0], consumer.HeaderError); !strings.Contains(e, c.authError) {
		t.Errorf("dead-letter error %q does not name %q", e, c.authError)
	}
	if st := p.Stats(); st.Delivered != 0 || st.Unauthorized == 0 {
		t.Errorf("stats %+v: want no delivery and at least one unauthorized request", st)
	}
	if code := proc.stop(t, 20*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}
