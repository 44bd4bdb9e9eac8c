package cli

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// layeredBucket writes a config with three layers of limit.extra on a
// unique bucket (a keyed bucket, a keyed quota, an unkeyed bucket) and
// takes a token for each of keys, and returns the config's path and the
// layers and their client.
func layeredBucket(t *testing.T, keys ...string) (string, *redislimiter.Layered, redis.UniversalClient) {
	t.Helper()
	path, _ := writeLayersConfig(t, "layers", `    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/h
      burst: 3
    - name: daily
      key: '{{.JSON.to}}'
      quota: 50
      per: day
      timezone: America/New_York
    - name: provider
      rate: 1/h
      burst: 20`)
	client, ls := openLayers(t, path)
	ctx := testenv.Context(t, 10*time.Second)
	for _, k := range keys {
		req := backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-recipient": k, "daily": k}}
		if _, err := ls.TakeLayers(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, k := range keys {
			_ = ls.ResetLayer(context.Background(), "per-recipient", k)
			_ = ls.ResetLayer(context.Background(), "daily", k)
		}
		_ = ls.ResetLayer(context.Background(), "provider", "")
	})
	return path, ls, client
}

// TestBucketStatusLayersJSON: 'bucket status --json' with --config carries
// the layers of limit.extra, with what the text output shows.
func TestBucketStatusLayersJSON(t *testing.T) {
	path, _, _ := layeredBucket(t, "+1555000001", "+1555000002")
	st := bucketJSON(t, "status", "--config", path)
	want := []map[string]any{
		{"layer": "per-recipient", "kind": "bucket", "keyed": true, "rate": 1.0 / 3600, "burst": 3.0, "on_exceed": "wait", "keys_in_use": 2.0},
		{"layer": "daily", "kind": "quota", "keyed": true, "quota": 50.0, "per": "day", "timezone": "America/New_York", "on_exceed": "wait", "keys_in_use": 2.0},
		{"layer": "provider", "kind": "bucket", "keyed": false, "rate": 1.0 / 3600, "burst": 20.0, "on_exceed": "wait", "tokens": 18.0},
	}
	// The provider layer refills 0.001 token in 3.6 s: allow for a slow
	// machine.
	if len(st.Layers) == 3 {
		if tok, ok := st.Layers[2]["tokens"].(float64); ok && tok >= 18 && tok < 18.01 {
			st.Layers[2]["tokens"] = 18.0
		}
	}
	if !reflect.DeepEqual(st.Layers, want) {
		t.Errorf("layers = %v\nwant     %v", st.Layers, want)
	}
	code, text, stderr := runCLI(t, "bucket", "status", "--config", path)
	if code != ExitOK {
		t.Fatalf("bucket status: exit code %d, stderr:\n%s", code, stderr)
	}
	for _, line := range []string{"per-recipient", "2 keys in use", "daily", "quota 50 per day, America/New_York", "provider", "18.000 tokens"} {
		if !strings.Contains(text, line) {
			t.Errorf("text output lacks %q:\n%s", line, text)
		}
	}
	// Without --config the layers are unknown: null.
	addr := testenv.RedisAddr(t)
	if st := bucketJSON(t, "status", *st.Bucket, "--redis", addr); st.Layers != nil {
		t.Errorf("layers without --config = %v, want null", st.Layers)
	}
}

// TestBucketResetLayers: 'bucket reset --config' of the whole bucket also
// deletes the keys of its layers, and says how many; without --config it
// says that it left them.
func TestBucketResetLayers(t *testing.T) {
	keys := []string{"+1555000001", "+1555000002", "+1555000003"}
	path, ls, client := layeredBucket(t, keys...)
	ctx := testenv.Context(t, 10*time.Second)
	name := ""
	if cfg, err := loadConfig(path); err == nil {
		name = cfg.Limit.Bucket
	}
	code, out, stderr := runCLI(t, "bucket", "reset", name, "--redis", testenv.RedisAddr(t))
	if code != ExitOK || !strings.Contains(out, "were left: pass --config FILE to reset them too") {
		t.Errorf("bucket reset --redis: exit code %d, output:\n%s%s", code, out, stderr)
	}
	if n, err := ls.CountLayerKeys(ctx, client, "per-recipient"); err == nil && n.Keys != 3 {
		t.Errorf("keys of per-recipient after a reset without --config: %d, want 3", n.Keys)
	}
	code, out, stderr = runCLI(t, "bucket", "reset", "--config", path)
	// 3 keys per keyed layer and the unkeyed layer's one.
	if code != ExitOK || !strings.Contains(out, "Reset its 3 layers (limit.extra): removed 7 keys.") {
		t.Errorf("bucket reset --config: exit code %d, output:\n%s%s", code, out, stderr)
	}
	for _, l := range []string{"per-recipient", "daily", "provider"} {
		st, err := ls.LayerStatus(ctx, l, map[bool]string{true: keys[0]}[l != "provider"])
		if err != nil || !st.Full {
			t.Errorf("layer %s after bucket reset --config: %+v, %v; want full", l, st, err)
		}
	}
	st := bucketJSON(t, "status", "--config", path)
	for _, l := range st.Layers {
		if n, ok := l["keys_in_use"]; ok && n != 0.0 {
			t.Errorf("layer %v has %v keys in use after the reset, want 0", l["layer"], n)
		}
	}
}
