package config

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// TestDedupeMapping: delivery.dedupe maps onto the consumer's Dedupe
// (the key template, a missing header giving no key; the window, the
// claim TTL, the policy; the send timeout from sink.http.timeout) and the
// Redis store's namespace, limit.bucket.
func TestDedupeMapping(t *testing.T) {
	doc := strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', timeout: 3s}", 1) + `
delivery:
  dedupe: {key: '{{index .Headers "message-id"}}', window: 1h, on_store_error: closed, require_key: true}
`
	lib := libs(t, mustParse(t, doc, nil))
	d := lib.Kafka.Dedupe
	if d == nil || lib.DedupeStore == nil || lib.DedupeStore.Namespace != "sms" {
		t.Fatalf("Dedupe %+v, store %+v; want both, namespace sms", d, lib.DedupeStore)
	}
	if d.Window != time.Hour || d.SendTimeout != 3*time.Second || d.ClaimTTL != 0 || d.OnStoreError != limiter.ModeClosed || !d.RequireKey {
		t.Fatalf("Dedupe = %+v", d)
	}
	for _, tc := range []struct {
		headers map[string]string
		want    string
	}{{map[string]string{"message-id": "m-1"}, "m-1"}, {nil, ""}, {map[string]string{"message-id": ""}, ""}} {
		if k, err := d.Key(consumer.Message{Headers: tc.headers}); k != tc.want || err != nil {
			t.Fatalf("key of %v = %q, %v; want %q", tc.headers, k, err, tc.want)
		}
	}
	if plain := libs(t, mustParse(t, minimal, nil)); plain.Kafka.Dedupe != nil || plain.DedupeStore != nil {
		t.Fatal("dedupe set without delivery.dedupe")
	}
}

// TestDedupeProblems: each problem of delivery.dedupe is named by its key.
func TestDedupeProblems(t *testing.T) {
	for _, tc := range []struct{ dedupe, key string }{
		{`{window: 1h}`, "delivery.dedupe.key"},
		{`{key: '{{.Nope'}`, "delivery.dedupe.key"},
		{`{key: k, on_store_error: maybe}`, "delivery.dedupe.on_store_error"},
		{`{key: k, window: -1s}`, "delivery.dedupe.window"},
	} {
		_, err := Parse([]byte(minimal+"delivery:\n  dedupe: "+tc.dedupe+"\n"), nil)
		ps := problemsOf(t, err)
		found := false
		for _, p := range ps {
			found = found || p.Key == tc.key
		}
		if !found {
			t.Errorf("dedupe %s: problems %+v, want one at %s", tc.dedupe, ps, tc.key)
		}
	}
}
