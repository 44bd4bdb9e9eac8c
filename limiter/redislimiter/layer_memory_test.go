package redislimiter

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// takeKeysAt takes cost from layer 0 of l for each key of keys at the
// instant at, leased (no shared bucket), as the batcher sends them: 1000
// requests per call of layersKeyedScript, pipelined. Every take must be
// granted.
func takeKeysAt(t *testing.T, c redis.UniversalClient, l *Layered, at time.Time, keys []string, cost int) {
	t.Helper()
	const per, calls = 1000, 10
	// Two pipelines at a time: one is built while Redis runs the other.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for j := 0; j < len(keys); j += calls * per {
		sem <- struct{}{}
		wg.Add(1)
		go func(keys []string) {
			defer func() { <-sem; wg.Done() }()
			takeKeysPipelined(t, c, l, at, keys, cost, per)
		}(keys[j:min(j+calls*per, len(keys))])
	}
	wg.Wait()
}

func takeKeysPipelined(t *testing.T, c redis.UniversalClient, l *Layered, at time.Time, keys []string, cost, per int) {
	t.Helper()
	ctx := context.Background()
	pipe := c.Pipeline()
	var cmds []*redis.Cmd
	for j := 0; j < len(keys); j += per {
		batch := keys[j:min(j+per, len(keys))]
		reqs := make([]backend.LayerRequest, len(batch))
		ks := make([][]string, len(batch))
		for k, key := range batch {
			reqs[k] = backend.LayerRequest{Cost: cost, SkipShared: true, Keys: map[string]string{l.layers[0].Name: key}}
			ks[k] = []string{key}
		}
		rkeys, args := l.keyedArgs(at, []int{0}, reqs, ks, 0, false)
		cmds = append(cmds, layersKeyedScript.Eval(ctx, pipe, rkeys, args...))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Error(err)
		return
	}
	for _, cmd := range cmds {
		s, err := cmd.Text()
		if err != nil {
			t.Error(err)
			return
		}
		f := strings.Fields(s)
		for k := 1; k < len(f); k += 3 {
			if f[k] != "1" {
				t.Errorf("take: status %s in %q", f[k], s[:min(len(s), 80)])
				return
			}
		}
	}
}

// privateLayered returns a Layered store of bucket "b" with the layer ly
// on c, a private redis-server's client: the server goes with the test, no
// keys to delete, and the keys' names are the same on every run.
func privateLayered(t *testing.T, c redis.UniversalClient, ly limiter.Layer) *Layered {
	t.Helper()
	s, err := New(c, Config{Bucket: "b", Rate: 1e6, Burst: 1e6})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.WithLayers([]limiter.Layer{ly})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// usedMemory returns INFO memory's used_memory.
func usedMemory(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
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

// TestLayerKeyMemory measures what an active keyed bucket costs Redis, on a
// redis-server of its own (nothing else moves used_memory): the growth of
// used_memory over 100,000 keys of a layer at 5/h, shards, fields and
// expiry included, must be at most 100 bytes per key (10 million keys in
// 1 GiB; docs/layers.md, "Memory"), each key's state in its shard with the
// shard kept until its buckets are full again (720s at 5/h, +1s, and an
// eighth of that). Then, on a
// layer that refills in 0.1s: a bucket added to a shard sweeps the buckets
// full again out of it, and a shard whose buckets are all full again is
// gone.
func TestLayerKeyMemory(t *testing.T) {
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: testenv.PrivateRedis(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	l := privateLayered(t, c, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 5.0 / 3600, Burst: 5})
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("+1555%07d", i)
	}
	before, start := usedMemory(t, c), time.Now()
	takeKeysAt(t, c, l, time.Time{}, keys, 1)
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d keys taken in %v", n, time.Since(start))
	grown := float64(usedMemory(t, c)-before) / n
	shard, field := l.bucketLoc(0, keys[0])
	t.Logf("used_memory grew %.1f bytes per key over %d keys; shard %q (%s, %d fields)", grown, n, shard,
		c.ObjectEncoding(ctx, shard).Val(), c.HLen(ctx, shard).Val())
	if grown > 100 {
		t.Errorf("used_memory grew %.1f bytes per keyed bucket, want <= 100", grown)
	}
	for i := 0; i < n; i += n / 100 {
		shard, field = l.bucketLoc(0, keys[i])
		if v := c.HGet(ctx, shard, field).Val(); len(v) != 24 {
			t.Errorf("key %q: field %x of %q holds %x, want 24 bytes", keys[i], field, shard, v)
		}
		if ttl := c.PTTL(ctx, shard).Val(); ttl <= 0 || ttl > 812*time.Second {
			t.Errorf("%q: PTTL %v, want the time to refill one token at 5/h (720s, +1s) and an eighth of it", shard, ttl)
		}
	}

	// CountLayerKeys counts the buckets, not the shards.
	if cnt, err := l.CountLayerKeys(ctx, c, "per-recipient"); err != nil || cnt.Keys != n || !cnt.Exact {
		t.Errorf("CountLayerKeys = %+v, %v; want exactly %d", cnt, err, n)
	}

	// A layer that refills its burst in 0.1s: each bucket is kept until
	// 1.1s after it is drained, its shard 1s longer.
	fast := privateLayered(t, c, limiter.Layer{Name: "fast", Keyed: true, Rate: 50, Burst: 5})
	old, young := keys[:5000], keys[5000:10_000]
	t0 := time.Now()
	takeKeysAt(t, c, fast, t0, old, 5)
	// 1.5s later, the old buckets are full again: the young ones, added to
	// shards of a field or two, sweep them out of every shard they touch.
	takeKeysAt(t, c, fast, t0.Add(1500*time.Millisecond), young, 5)
	want := map[string]int64{}
	for _, k := range young {
		s, _ := fast.bucketLoc(0, k)
		want[s]++
	}
	pipe := c.Pipeline()
	lens := map[string]*redis.IntCmd{}
	for s := range want {
		lens[s] = pipe.HLen(ctx, s) // and "~" and "^"
	}
	var swept []*redis.BoolCmd // old buckets in shards a young one was added to
	var oldShards []string
	for _, k := range old {
		s, f := fast.bucketLoc(0, k)
		if want[s] > 0 {
			swept = append(swept, pipe.HExists(ctx, s, f))
		} else {
			oldShards = append(oldShards, s)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range swept {
		if cmd.Val() {
			t.Fatalf("%v: a bucket full again, in a shard a later bucket was added to, is still there", cmd.Args())
		}
	}
	for s, cmd := range lens {
		if cmd.Val() != want[s]+shardOwnFields {
			t.Fatalf("shard %q: %d fields, want the %d added last", s, cmd.Val(), want[s])
		}
	}
	t.Logf("%d old buckets swept, %d shards of old buckets only", len(swept), len(oldShards))
	// Every shard of the fast layer expires with its last bucket full
	// again: wait for the longest PTTL, then none is left.
	all := oldShards
	for s := range want {
		all = append(all, s)
	}
	ttls := make([]*redis.DurationCmd, len(all))
	for i, s := range all {
		ttls[i] = pipe.PTTL(ctx, s)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var wait time.Duration
	for _, cmd := range ttls {
		wait = max(wait, cmd.Val())
	}
	if wait <= 0 || wait > 2100*time.Millisecond {
		t.Fatalf("the fast layer's longest shard PTTL is %v, want 2.1s at most", wait)
	}
	time.Sleep(wait + time.Millisecond)
	exists := make([]*redis.IntCmd, len(all))
	for i, s := range all {
		exists[i] = pipe.Exists(ctx, s)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, cmd := range exists {
		left += int(cmd.Val())
	}
	if left > 0 {
		t.Errorf("%d shards of the fast layer left after their buckets were full again", left)
	}
}

// TestShardSweep: in a shard of many fields, buckets added one by one
// sweep it, now and then (a chance of 8 in its size, here fixed by the
// instants), of the buckets full again, and keep every bucket that is not:
// 40 buckets full an hour ago and one drained now, then 20 keys of the
// same shard taken at 5/h, leave exactly the 21 live ones.
func TestShardSweep(t *testing.T) {
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: testenv.PrivateRedis(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	l := privateLayered(t, c, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 5.0 / 3600, Burst: 5})
	shard, _ := l.bucketLoc(0, "+15550000000")
	var keys []string
	for i := 1; len(keys) < 20; i++ {
		k := fmt.Sprintf("+1555%07d", i)
		if s, _ := l.bucketLoc(0, k); s == shard {
			keys = append(keys, k)
		}
	}
	// Fixed names and instants: whether a bucket added sweeps is drawn
	// from its field and the instant, so the outcome is the same on every
	// run.
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	pack := func(tokens float64, ts time.Time) string {
		b := make([]byte, 0, 24)
		for _, v := range []float64{tokens, float64(ts.UnixMicro()), 0} {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return string(b)
	}
	var fields []any
	for i := range 40 { // full again since an hour: drained two hours ago
		fields = append(fields, fmt.Sprintf("stale%d", i), pack(0, t0.Add(-2*time.Hour)))
	}
	fields = append(fields, "live", pack(0, t0))                                       // full again in an hour
	fields = append(fields, "~", strconv.FormatInt(t0.Add(time.Hour).UnixMilli(), 10)) // the shard's TTL
	if err := c.HSet(ctx, shard, fields...).Err(); err != nil {
		t.Fatal(err)
	}
	c.PExpire(ctx, shard, time.Hour)
	for j, k := range keys {
		takeKeysAt(t, c, l, t0.Add(time.Duration(j)*time.Millisecond), []string{k}, 1)
	}
	got := c.HKeys(ctx, shard).Val()
	live := 0
	for _, f := range got {
		if strings.HasPrefix(f, "stale") {
			t.Errorf("field %q, full again, still in the shard after %d buckets were added", f, len(keys))
		}
		if f == "live" {
			live++
		}
	}
	if len(got) != len(keys)+2 || live != 1 {
		t.Errorf("shard holds %d fields (live %d), want the %d added, the one live and \"~\"", len(got), live, len(keys))
	}
}
