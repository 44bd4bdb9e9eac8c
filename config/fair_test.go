package config

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

// TestLimitFairMapsOntoTheLibraries: limit.fair becomes limiter.Fair, the
// consumer's Tenant (the template on the message) and TenantWaiting, and
// turns on set-aside where the order allows it.
func TestLimitFairMapsOntoTheLibraries(t *testing.T) {
	fair := "rate: 10\n  fair:\n    key: '{{index .Headers \"x-tenant\"}}'\n    weights: {acme: 3}\n    max_waiting: 7"
	key := strings.Replace(minimal, "group: g", "group: g\n    ordering: key", 1)
	lib := libs(t, mustParse(t, strings.Replace(key, "rate: 10", fair, 1), nil))
	if lib.Fair == nil || lib.Fair.Weights["acme"] != 3 || lib.Fair.DefaultWeight != 0 {
		t.Fatalf("Fair = %+v, want weights {acme: 3} and the library's default weight", lib.Fair)
	}
	if lib.Limit.TenantWaiting != 7 || !lib.Kafka.Options.SetAside {
		t.Errorf("ordering key: TenantWaiting %d, SetAside %v; want 7, true", lib.Limit.TenantWaiting, lib.Kafka.Options.SetAside)
	}
	tenant, err := lib.Limit.Tenant(consumer.Message{Headers: map[string]string{"x-tenant": "acme"}})
	if err != nil || tenant != "acme" {
		t.Errorf("Tenant = %q, %v; want acme", tenant, err)
	}
	if _, err := lib.Limit.Tenant(consumer.Message{}); err == nil || !strings.Contains(err.Error(), "limit.fair.key") {
		t.Errorf("a message without the header: %v, want an error naming limit.fair.key", err)
	}
	// Under ordering partition (Kafka's default) every message waits, in order.
	part := libs(t, mustParse(t, strings.Replace(minimal, "rate: 10", fair, 1), nil))
	if part.Limit.TenantWaiting != -1 || part.Kafka.Options.SetAside {
		t.Errorf("ordering partition: TenantWaiting %d, SetAside %v; want -1, false", part.Limit.TenantWaiting, part.Kafka.Options.SetAside)
	}
}

func TestLimitFairProblemsNameTheKeys(t *testing.T) {
	bad := "rate: 10\n  fair:\n    weights: {acme: -1}\n    horizon: 2m\n    max_waiting: -2"
	_, err := Parse([]byte(strings.Replace(minimal, "rate: 10", bad, 1)), env(nil))
	keys := map[string]bool{}
	for _, p := range problemsOf(t, err) {
		keys[p.Key] = true
	}
	for _, k := range []string{"limit.fair.key", "limit.fair.weights.acme", "limit.fair.horizon", "limit.fair.max_waiting"} {
		if !keys[k] {
			t.Errorf("no problem at %s; got %v", k, keys)
		}
	}
}
