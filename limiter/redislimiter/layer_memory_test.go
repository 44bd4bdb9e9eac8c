package redislimiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// TestLayerKeyMemory measures what an active keyed bucket costs Redis:
// MEMORY USAGE of each key (at most 120 bytes: 104 with the prefix and a
// 12-byte name and a 24-byte value, 168 with the readable name and decimal
// text), and the growth of
// used_memory over 5000 keys, which also counts the expiry entry.
func TestLayerKeyMemory(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	l := newLayered(t, c, 1e6, 1e6, []limiter.Layer{{Name: "per-recipient", Keyed: true, Rate: 5.0 / 3600, Burst: 5}})
	const n = 5000
	usedMemory := func() int64 {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}
	before := usedMemory()
	for i := range n {
		res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-recipient": fmt.Sprintf("+1555%07d", i)}})
		if err != nil || !res.Granted {
			t.Fatalf("take %d: %+v %v", i, res, err)
		}
	}
	after := usedMemory()
	var total int64
	for i := 0; i < n; i += n / 100 {
		key := l.layerKey(0, fmt.Sprintf("+1555%07d", i))
		m, err := c.MemoryUsage(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		total += m
		if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 721*time.Second {
			t.Errorf("%s: PTTL %v, want the time to refill one token at 5/h (720s, +1s)", key, ttl)
		}
	}
	avg := float64(total) / 100
	t.Logf("key %q value %x: MEMORY USAGE %.0f bytes per key (average of 100); used_memory grew %.0f bytes per key over %d keys",
		l.layerKey(0, "+15550000000"), c.Get(ctx, l.layerKey(0, "+15550000000")).Val(), avg, float64(after-before)/n, n)
	if avg > 120 {
		t.Errorf("MEMORY USAGE per keyed bucket = %.0f bytes, want <= 120", avg)
	}
}
