package redislimiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// TestRedisFairState checks the fair shares' keys at fixed instants: a
// tenant is a field of its shard, the bins are fields of the totals, and
// what has come due is forgotten, one bin at a time or, after a long gap,
// all at once; a tenant whose reservations came due leaves its shard.
func TestRedisFairState(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	l, err := newLayered(t, c, 10, 1, nil).WithFair(limiter.Fair{Horizon: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Del(context.Background(), l.fairKeys()...) })
	base := storetest.Base.UnixMicro()
	take := func(at time.Duration, tenant string, wait time.Duration) {
		t.Helper()
		res, err := l.takeLayers(ctx, storetest.Base.Add(at), backend.LayerRequest{Cost: 1, MaxWait: time.Minute, Tenant: tenant})
		if err != nil || !res.Granted || res.Wait != wait {
			t.Fatalf("take(%q) at +%v = %+v, %v; want granted after %v", tenant, at, res, err, wait)
		}
	}
	state := func(tenant string) string {
		return c.HGet(ctx, l.fairShards[fairShard(tenant)], "1"+tenant).Val()
	}
	// bins returns the bins of the totals (their numeric fields).
	bins := func() map[string]string {
		all := c.HGetAll(ctx, l.fairTotals).Val()
		out := map[string]string{}
		for k, v := range all {
			if _, err := strconv.ParseInt(k, 10, 64); err == nil {
				out[k] = v
			}
		}
		return out
	}
	bin := func(endUS int64) string { return strconv.FormatInt(endUS/backend.FairGrain*4+1, 10) }

	take(0, "a", 0) // a full bucket: nothing held
	if v := state("a"); v != "" {
		t.Fatalf("a granted at once holds %q, want nothing", v)
	}
	take(0, "a", 100*time.Millisecond)
	take(0, "b", 200*time.Millisecond)
	if v, want := state("a"), "1 "+strconv.FormatInt(base+100_000, 10)+" 100000"; v != want {
		t.Errorf("a = %q, want %q (held last span)", v, want)
	}
	if v, want := state("b"), "1 "+strconv.FormatInt(base+200_000, 10)+" 200000"; v != want {
		t.Errorf("b = %q, want %q", v, want)
	}
	if got := c.HMGet(ctx, l.fairTotals, "w1", "n1").Val(); got[0] != "2" || got[1] != "2" {
		t.Errorf("totals w1, n1 = %v, want 2, 2", got)
	}
	if got := bins(); len(got) != 2 || got[bin(base+100_000)] != "1 1" || got[bin(base+200_000)] != "1 1" {
		t.Errorf("bins = %v, want a's at +100ms and b's at +200ms", got)
	}
	if enc := c.ObjectEncoding(ctx, l.fairShards[fairShard("a")]).Val(); enc != "listpack" {
		t.Errorf("a's shard is a %s, want a listpack", enc)
	}
	// a again behind b: a's bin moves.
	take(0, "a", 300*time.Millisecond)
	if got := bins(); len(got) != 2 || got[bin(base+300_000)] != "1 1" || got[bin(base+200_000)] != "1 1" {
		t.Errorf("bins = %v, want b's at +200ms and a's at +300ms", got)
	}
	// At +250 ms b's bin has passed (one by one): b no longer counts.
	take(250*time.Millisecond, "c", 150*time.Millisecond) // the queue: a's at +300ms, then c
	if got := c.HMGet(ctx, l.fairTotals, "w1", "n1").Val(); got[0] != "2" || got[1] != "2" {
		t.Errorf("at +250ms totals = %v, want 2, 2 (a and c)", got)
	}
	if got := bins(); len(got) != 2 || got[bin(base+400_000)] != "1 1" {
		t.Errorf("at +250ms bins = %v, want a's at +300ms and c's at +400ms", got)
	}
	// After a long gap (over 1000 bins) every bin passed goes at once, and
	// a tenant touching a shard sweeps its dead tenants: a's and c's shard
	// are swept when a and c come back, and hold nothing of before.
	take(30*time.Second, "a", 0)
	if got := bins(); len(got) != 0 {
		t.Errorf("at +30s bins = %v, want none", got)
	}
	if got := c.HMGet(ctx, l.fairTotals, "w1", "n1").Val(); got[0] != "0" || got[1] != "0" {
		t.Errorf("at +30s totals = %v, want 0, 0", got)
	}
	if v := state("a"); v != "" {
		t.Errorf("at +30s a = %q, want swept", v)
	}
	take(30*time.Second, "c", 100*time.Millisecond)
	if v, want := state("c"), "1 "+strconv.FormatInt(base+30_100_000, 10)+" 100000"; v != want {
		t.Errorf("at +30s c = %q, want %q", v, want)
	}
	if ttl := c.PTTL(ctx, l.fairShards[fairShard("c")]).Val(); ttl <= 0 || ttl > 1100*time.Millisecond {
		t.Errorf("c's shard expires in %v, want about a second after c's last", ttl)
	}
}
