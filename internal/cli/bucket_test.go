package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// statusJSON mirrors the documented JSON output, with every key required.
type statusJSON struct {
	Bucket     *string     `json:"bucket"`
	Tokens     *float64    `json:"tokens"`
	Rate       *float64    `json:"rate"`
	Burst      *int        `json:"burst"`
	Configured *limitsJSON `json:"configured"`
	Override   *struct {
		Rate             float64  `json:"rate"`
		Burst            *int     `json:"burst"`
		ExpiresInSeconds *float64 `json:"expires_in_seconds"`
		Ignored          bool     `json:"ignored"`
		RawRate          string   `json:"raw_rate"`
		RawBurst         string   `json:"raw_burst"`
	} `json:"override"`
	PausedSeconds *float64      `json:"paused_seconds"`
	Replicas      []replicaJSON `json:"replicas"`
	Warnings      []string      `json:"warnings"`
	// Layers holds each layer of limit.extra as JSON keys and values.
	Layers []map[string]any `json:"layers"`
}

// replica returns the configured limits of the live replica id, zero when
// they are unknown, or nil when id is not alive.
func (st statusJSON) replica(id string) *limitsJSON {
	for _, r := range st.Replicas {
		if r.ID == id {
			if r.Configured == nil {
				return &limitsJSON{}
			}
			return r.Configured
		}
	}
	return nil
}

// bucketJSON runs a bucket command with --json and decodes its output,
// checking that every documented key is present.
func bucketJSON(t *testing.T, args ...string) statusJSON {
	t.Helper()
	code, stdout, stderr := runCLI(t, append([]string{"bucket"}, append(args, "--json")...)...)
	if code != ExitOK {
		t.Fatalf("bucket %q: exit code %d, stderr:\n%s", args, code, stderr)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stdout), &keys); err != nil {
		t.Fatalf("bucket %q: output is not a JSON object: %v\n%s", args, err, stdout)
	}
	for _, k := range []string{"bucket", "tokens", "rate", "burst", "configured", "override", "paused_seconds", "replicas", "warnings", "layers"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("bucket %q: JSON lacks key %q:\n%s", args, k, stdout)
		}
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("bucket %q: %v\n%s", args, err, stdout)
	}
	return st
}

func TestBucketCommands(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	path := bucketConfig(t, addr, name, 10, 4)
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })

	// A running replica, to show up among the live replicas.
	_, store := redisStore(t, addr, name, 10, 4)
	replica, err := limiter.New(store, limiter.Options{ReplicaID: "replica-under-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Close() })
	ctx := testenv.Context(t, 10*time.Second)
	for {
		reps, err := store.Admin().Replicas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(reps, func(r redislimiter.Replica) bool { return r.ID == "replica-under-test" }) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the replica never sent a heartbeat")
		case <-time.After(20 * time.Millisecond):
		}
	}

	t.Run("status of a new bucket", func(t *testing.T) {
		st := bucketJSON(t, "status", "--config", path)
		if *st.Bucket != name || st.Tokens == nil || *st.Tokens != 4 || *st.Rate != 10 || *st.Burst != 4 {
			t.Errorf("status %+v: want a full bucket of 4 at 10/s", st)
		}
		if st.Configured == nil || st.Configured.Rate != 10 || st.Configured.Burst != 4 {
			t.Errorf("configured %+v, want rate 10, burst 4", st.Configured)
		}
		if st.Override != nil || *st.PausedSeconds != 0 {
			t.Errorf("override %+v, paused %v; want none", st.Override, *st.PausedSeconds)
		}
		if r := st.replica("replica-under-test"); r == nil || r.Rate != 10 || r.Burst != 4 {
			t.Errorf("replicas %+v: want the running one, configured 10/s burst 4", st.Replicas)
		}
		if len(st.Warnings) != 0 {
			t.Errorf("warnings %q, want none", st.Warnings)
		}
	})

	t.Run("set with burst and expiry", func(t *testing.T) {
		st := bucketJSON(t, "set", name, "--config", path, "--rate", "30", "--burst", "7", "--for", "1m")
		if st.Override == nil || st.Override.Rate != 30 || st.Override.Burst == nil || *st.Override.Burst != 7 {
			t.Fatalf("override %+v, want rate 30, burst 7", st.Override)
		}
		if e := st.Override.ExpiresInSeconds; e == nil || *e <= 50 || *e > 60 {
			t.Errorf("expires_in_seconds %v, want about 60", e)
		}
		if *st.Rate != 30 || *st.Burst != 7 {
			t.Errorf("effective rate %v, burst %v; want the override's", *st.Rate, *st.Burst)
		}
		// With --redis the configured values come from the live
		// replica's heartbeats.
		st = bucketJSON(t, "status", name, "--redis", addr)
		if st.Configured == nil || st.Configured.Rate != 10 || st.Tokens == nil || *st.Rate != 30 || *st.Burst != 7 {
			t.Errorf("status with --redis %+v: want configured from the replica and the override's values", st)
		}
	})

	t.Run("set without burst keeps the configured one", func(t *testing.T) {
		st := bucketJSON(t, "set", name, "--config", path, "--rate", "12.5")
		if st.Override == nil || st.Override.Rate != 12.5 || st.Override.Burst != nil || st.Override.ExpiresInSeconds != nil {
			t.Fatalf("override %+v, want rate 12.5, burst null, no expiry", st.Override)
		}
		if *st.Burst != 4 {
			t.Errorf("burst %v, want the configured 4", *st.Burst)
		}
		st = bucketJSON(t, "status", name, "--redis", addr)
		if st.Tokens == nil || st.Burst == nil || *st.Burst != 4 || st.Rate == nil || *st.Rate != 12.5 {
			t.Errorf("status with --redis %+v: want the replica's burst 4 and rate 12.5", st)
		}
	})

	t.Run("clear", func(t *testing.T) {
		st := bucketJSON(t, "set", "--config", path, "--clear")
		if st.Override != nil || *st.Rate != 10 {
			t.Errorf("after --clear: override %+v, rate %v; want none and 10", st.Override, *st.Rate)
		}
		st = bucketJSON(t, "status", name, "--redis", addr)
		if st.Tokens == nil || st.Rate == nil || *st.Rate != 10 || st.Burst == nil || *st.Burst != 4 {
			t.Errorf("status with --redis and no override %+v: want the replica's 10/s burst 4", st)
		}
	})

	t.Run("fill and reset", func(t *testing.T) {
		for range 4 {
			if ok, err := replica.Allow(ctx, 1); err != nil || !ok {
				t.Fatalf("Allow: %v, %v", ok, err)
			}
		}
		if st := bucketJSON(t, "status", "--config", path); *st.Tokens > 1 {
			t.Fatalf("tokens %v after draining the bucket", *st.Tokens)
		}
		if st := bucketJSON(t, "fill", "--config", path); *st.Tokens != 4 {
			t.Errorf("tokens %v after fill, want 4", *st.Tokens)
		}
		bucketJSON(t, "set", "--config", path, "--rate", "99")
		st := bucketJSON(t, "reset", "--config", path)
		if st.Override != nil || *st.Tokens != 4 {
			t.Errorf("after reset: override %+v, tokens %v; want none and 4", st.Override, *st.Tokens)
		}
	})

	t.Run("text output", func(t *testing.T) {
		code, stdout, stderr := runCLI(t, "bucket", "set", "--config", path, "--rate", "20", "--for", "10m")
		if code != ExitOK || !strings.Contains(stdout, "now runs at 20/s") || !strings.Contains(stdout, "next token request") {
			t.Errorf("set: exit code %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		code, stdout, _ = runCLI(t, "bucket", "status", "--config", path)
		for _, want := range []string{"Bucket " + name, "rate        20/s (the override)", "override    20/s, each replica's configured burst, expires in 10m",
			"configured  10/s, burst 4", "paused      no", "replica-under-test"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("status does not contain %q:\n%s", want, stdout)
			}
		}
		if code != ExitOK {
			t.Errorf("status: exit code %d", code)
		}
		code, stdout, _ = runCLI(t, "bucket", "status", name, "--redis", addr)
		if code != ExitOK || !strings.Contains(stdout, "configured  10/s, burst 4 (reported by 1 live replica)") {
			t.Errorf("status with --redis: exit code %d:\n%s", code, stdout)
		}
	})
}

// bucketConfig writes a replica's config file for bucket name and returns
// its path.
func bucketConfig(t *testing.T, addr, name string, rate float64, burst int) string {
	return writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
limit: {bucket: %s, rate: %v, burst: %d}
source:
  rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: q}
sink: {stdout: {}}
`, addr, name, rate, burst))
}

// redisStore returns a client of the Redis at addr, closed when the test
// ends, and a store of bucket name on it.
func redisStore(t *testing.T, addr, name string, rate float64, burst int) (redis.UniversalClient, *redislimiter.Store) {
	t.Helper()
	client, err := redisconn.New(config.Redis{Addr: addr, Timeout: config.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store, err := redislimiter.New(client, redislimiter.Config{Bucket: name, Rate: rate, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	return client, store
}

// heartbeat makes a replica id of bucket name, configured with rate and
// burst, alive for a minute.
func heartbeat(t *testing.T, client redis.UniversalClient, name, id string, rate float64, burst int) {
	t.Helper()
	s, err := redislimiter.New(client, redislimiter.Config{Bucket: name, Rate: rate, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Heartbeat(context.Background(), id, time.Minute); err != nil {
		t.Fatal(err)
	}
}

func TestBucketStatusWithoutConfig(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	client, store := redisStore(t, addr, name, 1, 1)
	t.Cleanup(func() { client.Del(context.Background(), store.Keys()...) })

	t.Run("no replica alive", func(t *testing.T) {
		st := bucketJSON(t, "status", name, "--redis", addr)
		if st.Configured != nil || st.Tokens != nil || st.Rate != nil || st.Burst != nil || len(st.Replicas) != 0 {
			t.Errorf("status %+v: want configured, tokens, rate and burst null, no replicas", st)
		}
		code, stdout, _ := runCLI(t, "bucket", "status", name, "--redis", addr)
		if code != ExitOK || !strings.Contains(stdout, "configured  unknown; pass --config FILE") || !strings.Contains(stdout, "replicas    none alive") {
			t.Errorf("status: exit code %d:\n%s", code, stdout)
		}
	})

	t.Run("replicas that disagree", func(t *testing.T) {
		heartbeat(t, client, name, "old-1", 50, 5)
		heartbeat(t, client, name, "new-1", 80, 5)
		heartbeat(t, client, name, "new-2", 80, 5)
		st := bucketJSON(t, "status", name, "--redis", addr)
		if st.Configured != nil || st.Rate != nil {
			t.Errorf("status %+v: want configured and rate null while replicas disagree", st)
		}
		if r := st.replica("old-1"); r == nil || r.Rate != 50 || r.Burst != 5 {
			t.Errorf("replicas %+v: want old-1 at 50/s burst 5", st.Replicas)
		}
		if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "80/s burst 5 on new-1, new-2; 50/s burst 5 on old-1") {
			t.Errorf("warnings %q: want one naming both groups", st.Warnings)
		}
		code, stdout, _ := runCLI(t, "bucket", "status", name, "--redis", addr)
		if code != ExitOK || !strings.Contains(stdout, "warning     the live replicas are configured differently") {
			t.Errorf("status: exit code %d:\n%s", code, stdout)
		}
		// An override with a rate and no burst settles the rate; the
		// bursts agree, so nothing is left to warn about.
		if code, _, stderr := runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "60"); code != ExitOK {
			t.Fatalf("set: %s", stderr)
		}
		if st := bucketJSON(t, "status", name, "--redis", addr); len(st.Warnings) != 0 {
			t.Errorf("warnings %q under an override, want none", st.Warnings)
		}
	})

	t.Run("config file that differs from the replicas", func(t *testing.T) {
		path := bucketConfig(t, addr, name, 80, 5)
		st := bucketJSON(t, "status", "--config", path)
		if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "configures 80/s burst 5, but live replicas run 50/s burst 5 on old-1") {
			t.Errorf("warnings %q: want one naming old-1", st.Warnings)
		}
	})
}

func TestBucketRedisDown(t *testing.T) {
	code, _, stderr := runCLI(t, "bucket", "status", "x", "--redis", "127.0.0.1:1")
	if code != ExitFailure {
		t.Errorf("exit code %d, want %d; stderr %s", code, ExitFailure, stderr)
	}
	if !strings.HasPrefix(stderr, "throttle: reading bucket x:") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr %q, want one line naming the bucket", stderr)
	}
}

func TestBucketSetReachesReplicas(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	_, store := redisStore(t, addr, name, 5, 1)
	t.Cleanup(func() { store.Admin().Reset(context.Background()) })
	b, err := limiter.New(store, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := testenv.Context(t, 10*time.Second)
	if code, _, stderr := runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "40", "--burst", "3"); code != ExitOK {
		t.Fatalf("set: %s", stderr)
	}
	st, err := b.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rate != 40 || st.Burst != 3 || st.ConfiguredRate != 5 {
		t.Errorf("the replica sees rate %v, burst %d (configured %v); want 40, 3 (5)", st.Rate, st.Burst, st.ConfiguredRate)
	}
}

func TestBucketList(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	client, store := redisStore(t, addr, name, 1, 1)
	t.Cleanup(func() { client.Del(context.Background(), store.Keys()...) })
	heartbeat(t, client, name, "list-replica", 40, 4)
	if code, _, stderr := runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "25", "--for", "1m"); code != ExitOK {
		t.Fatalf("set: %s", stderr)
	}

	code, stdout, stderr := runCLI(t, "bucket", "list", "--redis", addr, "--json")
	if code != ExitOK {
		t.Fatalf("list --json: exit code %d, stderr %s", code, stderr)
	}
	var all []statusJSON
	if err := json.Unmarshal([]byte(stdout), &all); err != nil {
		t.Fatalf("list --json is not a JSON array of statuses: %v\n%s", err, stdout)
	}
	i := slices.IndexFunc(all, func(st statusJSON) bool { return st.Bucket != nil && *st.Bucket == name })
	if i < 0 {
		t.Fatalf("list lacks bucket %s:\n%s", name, stdout)
	}
	st := all[i]
	if st.Rate == nil || *st.Rate != 25 || st.Burst == nil || *st.Burst != 4 || st.Configured == nil || st.Configured.Rate != 40 || st.replica("list-replica") == nil {
		t.Errorf("bucket %s in the list: %+v; want the override's 25/s, the replica's burst 4 and its configured 40/s", name, st)
	}

	code, stdout, _ = runCLI(t, "bucket", "list", "--redis", addr)
	line := ""
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, name+" ") {
			line = strings.Join(strings.Fields(l), " ")
		}
	}
	if code != ExitOK || !strings.HasPrefix(stdout, "BUCKET") || !strings.HasPrefix(line, name+" 25/s 4 of 4 1 25/s for ") {
		t.Errorf("list: exit code %d, line %q of:\n%s", code, line, stdout)
	}

	if code, _, stderr := runCLI(t, "bucket", "list", name, "--redis", addr); code != ExitUsage || !strings.Contains(stderr, "takes no NAME") {
		t.Errorf("list NAME: exit code %d, stderr %q; want a usage error", code, stderr)
	}
}

// TestBucketSetRateRange is a regression test: 'bucket set --rate 1e20'
// turned the limit off, and status printed a negative rate and no
// override. A rate above backend.MaxRate is a usage error; rates may be
// given per second, minute, hour or day; status shows what Redis holds,
// also an override out of range that another program wrote.
func TestBucketSetRateRange(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	t.Cleanup(func() { runCLI(t, "bucket", "reset", name, "--redis", addr) })

	for _, rate := range []string{"1e20", "1000000001", "2e9/s", "NaN", "0", "-5", "5/week", "five"} {
		code, _, stderr := runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", rate)
		if code != ExitUsage || !strings.Contains(stderr, "--rate") {
			t.Errorf("bucket set --rate %s: exit %d, stderr %q; want %d naming --rate", rate, code, stderr, ExitUsage)
		}
		if tooLarge := rate == "1e20" || rate == "1000000001" || rate == "2e9/s"; tooLarge && !strings.Contains(stderr, "1e+09") {
			t.Errorf("bucket set --rate %s: stderr %q does not give the maximum", rate, stderr)
		}
	}
	if st := bucketJSON(t, "status", name, "--redis", addr); st.Override != nil {
		t.Fatalf("a rejected rate left an override: %+v", *st.Override)
	}

	for _, tc := range []struct {
		arg  string
		want float64
	}{
		{"5/min", 5.0 / 60},
		{"90/h", 90.0 / 3600},
		{"1e9", backend.MaxRate},
		{"12.5/s", 12.5},
	} {
		st := bucketJSON(t, "set", name, "--redis", addr, "--rate", tc.arg)
		if st.Override == nil || st.Override.Rate != tc.want || st.Rate == nil || *st.Rate != tc.want {
			t.Errorf("bucket set --rate %s: status %+v, override %+v; want rate %v", tc.arg, st, st.Override, tc.want)
		}
	}
	code, stdout, _ := runCLI(t, "bucket", "status", name, "--redis", addr)
	if code != ExitOK || !strings.Contains(stdout, "12.5/s (the override)") {
		t.Errorf("bucket status: exit %d:\n%s\nwant the override's 12.5/s", code, stdout)
	}

	// An override out of range, as an older binary could write it.
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	admin, err := redislimiter.NewAdmin(client, redislimiter.AdminConfig{Bucket: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.HSet(context.Background(), admin.Keys()[1], "rate", "1e20").Err(); err != nil {
		t.Fatal(err)
	}
	st := bucketJSON(t, "status", name, "--redis", addr)
	if st.Override == nil || !st.Override.Ignored || st.Override.RawRate != "1e20" {
		t.Errorf("status of an out-of-range override: %+v; want it shown, ignored, with raw_rate 1e20", st.Override)
	}
	if st.Rate != nil && *st.Rate < 0 {
		t.Errorf("status rate %v: negative", *st.Rate)
	}
	code, stdout, _ = runCLI(t, "bucket", "status", name, "--redis", addr)
	if code != ExitOK || !strings.Contains(stdout, "1e20") || !strings.Contains(stdout, "ignored") || strings.Contains(stdout, "-922") {
		t.Errorf("bucket status of an out-of-range override: exit %d:\n%s\nwant it shown as Redis holds it (1e20), and ignored", code, stdout)
	}
}

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		want string
	}{
		{12.5, "12.5/s"},
		{backend.MaxRate, "1000000000/s"},
		{0.5, "0.5/s"},
		{5.0 / 60, "5/min"},
		{1.0 / 3, "20/min"},
		{90.0 / 3600, "0.025/s"},
		{7.0 / 3600, "7/h"},
		{3.0 / 86400, "3/d"},
		{0.000123456789, "0.0001235/s"},
	} {
		if got := formatRate(tc.rate); got != tc.want {
			t.Errorf("formatRate(%v) = %q, want %q", tc.rate, got, tc.want)
		}
	}
}
