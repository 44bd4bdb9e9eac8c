package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/faultproxy"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestBucketsMoveLowSleepersOnRedisPushes: two replicas share a 5/s bucket
// in Redis. The low one holds two reservations, due 200 and 400 ms after
// its first token, when the high one asks for a token: the high one gets
// the next slot, the script announces the push, and the low replica moves
// its sleepers back a slot each. Only lower bounds are checked, which the
// machine's load cannot break: a low sleeper that did not move would
// return at +200 ms.
func TestBucketsMoveLowSleepersOnRedisPushes(t *testing.T) {
	c := newClient(t)
	name := uniqueBucket(t, c)
	bucket := func(p limiter.Priority) *limiter.Bucket {
		s, err := New(c, Config{Bucket: name, Rate: 5, Burst: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, err := limiter.New(s, limiter.Options{Priority: p, MaxReserve: 5 * time.Second, Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	low, high := bucket(limiter.PriorityLow), bucket(limiter.PriorityHigh)
	ctx := context.Background()
	admin, err := New(c, Config{Bucket: name, Rate: 5, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	waitUntil("both replicas subscribed", func() bool { return c.PubSubNumSub(ctx, admin.channel).Val()[admin.channel] == 2 })

	start := time.Now()
	if err := low.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	type done struct {
		name string
		at   time.Duration
		err  error
	}
	results := make(chan done, 3)
	run := func(name string, b *limiter.Bucket) {
		go func() {
			err := b.Wait(ctx, 1)
			results <- done{name, time.Since(start), err}
		}()
	}
	run("low", low)
	run("low", low)
	waitUntil("two low reservations", func() bool {
		st, err := admin.Status(ctx)
		return err == nil && st.Reserved[limiter.PriorityLow] >= 1.9
	})
	run("high", high)
	var order []string
	var lowAt []time.Duration
	for range 3 {
		d := <-results
		if d.err != nil {
			t.Fatalf("%s: %v", d.name, d.err)
		}
		order = append(order, d.name)
		if d.name == "low" {
			lowAt = append(lowAt, d.at)
		}
	}
	if order[0] != "high" {
		t.Errorf("returned in the order %v, want high first", order)
	}
	if lowAt[0] < 390*time.Millisecond || lowAt[1] < 590*time.Millisecond {
		t.Errorf("the low waits returned at +%v and +%v, want >= +400ms and +600ms (moved back a slot each)", lowAt[0], lowAt[1])
	}
}

// TestBucketCatchesUpWithPushesMissedWhileUnsubscribed: the low replica's
// subscription is down when the high replica's take pushes its two
// reservations (due 1 s and 2 s after its first token) back a slot. The
// announcement is lost; the change reported on resubscribing makes the
// low replica read the bucket, whose push counter moves its sleepers back
// all the same. Lower bounds only, as above.
func TestBucketCatchesUpWithPushesMissedWhileUnsubscribed(t *testing.T) {
	direct := newClient(t)
	name := uniqueBucket(t, direct)
	proxy, err := faultproxy.New(testenv.RedisAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { viaProxy.Close() })
	bucket := func(c redis.UniversalClient, p limiter.Priority) *limiter.Bucket {
		s, err := New(c, Config{Bucket: name, Rate: 1, Burst: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, err := limiter.New(s, limiter.Options{Priority: p, MaxReserve: 5 * time.Second, Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	low, high := bucket(viaProxy, limiter.PriorityLow), bucket(direct, limiter.PriorityHigh)
	ctx := context.Background()
	admin, err := New(direct, Config{Bucket: name, Rate: 1, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	subscribers := func() int64 { return direct.PubSubNumSub(ctx, admin.channel).Val()[admin.channel] }
	status := func() limiter.State {
		st, err := admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitUntil("both replicas subscribed", func() bool { return subscribers() == 2 })

	start := time.Now()
	if err := low.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	type done struct {
		name string
		at   time.Duration
		err  error
	}
	results := make(chan done, 3)
	run := func(name string, b *limiter.Bucket) {
		go func() {
			err := b.Wait(ctx, 1)
			results <- done{name, time.Since(start), err}
		}()
	}
	run("low", low)
	run("low", low)
	waitUntil("two low reservations", func() bool { return status().Reserved[limiter.PriorityLow] >= 1.9 })
	proxy.Block() // the low replica cannot resubscribe until Unblock
	proxy.Cut()
	waitUntil("the low replica unsubscribed", func() bool { return subscribers() == 1 })
	run("high", high)
	waitUntil("the low class pushed", func() bool { return status().Pushed[limiter.PriorityLow] >= 0.9 })
	proxy.Unblock()
	var order []string
	var lowAt []time.Duration
	for range 3 {
		d := <-results
		if d.err != nil {
			t.Fatalf("%s: %v", d.name, d.err)
		}
		order = append(order, d.name)
		if d.name == "low" {
			lowAt = append(lowAt, d.at)
		}
	}
	if order[0] != "high" {
		t.Errorf("returned in the order %v, want high first", order)
	}
	if lowAt[0] < 1990*time.Millisecond || lowAt[1] < 2990*time.Millisecond {
		t.Errorf("the low waits returned at +%v and +%v, want >= +2s and +3s (moved back a slot each)", lowAt[0], lowAt[1])
	}
}
