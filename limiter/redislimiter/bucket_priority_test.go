package redislimiter

import (
	"context"
	"testing"
	"time"

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
