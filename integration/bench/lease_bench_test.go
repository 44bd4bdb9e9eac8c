package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// leaseStores are the stores that lease-served Waits are measured on. Their
// rate is far above any demand, so that a lease never runs dry.
var leaseStores = []struct {
	name string
	new  func(tb testing.TB) limiter.Store
}{
	{"memory", func(tb testing.TB) limiter.Store {
		m, err := backend.NewMemory(1e9, 1e9)
		if err != nil {
			tb.Fatal(err)
		}
		return m
	}},
	{"redis", func(tb testing.TB) limiter.Store {
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(tb)})
		tb.Cleanup(func() { c.Close() })
		name := "bench-" + strings.ReplaceAll(tb.Name(), "/", "-") + "-" + randomID()
		s, err := redislimiter.New(c, redislimiter.Config{Bucket: name, Rate: 1e9, Burst: 1e9})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Del(context.Background(), s.Keys()...) })
		return s
	}},
}

// leasedBucket returns a Bucket on store whose lease, once taken, neither
// runs dry nor expires during a benchmark, so that every Wait after the
// first is served from it.
func leasedBucket(tb testing.TB, store limiter.Store) *limiter.Bucket {
	b, err := limiter.New(store, limiter.Options{
		Lease: limiter.LeaseOptions{Fraction: 1, MaxBatch: math.MaxInt32, Idle: time.Hour},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	if err := b.Wait(context.Background(), 1); err != nil {
		tb.Fatal(err)
	}
	return b
}

// BenchmarkLeaseWait measures a Wait served from a lease: its time and its
// allocations, which should be none.
func BenchmarkLeaseWait(b *testing.B) {
	for _, s := range leaseStores {
		b.Run(s.name, func(b *testing.B) {
			bk := leasedBucket(b, s.new(b))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := bk.Wait(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLeaseWaitParallel is BenchmarkLeaseWait from GOMAXPROCS
// goroutines sharing one replica's lease.
func BenchmarkLeaseWaitParallel(b *testing.B) {
	bk := leasedBucket(b, leaseStores[0].new(b))
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := bk.Wait(ctx, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func TestLeaseWaitDoesNotAllocate(t *testing.T) {
	for _, s := range leaseStores {
		t.Run(s.name, func(t *testing.T) {
			bk := leasedBucket(t, s.new(t))
			ctx := context.Background()
			allocs := testing.AllocsPerRun(1000, func() {
				if err := bk.Wait(ctx, 1); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("Wait served from a lease allocates %v times, want 0", allocs)
			}
		})
	}
}

func TestLeaseAllocsHelper(t *testing.T) {
	m, err := backend.NewMemory(1e9, 1e9)
	if err != nil {
		t.Fatal(err)
	}
	got, err := leaseAllocs(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		t.Errorf("leaseAllocs = %v, want 0", got)
	}
}

func TestMaxWindow(t *testing.T) {
	bins := make([]int64, 3000)
	for i := range bins {
		bins[i] = 1
	}
	bins[1500] = 100
	tests := []struct {
		name string
		bins []int64
		want int64
	}{
		{"empty", nil, 0},
		{"shorter than a second", []int64{3, 4}, 7},
		{"flat with a spike", bins, 1099},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := result{t: tally{bins: tt.bins}}
			if got := r.maxWindow(); got != tt.want {
				t.Errorf("maxWindow = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestReadRedisStats(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	defer c.Close()
	ctx := testenv.Context(t, 10*time.Second)
	s, err := readRedisStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if s.calls <= 0 || s.cmds < s.calls {
		t.Errorf("readRedisStats = %+v, want 0 < calls <= cmds", s)
	}
}
