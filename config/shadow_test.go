package config

import (
	"strings"
	"testing"
)

// TestLimitShadowMapsOntoTheLimiter: limit.shadow becomes
// limiter.Options.Shadow; with limit.fair, the limiter's rule is a problem
// at limit.shadow.
func TestLimitShadowMapsOntoTheLimiter(t *testing.T) {
	lib := libs(t, mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  shadow: true", 1), nil))
	if !lib.Limiter.Shadow {
		t.Fatal("Limiter.Shadow = false, want true")
	}
	if libs(t, mustParse(t, minimal, nil)).Limiter.Shadow {
		t.Error("Limiter.Shadow without limit.shadow = true, want the default false")
	}
	fair := "rate: 10\n  shadow: true\n  fair:\n    key: '{{index .Headers \"x-tenant\"}}'"
	_, err := Parse([]byte(strings.Replace(minimal, "rate: 10", fair, 1)), env(nil))
	found := false
	for _, p := range problemsOf(t, err) {
		found = found || p.Key == "limit.shadow"
	}
	if !found {
		t.Errorf("limit.shadow with limit.fair: %v, want a problem at limit.shadow", err)
	}
}
