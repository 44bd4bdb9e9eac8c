package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// TestLayersFallbackWhenRedisDies kills the Redis of two replicas that share
// a bucket with a per-recipient layer (burst 4, on_exceed dead_letter) and a
// daily quota: both fall back to their local stores, where the layer keeps
// refusing at each replica's share (2 per recipient each). A recipient that
// had used its burst in Redis gets it once more across the replicas, as
// docs/layers.md says. Redis then restarts empty, and the replicas charge
// it with what they sent locally.
func TestLayersFallbackWhenRedisDies(t *testing.T) {
	t.Parallel()
	srv := faultStartRedis(t)
	name := faultName(t)
	layers := []limiter.Layer{
		{Name: "per-recipient", Keyed: true, Rate: 0.001, Burst: 4, OnExceed: limiter.ActionDeadLetter},
		{Name: "daily", Quota: 10, Per: limiter.PerDay, OnExceed: limiter.ActionDeadLetter},
	}
	var buckets []*limiter.Bucket
	for i := range 2 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		s, err := redislimiter.New(c, redislimiter.Config{Bucket: name, Rate: 100, Burst: 10})
		if err != nil {
			t.Fatal(err)
		}
		ls, err := s.WithLayers(layers)
		if err != nil {
			t.Fatal(err)
		}
		b, err := limiter.New(ls, limiter.Options{ReplicaID: fmt.Sprint("r", i), Logger: faultLogger(t), Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		buckets = append(buckets, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, b := range buckets {
		if err := b.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The first replica counted itself alone; a second heartbeat counts both.
	if err := buckets[0].Check(ctx); err != nil {
		t.Fatal(err)
	}
	if a, b := buckets[0].Stats().Replicas, buckets[1].Stats().Replicas; a != 2 || b != 2 {
		t.Fatalf("replica counts %d and %d, want 2", a, b)
	}
	// refusedBy is the layer that refused the last WaitN of grants.
	var refusedBy string
	// grants counts the WaitNs granted for key on b until one is refused.
	grants := func(b *limiter.Bucket, key string) int {
		n := 0
		for ; n < 10; n++ {
			err := b.WaitN(ctx, limiter.Request{Cost: 1, Keys: map[string]string{"per-recipient": key}})
			var le *limiter.LimitError
			if errors.As(err, &le) {
				refusedBy = le.Layer
				return n
			}
			if err != nil {
				t.Fatalf("WaitN(%s): %v", key, err)
			}
		}
		return n
	}
	if n := grants(buckets[0], "x"); n != 4 {
		t.Fatalf("recipient x in Redis: %d granted, want 4 (its burst)", n)
	}
	srv.Kill()
	ax, bx := grants(buckets[0], "x"), grants(buckets[1], "x")
	for i, b := range buckets {
		if m := b.Mode(); m != limiter.ModeLocal {
			t.Fatalf("replica %d mode %s, want local", i, m)
		}
	}
	if ax != 2 || bx != 2 {
		t.Errorf("recipient x after the kill: %d and %d granted, want 2 each (burst 4 shared by 2 replicas; over-granted once)", ax, bx)
	}
	if n := grants(buckets[0], "y"); n != 2 {
		t.Errorf("recipient y on one replica in fallback: %d granted, want 2 (its share)", n)
	}

	// Redis comes back empty (no persistence). The replicas charge it
	// with what they sent locally: x used its burst, y half of it. Before,
	// Redis knew none of it, and x and y got their whole burst again
	// (8 sends to x where 4 were allowed, counting the fallback's extra).
	srv.Start()
	testenv.Eventually(t, 20*time.Second, "both replicas sharing the bucket again", func() bool {
		return buckets[0].Mode() == limiter.ModeShared && buckets[1].Mode() == limiter.ModeShared
	})
	if ax, bx := grants(buckets[0], "x"), grants(buckets[1], "x"); ax+bx != 0 {
		t.Errorf("recipient x after Redis came back empty: %d and %d granted, want 0 (its burst spent: 4 in Redis before, 2 + 2 locally)", ax, bx)
	}
	if n := grants(buckets[1], "y"); n != 2 {
		t.Errorf("recipient y after Redis came back empty: %d granted, want 2 (burst 4, 2 sent locally)", n)
	}
	// The daily quota of 10 counts the 6 sent locally and y's 2: a new
	// recipient gets 2, then the quota refuses (before, it counted y's 2
	// alone, and z got its whole burst of 4).
	if n := grants(buckets[0], "z"); n != 2 || refusedBy != "daily" {
		t.Errorf("recipient z after Redis came back empty: %d granted, then refused by %q; want 2, then the daily quota (10: 6 sent locally, 2 to y)", n, refusedBy)
	}
}

// TestLayersSentinelFailover decides a per-recipient layer through a
// Sentinel-managed master (one script per message), forces a failover, and
// checks that the layer keeps refusing on the promoted master: the state
// written before the failover was replicated, so a recipient that used its
// burst is still refused.
func TestLayersSentinelFailover(t *testing.T) {
	t.Parallel()
	set := faultStartSentinelSet(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: faultMasterName, SentinelAddrs: set.Addrs(),
		MaxRetries: -1, DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	s, err := redislimiter.New(c, redislimiter.Config{Bucket: faultName(t), Rate: 100, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := s.WithLayers([]limiter.Layer{{Name: "per-recipient", Keyed: true, Rate: 0.001, Burst: 2, OnExceed: limiter.ActionDeadLetter}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	take := func(key string) (backend.LayerResult, error) {
		return ls.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-recipient": key}})
	}
	for range 2 {
		if res, err := take("x"); err != nil || !res.Granted {
			t.Fatalf("take x: %+v %v", res, err)
		}
	}
	// WAIT for the replica to have the writes, then fail over.
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1: %d %v", n, err)
	}
	set.Failover(t)
	faultEventually(t, 30*time.Second, "the failover client never reached the new master", func() bool {
		_, err := take("probe")
		return err == nil
	})
	if res, err := take("x"); err != nil || res.Granted || res.Exceeded == nil {
		t.Errorf("take x on the promoted master: %+v %v; want refused by per-recipient", res, err)
	}
	if res, err := take("y"); err != nil || !res.Granted {
		t.Errorf("take y on the promoted master: %+v %v", res, err)
	}
}
