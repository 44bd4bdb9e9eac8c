package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// countingHook counts a client's round trips.
type countingHook = testenv.CallCounter

func benchBucket(b *testing.B, rate float64, burst int, opts limiter.Options) (*limiter.Bucket, *countingHook) {
	return benchBucketConfig(b, Config{Rate: rate, Burst: burst}, opts)
}

// benchBucketConfig is benchBucket with a Store configured by cfg, whose
// Bucket is set here.
func benchBucketConfig(b *testing.B, cfg Config, opts limiter.Options) (*limiter.Bucket, *countingHook) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	b.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Skipf("Redis at 127.0.0.1:6379: %v", err)
	}
	cfg.Bucket = uniqueBucket(b, c)
	s, err := New(c, cfg)
	if err != nil {
		b.Fatal(err)
	}
	// Load the script so that the first EVALSHA does not miss.
	if _, err := s.Take(context.Background(), backend.TakeRequest{Cost: 1}); err != nil {
		b.Fatal(err)
	}
	h := &countingHook{}
	c.AddHook(h)
	bk, err := limiter.New(s, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bk.Close() })
	return bk, h
}

// BenchmarkWaitPlentiful is Wait when tokens are always there, without
// leasing: one script call per acquisition.
func BenchmarkWaitPlentiful(b *testing.B) {
	bk, h := benchBucket(b, 1e9, 1e9, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := bk.Wait(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.N.Load())/float64(b.N), "round-trips/op")
}

// BenchmarkWaitLeased is Wait with leasing on at a high rate: most
// acquisitions are served from the local lease.
func BenchmarkWaitLeased(b *testing.B) {
	bk, h := benchBucket(b, 1e9, 1e9, limiter.Options{})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := bk.Wait(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.N.Load())/float64(b.N), "round-trips/op")
}

// BenchmarkWaitSaturated is Wait from 8 goroutines on a bucket they keep
// empty (2000/s), without leasing: every acquisition waits for a
// reservation. The figure that matters is Redis calls per granted token.
func BenchmarkWaitSaturated(b *testing.B) {
	benchSaturated(b, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
}

// BenchmarkWaitSaturatedLeasing is BenchmarkWaitSaturated with leasing on.
func BenchmarkWaitSaturatedLeasing(b *testing.B) {
	benchSaturated(b, limiter.Options{})
}

func benchSaturated(b *testing.B, opts limiter.Options) {
	bk, h := benchBucket(b, 2000, 10, opts)
	ctx := context.Background()
	b.SetParallelism(4) // 8 goroutines on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := bk.Wait(ctx, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(h.N.Load())/float64(b.N), "round-trips/token")
}

// BenchmarkTakeParallel is Wait without leasing from 64 goroutines on a
// bucket that always has tokens: the ceiling of one bucket without leasing,
// with concurrent Takes batched into pipelines (the default) and without.
func BenchmarkTakeParallel(b *testing.B) {
	for _, noBatching := range []bool{false, true} {
		b.Run(map[bool]string{false: "batching", true: "no-batching"}[noBatching], func(b *testing.B) {
			bk, h := benchBucketConfig(b, Config{Rate: 1e9, Burst: 1e9, NoBatching: noBatching},
				limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
			ctx := context.Background()
			start := time.Now()
			testenv.RunParallel(b, func() error { return bk.Wait(ctx, 1) })
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tokens/s")
			b.ReportMetric(float64(h.N.Load())/float64(b.N), "round-trips/token")
		})
	}
}

// BenchmarkTakeAlone is one Store.Take on a plentiful bucket by a lone
// caller, without the Bucket: the script call, its arguments and the
// parsing of its reply. Run with -benchmem: a Take allocates 7 times
// (go-redis's command, connection check and reply reading included).
func BenchmarkTakeAlone(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	b.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Skipf("Redis at 127.0.0.1:6379: %v", err)
	}
	s, err := New(c, Config{Bucket: uniqueBucket(b, c), Rate: 1e9, Burst: 1e9})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := backend.TakeRequest{Cost: 1, MaxWait: time.Second}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Take(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
