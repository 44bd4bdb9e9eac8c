package redislimiter

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestRateAboveTheMaximumIsRefused: an override of 1e20/s used to be
// stored, and the scripts' replies wrapped it to -9223372036854776/s.
func TestRateAboveTheMaximumIsRefused(t *testing.T) {
	c := newClient(t)
	a, err := NewAdmin(c, AdminConfig{Bucket: uniqueBucket(t, c)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, rate := range []float64{1e20, backend.MaxRate * 2} {
		var pe *limiter.ParamError
		if err := a.SetOverride(ctx, rate, 0, 0); !errors.As(err, &pe) || pe.Param != "Rate" {
			t.Errorf("SetOverride(%g) = %v; want a ParamError for Rate", rate, err)
		}
	}
	if st, err := a.Status(ctx); err != nil || st.Override != nil {
		t.Fatalf("status after refused overrides = %+v, %v; want no override", st, err)
	}
	if err := a.SetOverride(ctx, backend.MaxRate, backend.MaxBurst, 0); err != nil {
		t.Fatalf("SetOverride at the maximum = %v", err)
	}
	st, err := a.Status(ctx)
	if err != nil || st.Rate != backend.MaxRate || st.Burst != backend.MaxBurst || !st.TokensKnown || st.Tokens != backend.MaxBurst {
		t.Fatalf("status at the maximum = %+v, %v", st, err)
	}
}

// TestOutOfRangeOverrideInRedisIsIgnoredAndShown: an override written
// around SetOverride (an older binary, redis-cli) with rate 1e20 must
// neither turn the limit off nor overflow a reply, and status shows what
// Redis holds.
func TestOutOfRangeOverrideInRedisIsIgnoredAndShown(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 20, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, s.stateKeys[1], "rate", "1e20", "burst", "nan").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Take(ctx, backend.TakeRequest{Cost: 5})
	if err != nil || res.Rate != 20 || res.Burst != 5 {
		t.Fatalf("take under a 1e20 override = %+v, %v; want the configured 20/s burst 5", res, err)
	}
	res, err = s.Take(ctx, backend.TakeRequest{Cost: 1})
	if err != nil || res.Granted || res.Wait > 50*time.Millisecond || res.Wait < 40*time.Millisecond {
		t.Fatalf("take from the empty bucket = %+v, %v; want told to wait about 50ms (one token at 20/s)", res, err)
	}
	st, err := s.Status(ctx)
	if err != nil || st.Rate != 20 || st.Override != nil {
		t.Fatalf("store status = %+v, %v; want 20/s and no override in force", st, err)
	}
	a, _ := NewAdmin(c, AdminConfig{Bucket: s.cfg.Bucket})
	bs, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o := bs.Override
	if o == nil || !o.Ignored || o.Rate != 1e20 || o.RawRate != "1e20" || o.RawBurst != "nan" || o.Burst != 0 {
		t.Fatalf("admin status override = %+v; want 1e20 shown verbatim and marked ignored", o)
	}
	if bs.Rate != 0 || bs.TokensKnown {
		t.Fatalf("admin without limits = %+v; want rate and tokens unknown", bs)
	}
}

// TestRepliesStayExactAtTheLimits drives the scripts at MaxRate and
// MaxBurst with a long reservation, where milli-token replies are largest.
func TestRepliesStayExactAtTheLimits(t *testing.T) {
	c := newClient(t)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: backend.MaxRate, Burst: backend.MaxBurst})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro()
	for i := range 3 {
		res, err := s.take(ctx, at, backend.TakeRequest{Cost: backend.MaxBurst, MaxWait: time.Hour})
		if err != nil || !res.Granted || res.Rate != backend.MaxRate || res.Burst != backend.MaxBurst ||
			res.Remaining != -float64(i)*backend.MaxBurst {
			t.Fatalf("take %d = %+v, %v", i, res, err)
		}
	}
	st, err := s.status(ctx, at)
	if err != nil || st.Tokens != -2*backend.MaxBurst || st.Rate != backend.MaxRate {
		t.Fatalf("status = %+v, %v", st, err)
	}
}

func TestAdminWithoutLimits(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := uniqueBucket(t, c)
	s, err := New(c, Config{Bucket: name, Rate: 10, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdmin(c, AdminConfig{Bucket: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(ctx, backend.TakeRequest{Cost: 5}); err != nil {
		t.Fatal(err)
	}
	if st, err := a.Status(ctx); err != nil || st.Rate != 0 || st.Burst != 0 || st.TokensKnown || st.Override != nil {
		t.Fatalf("status without limits or override = %+v, %v; want nothing known", st, err)
	}
	if err := a.SetOverride(ctx, 50, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx)
	if err != nil || st.Rate != 50 || st.Burst != 0 || st.TokensKnown || st.Override == nil ||
		st.Override.Burst != 0 || st.Override.Ignored || st.Override.ExpiresIn < 59*time.Second {
		t.Fatalf("status with a rate-only override = %+v (%+v), %v; want rate 50, burst unknown (kept per replica)", st, st.Override, err)
	}
	if err := a.SetOverride(ctx, 50, 20, 0); err != nil {
		t.Fatal(err)
	}
	st, err = a.Status(ctx)
	if err != nil || st.Rate != 50 || st.Burst != 20 || !st.TokensKnown || st.Override.Burst != 20 || st.Override.ExpiresIn != 0 {
		t.Fatalf("status with a full override = %+v (%+v), %v", st, st.Override, err)
	}
	if err := a.ClearOverride(ctx); err != nil {
		t.Fatal(err)
	}
	// Fill without a known burst: every replica fills to its own.
	if err := a.Fill(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status(ctx); err != nil || st.Tokens != 5 {
		t.Fatalf("replica's view after an admin fill = %+v, %v; want its burst 5", st, err)
	}
	if err := s.Pause(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.Fill(ctx); err != nil {
		t.Fatal(err)
	}
	st2, err := s.Status(ctx)
	if err != nil || st2.PausedFor < 59*time.Second || st2.Tokens != 5 {
		t.Fatalf("after fill while paused = %+v, %v; want the pause kept and the bucket full at 5", st2, err)
	}
	if _, err := NewAdmin(c, AdminConfig{Bucket: "x", Rate: 1e20}); err == nil {
		t.Error("NewAdmin with Rate 1e20 succeeded")
	}
}

// TestConfigurationErrorsAreNotOutages: a wrong password, a missing one, a
// user without permission for scripts, and a wrong db are ErrMisconfigured
// (and ErrStore); a server that is down is only ErrStore.
func TestConfigurationErrorsAreNotOutages(t *testing.T) {
	sock := testenv.PrivateRedis(t, "--requirepass", "right")
	admin := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, Password: "right"})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha").Err(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		opts redis.Options
	}{
		{"wrong password", redis.Options{Password: "wrong"}},
		{"no password", redis.Options{}},
		{"no permission for scripts", redis.Options{Username: "noscripts", Password: "pw"}},
		{"db out of range", redis.Options{Password: "right", DB: 99}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Each call on a client of its own: Redis drops the connection
			// after some of these errors.
			store := func() *Store {
				o := tc.opts
				o.Network, o.Addr, o.MaxRetries = "unix", sock, -1
				c := redis.NewClient(&o)
				t.Cleanup(func() { c.Close() })
				s, err := New(c, Config{Bucket: "b", Rate: 10, Burst: 5})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			_, err := store().Take(ctx, backend.TakeRequest{Cost: 1})
			if !errors.Is(err, limiter.ErrMisconfigured) || !errors.Is(err, limiter.ErrStore) {
				t.Fatalf("Take = %v; want ErrMisconfigured and ErrStore", err)
			}
			if _, err := store().Status(ctx); !errors.Is(err, limiter.ErrMisconfigured) {
				t.Fatalf("Status = %v; want ErrMisconfigured", err)
			}
			if _, err := store().Heartbeat(ctx, "r", time.Second); !errors.Is(err, limiter.ErrMisconfigured) {
				t.Fatalf("Heartbeat = %v; want ErrMisconfigured", err)
			}
		})
	}
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: filepath.Join(t.TempDir(), "none.sock"), MaxRetries: -1})
	defer c.Close()
	s, _ := New(c, Config{Bucket: "b", Rate: 10, Burst: 5})
	if _, err := s.Take(ctx, backend.TakeRequest{Cost: 1}); !errors.Is(err, limiter.ErrStore) || errors.Is(err, limiter.ErrMisconfigured) {
		t.Fatalf("Take on a missing server = %v; want ErrStore only", err)
	}
}

// TestPauseRecordsWhoPaused: the replica whose push-back set the pause in
// force is recorded, and a shorter pause by another keeps it.
func TestPauseRecordsWhoPaused(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 10, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PauseBy(ctx, time.Minute, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := s.PauseBy(ctx, time.Second, "r2"); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil || st.PausedBy != "r1" || st.PausedFor < 59*time.Second {
		t.Fatalf("status = %+v, %v; want paused a minute by r1", st, err)
	}
	a, _ := NewAdmin(c, AdminConfig{Bucket: s.cfg.Bucket})
	if bs, err := a.Status(ctx); err != nil || bs.PausedBy != "r1" {
		t.Fatalf("admin status = %+v, %v; want paused by r1", bs, err)
	}
	if err := a.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status(ctx); err != nil || st.PausedBy != "" || st.PausedFor != 0 {
		t.Fatalf("after reset = %+v, %v; want no pause", st, err)
	}
}
