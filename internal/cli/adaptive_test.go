package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// TestBucketStatusShowsTheAdaptiveRate: after a push-back lowered the
// adaptive rate, 'bucket status' shows it (text and JSON); 'bucket set'
// replaces it.
func TestBucketStatusShowsTheAdaptiveRate(t *testing.T) {
	path, store := statusBucket(t, "cli-adaptive", 100, 10)

	adaptiveOf := func() map[string]any {
		t.Helper()
		return statusObject(t, path, "adaptive")
	}
	if a := adaptiveOf(); a != nil {
		t.Errorf("adaptive before any push-back = %v, want null", a)
	}
	if _, ok, err := store.Decrease(testenv.Context(t, 10*time.Second), limiter.Adaptive{MinRate: 5}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	a := adaptiveOf()
	if a == nil || a["rate"].(float64) < 70 || a["rate"].(float64) > 71 || a["ceiling"].(float64) != 100 || a["since_decrease_seconds"] == nil {
		t.Errorf("adaptive after a push-back = %v, want rate ~70 of ceiling 100", a)
	}
	if code, stdout, _ := runCLI(t, "bucket", "status", "--config", path); code != ExitOK || !strings.Contains(stdout, "adaptive") || !strings.Contains(stdout, "ceiling of 100/s") {
		t.Errorf("text status:\n%s", stdout)
	}
	if code, _, stderr := runCLI(t, "bucket", "set", "--config", path, "--rate", "50"); code != ExitOK {
		t.Fatal(stderr)
	}
	if a := adaptiveOf(); a != nil {
		t.Errorf("adaptive after bucket set = %v, want null (the override replaces it)", a)
	}
}

// TestBucketStatusShowsTheWarmup: with limit.warmup, 'bucket status' says a
// new bucket is cold, and that a ramp is in progress after a first take.
func TestBucketStatusShowsTheWarmup(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli-warmup")
	path := writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
limit: {bucket: %s, rate: 30, burst: 30, warmup: 60s}
source:
  rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: q}
sink: {stdout: {}}
`, addr, name))
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })
	client, _ := redisStore(t, addr, name, 30, 30)
	store, err := redislimiter.New(client, redislimiter.Config{Bucket: name, Rate: 30, Burst: 30, Warmup: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	warmupOf := func() map[string]any {
		t.Helper()
		return statusObject(t, path, "warmup")
	}
	if w := warmupOf(); w == nil || w["cold"] != true {
		t.Errorf("new bucket: warmup = %v, want cold", w)
	}
	if _, err := store.Take(testenv.Context(t, 10*time.Second), backend.TakeRequest{Cost: 1}); err != nil {
		t.Fatal(err)
	}
	w := warmupOf()
	if w == nil || w["ramping"] != true || w["rate_factor"].(float64) < 0.33 || w["rate_factor"].(float64) > 0.35 || w["seconds_left"].(float64) < 50 {
		t.Errorf("after the first take: warmup = %v, want ramping at ~1/3 of the rate, ~60s left", w)
	}
	if code, stdout, _ := runCLI(t, "bucket", "status", "--config", path); code != ExitOK || !strings.Contains(stdout, "ramping: 33% of the rate") {
		t.Errorf("text status:\n%s", stdout)
	}
}

// statusObject runs 'bucket status --json' on the config at path, failing
// the test unless it exits ExitOK with valid JSON, and returns the object
// under field (nil when it is absent or null).
func statusObject(t *testing.T, path, field string) map[string]any {
	t.Helper()
	code, stdout, stderr := runCLI(t, "bucket", "status", "--config", path, "--json")
	if code != ExitOK {
		t.Fatalf("status: %d %s", code, stderr)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatal(err)
	}
	o, _ := v[field].(map[string]any)
	return o
}

// statusBucket makes a bucket named after the test (prefix), a config file
// for the CLI pointing at it, reset when the test ends, and a store on it.
func statusBucket(t *testing.T, prefix string, rate float64, burst int) (string, *redislimiter.Store) {
	t.Helper()
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, prefix)
	path := bucketConfig(t, addr, name, rate, burst)
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })
	_, store := redisStore(t, addr, name, rate, burst)
	return path, store
}
