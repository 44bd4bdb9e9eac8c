package redislimiter

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestBucketsShareOneSubscription: 200 Buckets on one Redis client listen
// through one Pub/Sub connection, and an announcement on one bucket's
// channel reaches its Bucket only. Each Bucket used to open its own: 200
// Buckets on one client held 213 connections.
func TestBucketsShareOneSubscription(t *testing.T) {
	name := "hubtest-" + strings.ReplaceAll(testenv.Name(t, "sub"), ":", "-")
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ClientName: name})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	const n = 200
	stores := make([]*Store, n)
	for i := range stores {
		stores[i] = newStore(t, c, fmt.Sprintf("%s-%d", name, i), 100, 10)
		b, err := limiter.New(stores[i], limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
	}
	// limiter.New's Buckets watch in the background; the test also
	// watches bucket 7, and bucket 9 as a probe: messages are read in
	// order, so once the probe heard its own, all before it were handed
	// out.
	var heard, probe atomic.Int64
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { stores[7].Watch(wctx, func() { heard.Add(1) }, nil); done <- struct{}{} }()
	go func() { stores[9].Watch(wctx, func() { probe.Add(1) }, nil); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	waitFor(t, "every bucket subscribed", func() bool {
		for _, s := range stores {
			if subscribers(ctx, c, s) != 1 {
				return false
			}
		}
		return watcherCount(c, stores[7].channel) == 2 && watcherCount(c, stores[9].channel) == 2
	})
	pubsubConns := func() int {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " name="+name+" ") && !strings.Contains(line, " sub=0 ") {
				k++
			}
		}
		return k
	}
	if k := pubsubConns(); k != 1 {
		t.Fatalf("%d Pub/Sub connections for %d Buckets on one client, want 1", k, n)
	}
	for _, i := range []int{8, 7, 9} { // another bucket's, bucket 7's, the probe's
		if err := stores[i].Admin().Fill(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the probe's announcement", func() bool { return probe.Load() == 1 })
	if h := heard.Load(); h != 1 {
		t.Errorf("bucket 7's watcher heard %d announcements, want 1 (its own)", h)
	}
}
