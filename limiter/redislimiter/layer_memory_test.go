package redislimiter

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// TestLayerKeyMemory measures what an active keyed bucket costs Redis:
// MEMORY USAGE of each key (at most 120 bytes: 88 with a 12-byte name and a
// 24-byte value, 168 with the readable name and decimal text), and the growth of
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

// TestFairTenantMemory measures what an active tenant of fair shares costs
// Redis (target: at most 200 bytes by MEMORY USAGE): 10,000 tenants each
// holding a reservation in a saturated bucket at 1/s, one script call each; the
// tenant's key, plus the class totals and bins shared by all, per tenant.
func TestFairTenantMemory(t *testing.T) {
	if os.Getenv("THROTTLE_FAIR_MEMORY") == "" {
		t.Skip("a measurement (10,000 script calls): THROTTLE_FAIR_MEMORY=1 runs it")
	}
	c := newClient(t)
	ctx := context.Background()
	l, err := newLayered(t, c, 1, 1, nil).WithFair(limiter.Fair{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Del(context.Background(), l.fairKeys[0], l.fairKeys[1]) })
	const n = 10000
	for i := range n {
		tenant := fmt.Sprintf("tenant-%05d", i)
		res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, MaxWait: 5 * time.Hour, Tenant: tenant})
		if err != nil || !res.Granted {
			t.Fatalf("take %d: %+v %v", i, res, err)
		}
		if i == n-1 && (res.FairActive < n-100 || res.FairActive > n-1) {
			// The first took the full bucket's token; at 1/s, the tenants
			// whose reservation came due meanwhile no longer count.
			t.Fatalf("FairActive = %d, want about %d", res.FairActive, n-1)
		}
	}
	var total int64
	for i := 1; i < n; i += n / 100 {
		m, err := c.MemoryUsage(ctx, l.fairPrefix+"1:"+fmt.Sprintf("tenant-%05d", i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		total += m
	}
	shared := c.MemoryUsage(ctx, l.fairKeys[0], 0).Val() + c.MemoryUsage(ctx, l.fairKeys[1], 0).Val()
	perTenant := float64(total)/100 + float64(shared)/n
	t.Logf("%d tenants: MEMORY USAGE %.0f bytes per tenant key (average of 100, key %q), %d bytes for the totals and bins (%.1f per tenant): %.0f per tenant",
		n, float64(total)/100, l.fairPrefix+"1:tenant-00001", shared, float64(shared)/n, perTenant)
	// The bins are one per 10 ms in which some tenant's last reservation
	// falls: at 1/s, one per tenant (the worst case), at 1000/s one per 10.
	if key := float64(total) / 100; key > 200 {
		t.Errorf("%.0f bytes per active tenant's key, want <= 200", key)
	}
}
