package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// measureLatencyInterleaved times each Wait of one caller per replica that
// holds a limiter of every implementation of ims (each on its own client
// and its own bucket, far above the demand) and calls them in turn,
// starting each cycle from the next one and pausing 1 ms after every call.
// The implementations are thus measured at the same moments under the same
// load: the drift of a shared machine, which separate phases see as
// differences of 10 to 15% between runs, weighs on all of them alike. It
// runs rounds such runs on fresh buckets and merges them. Allocations per
// Wait cannot be told apart in such a run: each implementation's are
// counted after it, by latencyAllocs.
func (b *bench) measureLatencyInterleaved(ctx context.Context, ims []impl, rounds int) ([]latency, error) {
	lat := make([][]time.Duration, len(ims))
	calls := make([]int64, len(ims))
	for r := range rounds {
		if err := b.latencyRound(ctx, ims, r, lat, calls); err != nil {
			return nil, err
		}
	}
	out := make([]latency, len(ims))
	for i, im := range ims {
		l := slices.Clone(lat[i])
		slices.Sort(l)
		n := len(l)
		if n == 0 {
			return nil, fmt.Errorf("%s: no Wait returned in %d runs of %v", im.name, rounds, b.cfg.latency)
		}
		allocs, err := b.latencyAllocs(ctx, im)
		if err != nil {
			return nil, fmt.Errorf("%s: allocations: %w", im.name, err)
		}
		out[i] = latency{
			im: im, waits: n,
			p25: l[n/4], p50: l[n/2], p90: l[n*9/10], p99: l[n*99/100],
			allocs: allocs,
			calls:  float64(calls[i]) / float64(n),
		}
	}
	return out, nil
}

// latencyRound is round r of measureLatencyInterleaved: it appends each
// implementation's latencies to lat and adds its client-counted Redis calls
// to calls.
func (b *bench) latencyRound(ctx context.Context, ims []impl, r int, lat [][]time.Duration, calls []int64) error {
	reps := make([][]*replica, len(ims))
	defer func() {
		for _, rs := range reps {
			if rs != nil {
				b.cleanup(rs)
			}
		}
	}()
	for i, im := range ims {
		spec := bucketSpec{
			name: fmt.Sprintf("bench-%s-latency%d-%s", b.runID, r, im.key),
			rate: b.cfg.latencyRate, burst: int(b.cfg.latencyRate), opts: b.cfg.opts,
		}
		var err error
		if reps[i], err = newReplicas(ctx, b.cfg.redisAddr, b.cfg.replicas, 1, im, spec); err != nil {
			return fmt.Errorf("%s: %w", im.name, err)
		}
	}
	for i := range ims {
		for _, rp := range reps[i] {
			calls[i] -= rp.calls.n.Load()
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, b.cfg.latency)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for k := range b.cfg.replicas {
		wg.Go(func() {
			mine := make([][]time.Duration, len(ims))
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				for i := range ims {
					lat[i] = append(lat[i], mine[i]...)
				}
			}()
			for cycle := k; runCtx.Err() == nil; cycle++ {
				for j := range ims {
					i := (cycle + j) % len(ims)
					t0 := time.Now()
					if err := reps[i][k].w.Wait(runCtx, 1); err != nil {
						if runCtx.Err() == nil {
							mu.Lock()
							errs = append(errs, fmt.Errorf("%s: %w", ims[i].name, err))
							mu.Unlock()
						}
						return
					}
					mine[i] = append(mine[i], time.Since(t0))
					time.Sleep(time.Millisecond) // unlike a timer, allocates nothing
				}
			}
		})
	}
	wg.Wait()
	cancel()
	if len(errs) > 0 {
		return errs[0]
	}
	for i := range ims {
		for _, rp := range reps[i] {
			calls[i] += rp.calls.n.Load()
		}
	}
	return nil
}

// latencyAllocs returns the heap allocations of the whole process per
// Wait of im, on one replica calling alone on a bucket far above the
// demand: the least of 3 rounds of 2,000 calls (leastAllocs).
func (b *bench) latencyAllocs(ctx context.Context, im impl) (float64, error) {
	spec := bucketSpec{
		name: fmt.Sprintf("bench-%s-allocs-%s", b.runID, im.key),
		rate: b.cfg.latencyRate, burst: int(b.cfg.latencyRate), opts: b.cfg.opts,
	}
	reps, err := newReplicas(ctx, b.cfg.redisAddr, 1, 1, im, spec)
	if err != nil {
		return 0, err
	}
	defer b.cleanup(reps)
	w := reps[0].w
	if err := w.Wait(ctx, 1); err != nil { // loads the script, takes a lease
		return 0, err
	}
	return leastAllocs(3, 2000, func() error { return w.Wait(ctx, 1) })
}
