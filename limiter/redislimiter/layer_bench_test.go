package redislimiter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
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
						_, err := s.Take(ctx, backend.TakeRequest{Cost: 1})
						return err
					}
					i := n.Add(1)
					_, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": names[i%keys]}})
					return err
				}
				if err := one(); err != nil { // loads the script
					b.Fatal(err)
				}
				start := time.Now()
				if parallel {
					testenv.RunParallel(b, one)
				} else {
					b.ReportAllocs()
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

// BenchmarkLayersRatio measures, in alternating half-second rounds from 64
// goroutines, so that all see the same load on a shared machine:
//
//   - shared: the shared bucket alone, Store.Take, one script call per
//     message (batched as in production), no leasing;
//   - one-call: the shared bucket plus one keyed layer over 100k keys in
//     one layersScript call per message (Layered.TakeLayers);
//   - keyed-alone: the keyed layer alone (LayerRequest.SkipShared), as a
//     Bucket sends it while its lease pays the shared bucket;
//   - bucket: Bucket.WaitN on the layered store with leasing on (the
//     default), which is what the consumer calls: the keyed layer per
//     message, the shared bucket leased.
//
// It reports each one's median messages/s, the medians of the per-round
// ratios to shared, and the client's Redis round trips per message of
// bucket (a pipeline counts once; below 1 when batched). Run it with
// -benchtime 1x: it runs its own rounds.
//
//	go test ./limiter/redislimiter/ -run XXX -bench BenchmarkLayersRatio -benchtime 1x
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
	perKey := []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}}
	l, err := s.WithLayers(perKey)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteLayerKeys(b, c, l) })
	// The Bucket has its own client and store, so that its round trips
	// are counted alone.
	bc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: 64})
	b.Cleanup(func() { bc.Close() })
	bs, err := New(bc, Config{Bucket: uniqueBucket(b, c), Rate: 1e9, Burst: 1e9})
	if err != nil {
		b.Fatal(err)
	}
	bl, err := bs.WithLayers(perKey)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteLayerKeys(b, c, bl) })
	bk, err := limiter.New(bl, limiter.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bk.Close() })
	h := &countingHook{}
	bc.AddHook(h)
	ctx := context.Background()
	var n atomic.Int64
	const (
		shared = iota
		oneCall
		keyedAlone
		bucket
		modes
	)
	var bucketMsgs int64
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
					key := map[string]string{"per-key": names[n.Add(1)%keys]}
					switch mode {
					case shared:
						_, err = s.Take(ctx, backend.TakeRequest{Cost: 1})
					case oneCall, keyedAlone:
						_, err = l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: key, SkipShared: mode == keyedAlone})
					case bucket:
						err = bk.WaitN(ctx, limiter.Request{Cost: 1, Keys: key})
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
		if mode == bucket {
			bucketMsgs += done.Load()
		}
		return float64(done.Load()) / time.Since(start).Seconds()
	}
	for mode := range modes { // warm up: scripts loaded, lease and heartbeat under way
		round(mode)
	}
	bucketMsgs = 0
	calls0 := h.N.Load()
	var rates, ratios [modes][]float64
	for range 10 {
		var r [modes]float64
		for mode := range modes {
			r[mode] = round(mode)
			rates[mode] = append(rates[mode], r[mode])
			ratios[mode] = append(ratios[mode], r[mode]/r[shared])
		}
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return (v[4] + v[5]) / 2 }
	b.ReportMetric(median(rates[shared]), "shared-msgs/s")
	b.ReportMetric(median(rates[oneCall]), "one-call-msgs/s")
	b.ReportMetric(median(rates[keyedAlone]), "keyed-alone-msgs/s")
	b.ReportMetric(median(rates[bucket]), "bucket-msgs/s")
	b.ReportMetric(median(ratios[oneCall]), "one-call-ratio")
	b.ReportMetric(median(ratios[keyedAlone]), "keyed-alone-ratio")
	b.ReportMetric(median(ratios[bucket]), "bucket-ratio")
	b.ReportMetric(float64(h.N.Load()-calls0)/float64(bucketMsgs), "bucket-round-trips/msg")
	b.Logf("bucket/shared per round: %.2f", ratios[bucket])
}

// BenchmarkLayerRedisCPU measures what the keyed-only layer calls cost a
// private redis-server (nothing else runs on it), through the batcher as a
// Bucket sends them while its lease pays the shared bucket
// (LayerRequest.SkipShared), from 64 goroutines:
//
//   - keyed-100k: one token bucket per key (rate 1000, burst 1000) over
//     100,000 keys, every message a key of its own in turn;
//   - concurrency-10k: a concurrency layer of 3 slots per key over 10,000
//     keys, each message taking its slot and giving it back
//     (ReleaseSlots) once granted.
//
// It reports the server's CPU (INFO cpu, user and system) and the commands
// it ran (INFO commandstats, those of the scripts included) per message,
// and the script calls per message.
//
//	go test ./limiter/redislimiter/ -run XXX -bench BenchmarkLayerRedisCPU -benchtime 100000x
func BenchmarkLayerRedisCPU(b *testing.B) {
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: testenv.PrivateRedis(b), PoolSize: 64, MaxRetries: -1})
	b.Cleanup(func() { c.Close() })
	for _, bc := range []struct {
		name  string
		layer limiter.Layer
		keys  int
	}{
		{"keyed-100k", limiter.Layer{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}, 100_000},
		{"concurrency-10k", limiter.Layer{Name: "per-key", Keyed: true, Concurrency: 3, Lease: time.Minute}, 10_000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := New(c, Config{Bucket: uniqueBucket(b, c), Rate: 1e9, Burst: 1e9})
			if err != nil {
				b.Fatal(err)
			}
			l, err := s.WithLayers([]limiter.Layer{bc.layer})
			if err != nil {
				b.Fatal(err)
			}
			names := make([]string, bc.keys)
			for i := range names {
				names[i] = fmt.Sprintf("+1555%07d", i)
			}
			slots := bc.layer.Concurrency > 0
			ctx := context.Background()
			var n atomic.Int64
			one := func() error {
				i := n.Add(1)
				req := backend.LayerRequest{Cost: 1, SkipShared: true, Keys: map[string]string{"per-key": names[i%int64(bc.keys)]}}
				if slots {
					req.Holder = "h" + strconv.FormatInt(i, 10)
				}
				res, err := l.TakeLayers(ctx, req)
				if err != nil || !res.Granted {
					return fmt.Errorf("granted %v: %v", res.Granted, err)
				}
				if slots {
					return l.ReleaseSlots(ctx, []backend.SlotRelease{{Layer: "per-key", Key: req.Keys["per-key"], Holder: req.Holder}})
				}
				return nil
			}
			if err := one(); err != nil { // loads the scripts
				b.Fatal(err)
			}
			testenv.MeasureRedis(b, c, one)
		})
	}
}

// BenchmarkChargeLayers charges 10,000 keys of a per-recipient layer, and
// as many of a keyed daily quota, in one ChargeLayers: what a replica back
// from an outage in which it sent to 10,000 recipients asks of Redis
// before it shares the bucket again. ns/op is the whole charge.
func BenchmarkChargeLayers(b *testing.B) {
	c := newClient(b)
	l := newLayered(b, c, 1e6, 1e6, []limiter.Layer{
		{Name: "per-recipient", Keyed: true, Rate: 1.0 / 3600, Burst: 5},
		{Name: "daily", Keyed: true, Quota: 100, Per: limiter.PerDay},
	})
	const keys = 10_000
	at := time.Now()
	charges := make([]backend.LayerCharge, 0, 2*keys)
	for i := range keys {
		k := fmt.Sprintf("+4420%06d", i)
		charges = append(charges,
			backend.LayerCharge{Layer: "per-recipient", Key: k, Tokens: 1, At: at},
			backend.LayerCharge{Layer: "daily", Key: k, Tokens: 1, At: at})
	}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if err := l.ChargeLayers(ctx, charges); err != nil {
			b.Fatal(err)
		}
	}
}
