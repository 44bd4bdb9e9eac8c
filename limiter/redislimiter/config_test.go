package redislimiter_test

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// TestConfigValidate: Config.Validate, which config calls for the limit
// section, reports every field out of range as a *limiter.ParamError naming
// it, joined; a Burst of 0 is the default, and WithDefaults fills it (and
// the prefix) as New does.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	bad := redislimiter.Config{Bucket: "a b", Rate: -1, Burst: -2, Warmup: 25 * time.Hour}
	err := bad.Validate()
	got := map[string]bool{}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var pe *limiter.ParamError
		if !errors.As(e, &pe) {
			t.Fatalf("%v is not a *ParamError", e)
		}
		got[pe.Param] = true
	}
	for _, p := range []string{"Bucket", "Rate", "Burst", "Warmup"} {
		if !got[p] {
			t.Errorf("Validate() = %v: nothing about %s", err, p)
		}
	}
	ok := redislimiter.Config{Bucket: "sms", Rate: 2.5}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate() = %v for a valid config with the default burst", err)
	}
	if d := ok.WithDefaults(); d.Burst != 3 || d.Prefix != redislimiter.DefaultPrefix {
		t.Errorf("WithDefaults() = %+v, want burst 3 and the default prefix", d)
	}
	if _, err := redislimiter.New(nil, ok); err == nil {
		t.Error("New without a client: no error")
	}
}
