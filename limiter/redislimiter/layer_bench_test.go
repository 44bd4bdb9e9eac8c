package redislimiter

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
)

// BenchmarkLayers compares messages/s through the shared bucket alone
// (Store.Take, batched as in production) with the shared bucket plus one
// keyed layer over 100k distinct keys (Layered.TakeLayers, one script per
// message), from 64 goroutines, and one caller at a time.
func BenchmarkLayers(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: 64})
	b.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Skipf("Redis at 127.0.0.1:6379: %v", err)
	}
	const keys = 100000
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("+1555%07d", i)
	}
	for _, parallel := range []bool{true, false} {
		for _, layered := range []bool{false, true} {
			name := map[bool]string{false: "shared", true: "shared+keyed-100k"}[layered] + map[bool]string{false: "/serial", true: "/parallel-64"}[parallel]
			b.Run(name, func(b *testing.B) {
				s, err := New(c, Config{Bucket: uniqueBucket(b, c), Rate: 1e9, Burst: 1e9})
				if err != nil {
					b.Fatal(err)
				}
				l, err := s.WithLayers([]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { deleteLayerKeys(b, c, l) })
				ctx := context.Background()
				var n atomic.Int64
				one := func() error {
					if !layered {
						_, err := s.Take(ctx, limiter.TakeRequest{Cost: 1})
						return err
					}
					i := n.Add(1)
					_, err := l.TakeLayers(ctx, limiter.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": names[i%keys]}})
					return err
				}
				if err := one(); err != nil { // loads the script
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				if parallel {
					b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := one(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				} else {
					for b.Loop() {
						if err := one(); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			})
		}
	}
}

// BenchmarkLayersRatio measures the shared bucket alone and the shared
// bucket plus one keyed layer over 100k keys in alternating half-second
// rounds from 64 goroutines, so that both see the same load on a shared
// machine, and reports the medians and the median of the per-round ratios.
// Run it with -benchtime 1x: it runs its own rounds.
func BenchmarkLayersRatio(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: 64})
	b.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Skipf("Redis at 127.0.0.1:6379: %v", err)
	}
	const keys = 100000
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("+1555%07d", i)
	}
	s, err := New(c, Config{Bucket: uniqueBucket(b, c), Rate: 1e9, Burst: 1e9})
	if err != nil {
		b.Fatal(err)
	}
	l, err := s.WithLayers([]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteLayerKeys(b, c, l) })
	ctx := context.Background()
	var n atomic.Int64
	// mode 0: the shared bucket alone; 1: shared + keyed; 2: the keyed
	// layer alone, as a Bucket sends it while its lease pays the shared
	// bucket.
	round := func(mode int) float64 {
		var done atomic.Int64
		stop := time.Now().Add(500 * time.Millisecond)
		var wg sync.WaitGroup
		start := time.Now()
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					var err error
					if mode > 0 {
						i := n.Add(1)
						_, err = l.TakeLayers(ctx, limiter.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": names[i%keys]}, SkipShared: mode == 2})
					} else {
						_, err = s.Take(ctx, limiter.TakeRequest{Cost: 1})
					}
					if err != nil {
						b.Error(err)
						return
					}
					done.Add(1)
				}
			}()
		}
		wg.Wait()
		return float64(done.Load()) / time.Since(start).Seconds()
	}
	round(0)
	round(1)
	var shared, layered, leased, ratios, leasedRatios []float64
	for range 10 {
		a, z, y := round(0), round(1), round(2)
		shared, layered, leased = append(shared, a), append(layered, z), append(leased, y)
		ratios, leasedRatios = append(ratios, z/a), append(leasedRatios, y/a)
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return (v[4] + v[5]) / 2 }
	b.ReportMetric(median(shared), "shared-msgs/s")
	b.ReportMetric(median(layered), "keyed-msgs/s")
	b.ReportMetric(median(leased), "keyed-leased-msgs/s")
	b.ReportMetric(median(ratios), "ratio")
	b.ReportMetric(median(leasedRatios), "leased-ratio")
}
