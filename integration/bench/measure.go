package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// bench runs the phases of one invocation.
type bench struct {
	cfg   config
	admin *redis.Client // for INFO and key cleanup only
	runID string        // makes this run's bucket names unique
}

// result is one implementation on one workload.
type result struct {
	w  workload
	im impl
	t  tally
	d  time.Duration
	// steady is the tokens granted in the steady window, over which u
	// measures the costs.
	steady int64
	u      usage
}

// measure runs im on w with tight-looping callers on a fresh bucket.
func (b *bench) measure(ctx context.Context, w workload, im impl) (result, error) {
	l := load{goroutines: b.cfg.goroutines, duration: b.cfg.duration}
	t, m, err := b.phase(ctx, w.name, w.rate, w.burst, im, l)
	return result{w: w, im: im, t: t, d: l.duration, steady: m.tokens, u: m.usage}, err
}

// latency is the cost of a Wait when tokens are plentiful.
type latency struct {
	im       impl
	waits    int
	p25, p50 time.Duration
	p90, p99 time.Duration
	allocs   float64 // heap allocations per Wait, whole process
	calls    float64 // client-counted Redis calls per Wait
}

// measureLatency times each Wait of one caller per replica on a bucket far
// above the demand, with a 1 ms pause between calls so that the callers do
// not load the machine. It runs rounds phases of each implementation of ims,
// alternating their order from one round to the next, and merges each
// implementation's phases, so that the load of a shared machine, which
// drifts from minute to minute, weighs on all of them alike.
func (b *bench) measureLatency(ctx context.Context, ims []impl, rounds int) ([]latency, error) {
	type acc struct {
		lat                    []time.Duration
		mallocs, tokens, calls int64
	}
	accs := make([]acc, len(ims))
	l := load{goroutines: 1, duration: b.cfg.latency, pace: time.Millisecond, timeEach: true}
	for r := range rounds {
		for k := range ims {
			i := k
			if r%2 == 1 {
				i = len(ims) - 1 - k
			}
			t, m, err := b.phase(ctx, fmt.Sprintf("latency%d", r), b.cfg.latencyRate, int(b.cfg.latencyRate), ims[i], l)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ims[i].name, err)
			}
			a := &accs[i]
			a.lat = append(a.lat, t.latencies...)
			a.mallocs += int64(m.mallocs)
			a.tokens += m.tokens
			a.calls += m.clientCalls
		}
	}
	out := make([]latency, len(ims))
	for i, a := range accs {
		lat := slices.Clone(a.lat)
		slices.Sort(lat)
		n := len(lat)
		if n == 0 {
			return nil, fmt.Errorf("%s: no Wait returned in %d runs of %v", ims[i].name, rounds, l.duration)
		}
		out[i] = latency{
			im: ims[i], waits: n,
			p25: lat[n/4], p50: lat[n/2], p90: lat[n*9/10], p99: lat[n*99/100],
			allocs: float64(a.mallocs) / float64(max(1, a.tokens)),
			calls:  float64(a.calls) / float64(max(1, a.tokens)),
		}
	}
	return out, nil
}

// steadyWindow is the part of a phase over which costs are measured: from
// min(1 s, a fifth of the phase) after the start to 100 ms before the end,
// so that neither the start (empty pools, a full bucket) nor the end
// (reservations cancelled and refunded) weighs on the figures.
func steadyWindow(d time.Duration) (from, to time.Duration) {
	return min(time.Second, d/5), d - 100*time.Millisecond
}

// cost is what a phase cost over its steady window.
type cost struct {
	usage
	tokens int64 // granted in the window
}

// phase builds the replicas of im on a fresh bucket, drives them under l,
// and returns what the callers recorded and what the steady window cost.
func (b *bench) phase(ctx context.Context, name string, rate float64, burst int, im impl, l load) (tally, cost, error) {
	spec := bucketSpec{
		name: fmt.Sprintf("bench-%s-%s-%s", b.runID, name, im.key),
		rate: rate, burst: burst, opts: b.cfg.opts,
	}
	reps, err := newReplicas(ctx, b.cfg.redisAddr, b.cfg.replicas, l.goroutines, im, spec)
	if err != nil {
		return tally{}, cost{}, err
	}
	defer b.cleanup(reps)

	var (
		before, after usage
		from, to      time.Duration
		serr          error
		calls         []point
	)
	observe := func(start time.Time) {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { calls = sampleCalls(ctx, reps, start, l.duration) })
		wFrom, wTo := steadyWindow(l.duration)
		if serr = sleep(ctx, time.Until(start.Add(wFrom))); serr != nil {
			return
		}
		from = time.Since(start)
		if before, serr = snapshot(ctx, b.admin, reps); serr != nil {
			return
		}
		if serr = sleep(ctx, time.Until(start.Add(wTo))); serr != nil {
			return
		}
		to = time.Since(start)
		after, serr = snapshot(ctx, b.admin, reps)
	}
	t, err := drive(ctx, reps, l, observe)
	if err = errors.Join(err, serr); err != nil {
		return tally{}, cost{}, err
	}
	t.calls = calls
	c := cost{usage: after.sub(before)}
	to = min(to, l.duration) // the snapshot may have been late on a busy machine
	for _, n := range t.bins[from/time.Millisecond : to/time.Millisecond] {
		c.tokens += n
	}
	return t, c, nil
}

// point is a counter's value at a time since the start of a phase.
type point struct {
	at time.Duration
	n  int64
}

// sampleCalls records the replicas' client-counted Redis calls every 50 ms
// from start until d has passed or ctx ends.
func sampleCalls(ctx context.Context, reps []*replica, start time.Time, d time.Duration) []point {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var pts []point
	for {
		var n int64
		for _, r := range reps {
			n += r.calls.n.Load()
		}
		at := time.Since(start)
		if at > d {
			return pts
		}
		pts = append(pts, point{at, n})
		select {
		case <-ctx.Done():
			return pts
		case <-tick.C:
		}
	}
}

// cleanup closes the replicas and deletes their bucket's keys.
func (b *bench) cleanup(reps []*replica) {
	keys := reps[0].w.keys()
	closeReplicas(reps)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.admin.Del(ctx, keys...)
}

// leaseAllocs counts the heap allocations of a Wait served from a lease, on
// this repository's limiter over the Redis store.
func (b *bench) leaseAllocs(ctx context.Context) (float64, error) {
	store, err := redislimiter.New(b.admin, redislimiter.Config{Bucket: "bench-" + b.runID + "-allocs", Rate: 1e9, Burst: 1e9})
	if err != nil {
		return 0, err
	}
	defer b.admin.Del(context.Background(), store.Keys()...)
	return leaseAllocs(ctx, store)
}

// leaseAllocs returns the heap allocations per Wait served from a lease, on
// a Bucket over store (which should have a rate of at least 1e6/s). The
// lease is sized and kept so that it neither runs dry nor expires while the
// Waits are counted.
func leaseAllocs(ctx context.Context, store limiter.Store) (float64, error) {
	bk, err := limiter.New(store, limiter.Options{
		Lease: limiter.LeaseOptions{Fraction: 1, MaxBatch: math.MaxInt32, Idle: time.Hour},
	})
	if err != nil {
		return 0, err
	}
	defer bk.Close()
	if err := bk.Wait(ctx, 1); err != nil { // takes the lease
		return 0, err
	}
	return leastAllocs(5, 20_000, func() error { return bk.Wait(ctx, 1) })
}

// leastAllocs returns the heap allocations of the whole process per call of
// fn, the least of rounds rounds of calls calls each, so that the
// allocations of background goroutines, such as heartbeats, weigh as
// little as they can.
func leastAllocs(rounds, calls int, fn func() error) (float64, error) {
	least := math.Inf(1)
	for range rounds {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range calls {
			if err := fn(); err != nil {
				return 0, err
			}
		}
		runtime.ReadMemStats(&after)
		least = min(least, float64(after.Mallocs-before.Mallocs)/float64(calls))
	}
	return least, nil
}
