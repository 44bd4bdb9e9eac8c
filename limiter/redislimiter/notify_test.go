package redislimiter

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/faultproxy"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestWatchReportsAChangeAfterResubscribing cuts the subscription's
// connection and changes the bucket while it is down: the announcement is
// lost, so Watch must report a change once it has subscribed again.
func TestWatchReportsAChangeAfterResubscribing(t *testing.T) {
	direct := newClient(t)
	name := uniqueBucket(t, direct)
	proxy, err := faultproxy.New(testenv.RedisAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { viaProxy.Close() })
	watched, err := New(viaProxy, Config{Bucket: name, Rate: 10, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := New(direct, Config{Bucket: name, Rate: 10, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}

	var changes atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watched.Watch(ctx, func() { changes.Add(1) }, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })

	subscribers := func() int64 { return direct.PubSubNumSub(ctx, admin.channel).Val()[admin.channel] }
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUntil("subscribed", func() bool { return subscribers() == 1 })
	if n := changes.Load(); n != 0 {
		t.Fatalf("%d changes reported on the first subscription, want 0", n)
	}
	if err := admin.Admin().Fill(ctx); err != nil { // announced while subscribed
		t.Fatal(err)
	}
	waitUntil("the announced fill", func() bool { return changes.Load() == 1 })

	proxy.Block() // new connections wait, so the override lands while the subscription is down
	proxy.Cut()
	waitUntil("unsubscribed", func() bool { return subscribers() == 0 })
	if err := admin.Admin().SetOverride(ctx, 50, 0, time.Minute); err != nil { // announced to nobody
		t.Fatal(err)
	}
	if n := changes.Load(); n != 1 {
		t.Fatalf("%d changes while the subscription was down, want still 1", n)
	}
	proxy.Unblock()
	waitUntil("resubscribed", func() bool { return subscribers() == 1 })
	waitUntil("a change reported after resubscribing", func() bool { return changes.Load() == 2 })
}
