package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// layerKeys is how many distinct keys implementation (e) spreads its
// messages over: issue 12's 100k recipients.
const layerKeys = 100_000

// layerKeyNames are the keys of implementation (e), made once.
var layerKeyNames = sync.OnceValue(func() []string {
	names := make([]string, layerKeys)
	for i := range names {
		names[i] = fmt.Sprintf("+1555%07d", i)
	}
	return names
})

// layerSeq hands out the keys of implementation (e) in turn, over all its
// replicas, so that consecutive messages have distinct keys.
var layerSeq atomic.Int64

func init() {
	impls = append(impls, impl{"e", "(e) throttle, leasing, + a keyed layer over 100k keys", newThrottleKeyed})
}

// throttleKeyed is implementation (e): throttle with leasing on the shared
// bucket and one keyed layer (rate 1000, burst 1000 per key, never the
// limit), each Wait a message with the next of 100k keys. The keyed layer
// is decided in Redis for every message, so it measures what a keyed layer
// costs against (c), where every message asks Redis for the shared bucket.
type throttleKeyed struct {
	*limiter.Bucket
	store *redislimiter.Layered
	names []string
}

func newThrottleKeyed(c *redis.Client, s bucketSpec) (waiter, error) {
	store, err := redislimiter.New(c, redislimiter.Config{Bucket: s.name, Rate: s.rate, Burst: s.burst})
	if err != nil {
		return nil, err
	}
	layered, err := store.WithLayers([]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}})
	if err != nil {
		return nil, err
	}
	s.opts.Lease.Disabled = false
	b, err := limiter.New(layered, s.opts)
	if err != nil {
		return nil, err
	}
	return &throttleKeyed{Bucket: b, store: layered, names: layerKeyNames()}, nil
}

// Wait waits for cost tokens of the shared bucket and of the next key's
// bucket.
func (t *throttleKeyed) Wait(ctx context.Context, cost int) error {
	key := t.names[layerSeq.Add(1)%layerKeys]
	return t.Bucket.WaitN(ctx, limiter.Request{Cost: cost, Keys: map[string]string{"per-key": key}})
}

// keys are the shared bucket's keys; the layer's keys expire about a second
// after their last use, once full again.
func (t *throttleKeyed) keys() []string { return t.store.Keys() }
