package integration

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// TestFaultSecretsNeverLogged drives the error paths that carry Redis
// errors into logs and errors — a wrong password, a wrong Sentinel
// password, a dead Redis, a URL given as an address — with passwords in the
// config, and checks that no password appears in the Bucket's log or in any
// error.
func TestFaultSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	const (
		password         = "redis-secret-5f2c"
		sentinelPassword = "sentinel-secret-8d1e"
	)
	srv := faultStartRedis(t, "--requirepass", "the-right-one")
	dead := faultFreePort(t)
	cases := []struct {
		name string
		cfg  config.Redis
	}{
		{"wrong password", config.Redis{Addr: srv.Addr(), Username: "default", Password: password}},
		{"dead redis", config.Redis{Addr: "127.0.0.1:" + strconv.Itoa(dead), Password: password}},
		{"dead sentinels", config.Redis{MasterName: faultMasterName, Addrs: []string{"127.0.0.1:" + strconv.Itoa(dead)},
			SentinelPassword: sentinelPassword, Password: password}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs testenv.Buffer
			var (
				mu   sync.Mutex
				errs []string
			)
			tc.cfg.Timeout = faultRedisTimeout
			client, err := redisconn.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			store, err := redislimiter.New(client, redislimiter.Config{Bucket: faultName(t), Rate: 100, Burst: 1})
			if err != nil {
				t.Fatal(err)
			}
			b, err := limiter.New(store, limiter.Options{
				Logger:        slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				ProbeInterval: 50 * time.Millisecond,
				Observer: &limiter.Observer{StoreError: func(err error) {
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			// A wrong password closes the bucket, an outage sends it to its
			// local fallback, which may wait before it grants: what
			// matters here is what reaches the log and the errors.
			wctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = b.Wait(wctx, 1)
			cancel()
			if b.Mode() == limiter.ModeShared {
				t.Fatalf("mode %s, want a fallback after a store failure", b.Mode())
			}
			ctx := testenv.Context(t, 10*time.Second)
			_, serr := store.Status(ctx)
			if serr == nil {
				t.Fatal("Status succeeded against a failing Redis")
			}
			// Wait for the store errors that the Bucket reports, so that
			// they are checked too.
			testenv.Eventually(t, 5*time.Second, "a store error reported by the Bucket", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(errs) >= 1
			})
			b.Close()
			mu.Lock()
			errs = append(errs, serr.Error())
			out := logs.String() + strings.Join(errs, "\n")
			mu.Unlock()
			if !strings.Contains(logs.String(), "bucket store") {
				t.Fatalf("the store failure was not logged; log:\n%s", logs.String())
			}
			for _, secret := range []string{password, sentinelPassword} {
				if strings.Contains(out, secret) {
					t.Errorf("a password reached the log or an error:\n%s", out)
				}
			}
			t.Logf("checked %d bytes of log and %d errors, e.g. %q", len(out), len(errs), errs[0])
		})
	}
	t.Run("url as address", func(t *testing.T) {
		_, err := redisconn.New(config.Redis{Addr: "redis://app:" + password + "@127.0.0.1:6379/0"})
		if err == nil || strings.Contains(err.Error(), password) {
			t.Errorf("redisconn.New with a URL address = %v; want an error without the password", err)
		}
	})
}
