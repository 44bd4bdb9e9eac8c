package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// layerKeys is how many distinct keys implementation (e) spreads its
// messages over: the layers target's 100k recipients.
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

// layerPair is one paired round of the keyed-layer comparison: (c) and (e)
// on the fast workload, one after the other.
type layerPair struct{ shared, keyed result }

func (p layerPair) ratio() float64 { return p.keyed.perSecond() / p.shared.perSecond() }

// measureLayerPairs runs rounds paired rounds of (c), the shared bucket
// alone, and (e), a keyed layer with leasing, on the fast workload, their
// order alternating, so that both see the same load on a shared machine.
// It returns nothing unless both implementations and the fast workload
// are selected.
func (b *bench) measureLayerPairs(ctx context.Context, rounds int) ([]layerPair, error) {
	wi := indexOf(b.cfg.workloads, func(w workload) bool { return w.name == "fast" })
	ci := indexOf(b.cfg.impls, func(m impl) bool { return m.key == "c" })
	ei := indexOf(b.cfg.impls, func(m impl) bool { return m.key == "e" })
	if wi < 0 || ci < 0 || ei < 0 {
		return nil, nil
	}
	w, c, e := b.cfg.workloads[wi], b.cfg.impls[ci], b.cfg.impls[ei]
	var out []layerPair
	for r := range rounds {
		var p layerPair
		order := []*result{&p.shared, &p.keyed}
		ims := []impl{c, e}
		if r%2 == 1 {
			order[0], order[1], ims[0], ims[1] = order[1], order[0], e, c
		}
		for i, im := range ims {
			res, err := b.measure(ctx, w, im)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", w.name, im.name, err)
			}
			*order[i] = res
		}
		fmt.Fprintf(os.Stderr, "layer round %d: (c) %.0f/s, (e) %.0f/s, %.2f×\n", r+1, p.shared.perSecond(), p.keyed.perSecond(), p.ratio())
		out = append(out, p)
	}
	return out, nil
}

// layerPairsMarkdown writes the table of the paired rounds, and returns the
// median of their ratios.
func layerPairsMarkdown(b *strings.Builder, pairs []layerPair) float64 {
	fmt.Fprintf(b, "A keyed layer against the shared bucket alone (fast workload, %d paired rounds, order alternating):\n\n", len(pairs))
	b.WriteString("| round | (c) shared bucket alone, no leasing: granted/s | (e) + a keyed layer over 100k keys, leasing: granted/s | (e) ÷ (c) | (e) Redis calls/token (client) | Redis CPU s/M tokens, (c) / (e) |\n|--:|--:|--:|--:|--:|--:|\n")
	ratios := make([]float64, len(pairs))
	for i, p := range pairs {
		ratios[i] = p.ratio()
		fmt.Fprintf(b, "| %d | %s | %s | %.2f× | %s | %.2f / %.2f |\n", i+1, thousands(p.shared.perSecond()), thousands(p.keyed.perSecond()), p.ratio(),
			ratio(p.keyed.perToken(p.keyed.u.clientCalls)), p.shared.cpuPerMillion(p.shared.u.redis.cpu), p.keyed.cpuPerMillion(p.keyed.u.redis.cpu))
	}
	slices.Sort(ratios)
	m := ratios[len(ratios)/2]
	if len(ratios)%2 == 0 {
		m = (ratios[len(ratios)/2-1] + m) / 2
	}
	fmt.Fprintf(b, "\nMedian of the rounds' ratios: %.2f×.\n\n", m)
	return m
}
