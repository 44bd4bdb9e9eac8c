package config

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

func TestLimitAdaptiveMapsOntoTheLimiter(t *testing.T) {
	cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 100/s\n  adaptive: {min_rate: 5, decrease: 0.5, increase: 60/min, interval: 2s}", 1), nil)
	got := libs(t, cfg).Limiter.Adaptive
	want := limiter.Adaptive{MinRate: 5, Decrease: 0.5, Increase: 1, Interval: 2 * time.Second}
	if got == nil || *got != want {
		t.Fatalf("Adaptive = %+v, want %+v", got, want)
	}
	if a := libs(t, mustParse(t, minimal, nil)).Limiter.Adaptive; a != nil {
		t.Errorf("without limit.adaptive: %+v, want nil", a)
	}
	// Round trip through String.
	again := mustParse(t, cfg.String(), nil)
	if a := libs(t, again).Limiter.Adaptive; a == nil || *a != want {
		t.Errorf("after String(): %+v", a)
	}
}

func TestLimitAdaptiveErrorsNameTheKey(t *testing.T) {
	for _, c := range []struct{ adaptive, key, msg string }{
		{"{decrease: 0.5}", "limit.adaptive.min_rate", "is required"},
		{"{min_rate: 5, decrease: 1.5}", "limit.adaptive.decrease", "must be > 0 and < 1"},
		{"{min_rate: 5, increase: fast}", "limit.adaptive.increase", ""},
		{"{min_rate: 5, interval: -1s}", "limit.adaptive.interval", ">= 1µs"},
		{"{min_rate: 5, interval: 0s}", "limit.adaptive.interval", "must not be 0"},
		{"{min_rate: 20}", "limit.adaptive.min_rate", "must be <= the bucket's rate 10"},
		{"{min_rate: 11/s}", "limit.adaptive.min_rate", "must be <= the bucket's rate 10"},
	} {
		_, err := Parse([]byte(strings.Replace(minimal, "rate: 10", "rate: 10\n  adaptive: "+c.adaptive, 1)), nil)
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("adaptive %s: err = %v, want %s: ...%s", c.adaptive, err, c.key, c.msg)
		}
	}
	// A floor at the rate is valid, also written as another unit.
	mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  adaptive: {min_rate: 600/min}", 1), nil)
}

func TestLimitWarmup(t *testing.T) {
	cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  warmup: 60s", 1), nil)
	if cfg.Limit.Warmup != Duration(time.Minute) {
		t.Errorf("Warmup = %v", cfg.Limit.Warmup)
	}
	mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  warmup: 0s", 1), nil)
	_, err := Parse([]byte(strings.Replace(minimal, "rate: 10", "rate: 10\n  warmup: -5s", 1)), nil)
	if err == nil || !strings.Contains(err.Error(), "limit.warmup") || !strings.Contains(err.Error(), "between 1ms and 24h") {
		t.Errorf("warmup -5s: %v", err)
	}
}
