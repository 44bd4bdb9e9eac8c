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

// proxiedClient returns a client that reaches the test Redis through a
// fault proxy, and the proxy, so that the test can cut its connections.
// The client does not retry: a cut shows at once.
func proxiedClient(t testing.TB) (*faultproxy.Proxy, redis.UniversalClient) {
	t.Helper()
	proxy, err := faultproxy.New(testenv.RedisAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return proxy, c
}

// newStore returns a Store of the bucket name on c, failing the test on an
// error.
func newStore(t testing.TB, c redis.UniversalClient, name string, rate float64, burst int) *Store {
	t.Helper()
	return newWarmStore(t, c, name, rate, burst, 0)
}

// newWarmStore is newStore with a warm-up of warmup (none at 0).
func newWarmStore(t testing.TB, c redis.UniversalClient, name string, rate float64, burst int, warmup time.Duration) *Store {
	t.Helper()
	s, err := New(c, Config{Bucket: name, Rate: rate, Burst: burst, Warmup: warmup})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newBucketOn returns a limiter.Bucket on a Store of the bucket name on c,
// closed when the test ends.
func newBucketOn(t testing.TB, c redis.UniversalClient, name string, rate float64, burst int, opts limiter.Options) *limiter.Bucket {
	t.Helper()
	b, err := limiter.New(newStore(t, c, name, rate, burst), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// priorityReplica returns a Bucket of class p on c that reserves up to 5 s
// ahead and takes no lease, so that each Wait is one take on Redis.
func priorityReplica(t testing.TB, c redis.UniversalClient, name string, rate float64, p limiter.Priority) *limiter.Bucket {
	t.Helper()
	return newBucketOn(t, c, name, rate, 1, limiter.Options{Priority: p, MaxReserve: 5 * time.Second, Lease: limiter.LeaseOptions{Disabled: true}})
}

// subscribers returns how many connections listen on admin's channel.
func subscribers(ctx context.Context, c redis.UniversalClient, admin *Store) int64 {
	return c.PubSubNumSub(ctx, admin.channel).Val()[admin.channel]
}

// splitRig is a bucket of its own reached two ways: directly, and through
// a fault proxy that the test can cut or block.
type splitRig struct {
	name             string
	direct, viaProxy redis.UniversalClient
	proxy            *faultproxy.Proxy
	admin            *Store // on direct, with the rig's rate and a burst of 1
}

func newSplitRig(t testing.TB, rate float64) *splitRig {
	t.Helper()
	r := &splitRig{direct: newClient(t)}
	r.name = uniqueBucket(t, r.direct)
	r.proxy, r.viaProxy = proxiedClient(t)
	r.admin = newStore(t, r.direct, r.name, rate, 1)
	return r
}

// subscribers returns how many connections listen on the bucket's channel.
func (r *splitRig) subscribers(ctx context.Context) int64 {
	return subscribers(ctx, r.direct, r.admin)
}

// lowSleepersRace is a race between two replicas of one bucket, a low one
// and a high one, whose slots are one slot apart (1/rate). The low replica
// takes its first token, then two of its waiters reserve the next two
// slots; once admin sees both reservations, beforeHigh runs, the high
// replica asks for a token, and afterHigh runs.
type lowSleepersRace struct {
	admin                 *Store
	low, high             *limiter.Bucket
	slot                  time.Duration
	beforeHigh, afterHigh func()
}

// check runs the race and checks that the high wait returned first and
// that each low waiter was moved back a slot: the low waits return no
// sooner than 2 and 3 slots after the first token (10 ms of leeway for the
// clocks). Only lower bounds are checked, which the machine's load cannot
// break: a low sleeper that did not move would return after 1 or 2 slots.
func (r lowSleepersRace) check(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	if err := r.low.Wait(ctx, 1); err != nil {
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
	run("low", r.low)
	run("low", r.low)
	waitFor(t, "two low reservations", func() bool {
		st, err := r.admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The front of the queue refills from the first token on.
		refilled := time.Since(start).Seconds() / r.slot.Seconds()
		return st.Reserved[limiter.PriorityLow]+refilled >= 1.9
	})
	if r.beforeHigh != nil {
		r.beforeHigh()
	}
	highAt := time.Since(start)
	run("high", r.high)
	if r.afterHigh != nil {
		r.afterHigh()
	}
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
	// A low sleeper is moved back only if its slot had not come when the
	// high take was made: on a loaded machine the setup can take that
	// long, and then the bound is the one the store could still keep.
	const leeway = 10 * time.Millisecond
	if highAt >= 2*r.slot-leeway {
		t.Fatalf("the high take came at +%v, after both low slots (+%v, +%v): the machine was too slow for this race", highAt, r.slot, 2*r.slot)
	}
	first := 2 * r.slot
	if highAt >= r.slot-leeway {
		first = r.slot
		t.Logf("the high take came at +%v, after the first low slot: only the second is checked for the move", highAt)
	}
	if lowAt[0] < first-leeway || lowAt[1] < 3*r.slot-leeway {
		t.Errorf("the low waits returned at +%v and +%v, want >= +%v and +%v (moved back a slot each; high took at +%v)", lowAt[0], lowAt[1], first, 3*r.slot, highAt)
	}
}

// fairKeys lists every key of l's fair shares: the totals and the shards.
func (l *Layered) fairKeys() []string {
	return append([]string{l.fairTotals}, l.fairShards...)
}
