package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestBucketStatusShowsTheAdaptiveRate: after a push-back lowered the
// adaptive rate, 'bucket status' shows it (text and JSON); 'bucket set'
// replaces it.
func TestBucketStatusShowsTheAdaptiveRate(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli-adaptive")
	path := bucketConfig(t, addr, name, 100, 10)
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })
	_, store := redisStore(t, addr, name, 100, 10)

	adaptiveOf := func() map[string]any {
		t.Helper()
		code, stdout, stderr := runCLI(t, "bucket", "status", "--config", path, "--json")
		if code != ExitOK {
			t.Fatalf("status: %d %s", code, stderr)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(stdout), &v); err != nil {
			t.Fatal(err)
		}
		a, _ := v["adaptive"].(map[string]any)
		return a
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
