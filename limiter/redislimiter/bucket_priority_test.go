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
	low, high := priorityReplica(t, c, name, 5, limiter.PriorityLow), priorityReplica(t, c, name, 5, limiter.PriorityHigh)
	ctx := context.Background()
	admin := newStore(t, c, name, 5, 1)
	// Both replicas listen through the client's one shared subscription.
	waitFor(t, "both replicas subscribed", func() bool {
		return subscribers(ctx, c, admin) == 1 && watcherCount(c, admin.channel) == 2
	})

	lowSleepersRace{admin: admin, low: low, high: high, slot: 200 * time.Millisecond}.check(t)
}

// TestBucketCatchesUpWithPushesMissedWhileUnsubscribed: the low replica's
// subscription is down when the high replica's take pushes its two
// reservations (due 1 s and 2 s after its first token) back a slot. The
// announcement is lost; the change reported on resubscribing makes the
// low replica read the bucket, whose push counter moves its sleepers back
// all the same. Lower bounds only, as above.
func TestBucketCatchesUpWithPushesMissedWhileUnsubscribed(t *testing.T) {
	r := newSplitRig(t, 1)
	low, high := priorityReplica(t, r.viaProxy, r.name, 1, limiter.PriorityLow), priorityReplica(t, r.direct, r.name, 1, limiter.PriorityHigh)
	ctx := context.Background()
	waitFor(t, "both replicas subscribed", func() bool { return r.subscribers(ctx) == 2 })

	lowSleepersRace{
		admin: r.admin, low: low, high: high, slot: time.Second,
		beforeHigh: func() {
			r.proxy.Block() // the low replica cannot resubscribe until Unblock
			r.proxy.Cut()
			waitFor(t, "the low replica unsubscribed", func() bool { return r.subscribers(ctx) == 1 })
		},
		afterHigh: func() {
			waitFor(t, "the low class pushed", func() bool {
				st, err := r.admin.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return st.Pushed[limiter.PriorityLow] >= 0.9
			})
			r.proxy.Unblock()
		},
	}.check(t)
}
