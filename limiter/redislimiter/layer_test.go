package redislimiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// clockedLayers drives the layer scripts at explicit instants.
type clockedLayers struct{ l *Layered }

func (c clockedLayers) TakeLayersAt(now time.Time, req backend.LayerRequest) (backend.LayerResult, error) {
	return c.l.takeLayers(context.Background(), now, req)
}

func (c clockedLayers) RefundLayersAt(now time.Time, req backend.LayerRequest, res backend.LayerResult) error {
	return c.l.refundLayers(context.Background(), now, req, res)
}

func (c clockedLayers) DelayLayersAt(now time.Time, req backend.LayerRequest, res backend.LayerResult, from time.Time, by time.Duration) (bool, error) {
	return c.l.delayLayers(context.Background(), now, req, res, from, by)
}

func (c clockedLayers) ChargeLayersAt(now time.Time, charges []backend.LayerCharge) error {
	return c.l.chargeLayers(context.Background(), now, charges)
}

func (c clockedLayers) LayerStatusAt(now time.Time, layer, key string) (backend.LayerState, error) {
	return c.l.layerStatus(context.Background(), now, layer, key)
}

func (c clockedLayers) StatusAt(now time.Time) (limiter.State, error) {
	return c.l.status(context.Background(), now.UnixMicro())
}

// newLayered returns a layered store on a unique bucket of c, whose keys
// are deleted when the test ends.
func newLayered(t testing.TB, c redis.UniversalClient, rate float64, burst int, layers []limiter.Layer) *Layered {
	t.Helper()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.WithLayers(layers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteLayerKeys(t, c, l) })
	return l
}

// deleteLayerKeys deletes every key of l's layers.
func deleteLayerKeys(t testing.TB, c redis.UniversalClient, l *Layered) {
	ctx := context.Background()
	for i := range l.layers {
		c.Del(ctx, l.unkeyed[i])
		iter := c.Scan(ctx, 0, globEscaper.Replace(l.keyPrefix[i])+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	}
}

func TestRedisLayerSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.LayeredClockedStore {
		return clockedLayers{newLayered(t, c, rate, burst, layers)}
	})
}

func TestRedisLayerCharge(t *testing.T) {
	c := newClient(t)
	storetest.RunChargeLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.ChargeClockedStore {
		return clockedLayers{newLayered(t, c, rate, burst, layers)}
	})
}

func TestLayerAdmin(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	l := newLayered(t, c, 1000, 1000, []limiter.Layer{
		{Name: "per-key", Keyed: true, Rate: 1, Burst: 3},
		{Name: "daily", Quota: 100, Per: limiter.PerDay},
	})
	var k7 time.Time // when k7 took its token: it refills 1/s from there
	for i := range 50 {
		if i == 7 {
			k7 = time.Now()
		}
		if _, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": fmt.Sprint("k", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := l.CountLayerKeys(ctx, c, "per-key")
	if err != nil || n.Keys != 50 || !n.Exact {
		t.Fatalf("CountLayerKeys(per-key) = %+v, %v; want exactly 50", n, err)
	}
	if n, err := l.CountLayerKeys(ctx, c, "daily"); err != nil || n.Keys != 1 {
		t.Fatalf("CountLayerKeys(daily) = %+v, %v; want 1", n, err)
	}
	st, err := l.LayerStatus(ctx, "per-key", "k7")
	if refill := time.Since(k7).Seconds(); err != nil || st.Full || st.Tokens < 2 || st.Tokens > 2+refill+0.001 { // the tokens are read in thousandths
		t.Fatalf("LayerStatus(per-key, k7) = %+v, %v; want 2 tokens and the %.3f refilled since its take", st, err, refill)
	}
	if err := l.ResetLayer(ctx, "per-key", "k7"); err != nil {
		t.Fatal(err)
	}
	if st, err := l.LayerStatus(ctx, "per-key", "k7"); err != nil || !st.Full || st.Tokens != 3 {
		t.Fatalf("LayerStatus after ResetLayer = %+v, %v; want full", st, err)
	}
	if n, _ := l.CountLayerKeys(ctx, c, "per-key"); n.Keys != 49 {
		t.Errorf("CountLayerKeys after a reset = %+v, want 49", n)
	}
	if _, err := l.LayerStatus(ctx, "nope", ""); err == nil {
		t.Error("LayerStatus of an unknown layer succeeded")
	}
	// Past the scan limit the count is an estimate.
	defer func(limit, count int64) { layerScanLimit, layerScanCount = limit, count }(layerScanLimit, layerScanCount)
	layerScanLimit, layerScanCount = 5, 5
	if n, err := l.CountLayerKeys(ctx, c, "per-key"); err != nil || n.Exact {
		t.Errorf("CountLayerKeys with a scan limit of 1 = %+v, %v; want an estimate", n, err)
	}
}

// TestLayeredBatchedConcurrent sends layered takes from 64 goroutines, so
// that they are batched into pipelines, some of them with contexts that end
// while queued or in flight: every grant a caller received was charged on
// the shared bucket and on its key, and nothing else was.
func TestLayeredBatchedConcurrent(t *testing.T) {
	c := newClient(t)
	l := newLayered(t, c, 0.001, 10000, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 0.001, Burst: 5}})
	const keys = 20
	var mu sync.Mutex
	granted := map[string]int{}
	total := 0
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				key := fmt.Sprint("k", (g*10+i)%keys)
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%7 == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i)*100*time.Microsecond)
				}
				res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": key}})
				cancel()
				if err == nil && res.Granted {
					mu.Lock()
					granted[key]++
					total++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	ctx := context.Background()
	st, err := l.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(st.Tokens-float64(10000-total)) > 0.5 {
		t.Errorf("shared tokens = %v after %d grants, want %d", st.Tokens, total, 10000-total)
	}
	for k := range keys {
		key := fmt.Sprint("k", k)
		ls, err := l.LayerStatus(ctx, "per-key", key)
		if err != nil {
			t.Fatal(err)
		}
		if granted[key] > 5 || math.Abs(ls.Tokens-float64(5-granted[key])) > 0.5 {
			t.Errorf("key %s: %d grants, %v tokens left; want at most 5 grants and 5 - grants left", key, granted[key], ls.Tokens)
		}
	}
	t.Logf("%d grants over %d keys", total, keys)
}

// TestPaidSlotOnRedisClock: at Redis's time, both layer scripts let a
// request pass a delay layer on a slot the layer booked whose lateness
// allowance has not ended by the script's clock, and decide the layer as
// usual (here: book a new slot) once it has, or for a slot the layer's
// state does not hold (never booked, or booked in a state Redis lost
// since: before the state was made). The instants go to the script (paidArg), which compares them
// with its own TIME and the key's state: the slot's Due is on Redis's
// clock.
func TestPaidSlotOnRedisClock(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	for _, skipShared := range []bool{false, true} { // layersScript, layersKeyedScript
		l := newLayered(t, c, 1e6, 1e6, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1, OnExceed: limiter.ActionDelay}})
		req := backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": "k"}, SkipShared: skipShared}
		first, err := l.TakeLayers(ctx, req)
		if err != nil || !first.Granted {
			t.Fatalf("first take = %+v, %v", first, err)
		}
		booked, err := l.TakeLayers(ctx, req)
		if err != nil || booked.Exceeded == nil || !booked.Exceeded.Reserved {
			t.Fatalf("second take = %+v, %v; want a slot booked", booked, err)
		}
		slot := booked.Exceeded.Slot()
		if !slot.Booked.Equal(booked.At) {
			t.Fatalf("slot booked at %v, want the store's clock of its booking, %v", slot.Booked, booked.At)
		}
		for _, tc := range []struct {
			due, booked time.Time
			pass        bool
		}{
			{slot.Due, slot.Booked, true},
			{first.At.Add(-time.Hour), slot.Booked, false},
			{slot.Due.Add(time.Hour), slot.Booked, false},
			// Booked before the key's state was made: Redis lost the
			// state it was booked in.
			{slot.Due, first.At.Add(-2 * time.Second), false},
		} {
			req.Paid = []limiter.PaidSlot{{Layer: "per-key", Key: "k", Due: tc.due, Booked: tc.booked}}
			res, err := l.TakeLayers(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if passed := res.Granted && res.Exceeded == nil; passed != tc.pass {
				t.Errorf("skip shared %v, slot due %v after the first take: %+v, passed %v, want %v", skipShared, tc.due.Sub(first.At), res, passed, tc.pass)
			}
			if !tc.pass && (res.Exceeded == nil || !res.Exceeded.Reserved) {
				t.Errorf("skip shared %v, slot late: %+v, want a new slot booked", skipShared, res.Exceeded)
			}
		}
	}
}

func TestRedisFairSteps(t *testing.T) {
	c := newClient(t)
	storetest.RunFair(t, func(t *testing.T, rate float64, burst int, fair limiter.Fair) storetest.LayeredClockedStore {
		l, err := newLayered(t, c, rate, burst, nil).WithFair(fair)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Del(context.Background(), l.fairKeys()...) })
		return clockedLayers{l}
	})
}

func TestRedisPolicySteps(t *testing.T) {
	c := newClient(t)
	storetest.RunPolicyLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.LayeredClockedStore {
		return clockedLayers{newLayered(t, c, rate, burst, layers)}
	})
}

// TestWithFairKeepsTheClusterBatchScript: the store WithFair returns
// batches with its own batcher, which must keep the script of a Cluster's
// call per master. It had none, so a leased request of a fair store on a
// Cluster (one without a tenant) would have called a nil script.
func TestWithFairKeepsTheClusterBatchScript(t *testing.T) {
	l := newLayered(t, newClient(t), 10, 5, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1}})
	f, err := l.WithFair(limiter.Fair{})
	if err != nil {
		t.Fatal(err)
	}
	if l.batch == nil || f.batch == nil || f.batch.byMaster == nil || f.batch.byMaster != l.batch.byMaster {
		t.Fatalf("the fair store's batcher has script %p, want the store's %p", f.batch.byMaster, l.batch.byMaster)
	}
	if f.batch.l != f {
		t.Fatal("the fair store's batcher sends through the store it was copied from")
	}
}

// TestPaidSlotAfterRedisLostItsState: Redis loses every key (FLUSHALL, as
// a restart without persistence would) while a message waits for the slot
// a delay layer booked it. The fresh state then books past that slot's due
// for newer messages. Back at its due, the old slot must not pass: its key
// would get a message at the slot and one at each fresh booking, closer
// than the layer's spacing. Before, it passed, since the fresh state's
// last send was after its due. For a keyed layer (its shard) and a layer
// without keys (its key of its own), with both scripts.
func TestPaidSlotAfterRedisLostItsState(t *testing.T) {
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: testenv.PrivateRedis(t)})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 6, 0, 0, 100_000_000, time.UTC)
	for _, tc := range []struct {
		name       string
		layer      limiter.Layer
		key        string
		skipShared bool
	}{
		{"keyed", limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.2, Burst: 1, OnExceed: limiter.ActionDelay}, "k", false},
		{"keyed, keyed script", limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.2, Burst: 1, OnExceed: limiter.ActionDelay}, "k", true},
		{"without keys", limiter.Layer{Name: "all", Rate: 0.2, Burst: 1, OnExceed: limiter.ActionDelay}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			l := privateLayered(t, c, tc.layer)
			req := backend.LayerRequest{Cost: 1, SkipShared: tc.skipShared}
			if tc.layer.Keyed {
				req.Keys = map[string]string{tc.layer.Name: tc.key}
			}
			take := func(at time.Time, paid []limiter.PaidSlot) backend.LayerResult {
				t.Helper()
				r := req
				r.Paid = paid
				res, err := l.takeLayers(ctx, at, r)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			if res := take(t0, nil); !res.Granted {
				t.Fatalf("first take: %+v", res)
			}
			res := take(t0, nil)
			if res.Exceeded == nil || !res.Exceeded.Reserved {
				t.Fatalf("second take: %+v, want a slot booked", res)
			}
			old := res.Exceeded.Slot() // due at t0 + 5 s
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			at := t0.Add(1500 * time.Millisecond)
			if res := take(at, nil); !res.Granted {
				t.Fatalf("first take after the loss: %+v", res)
			}
			if res := take(at, nil); res.Exceeded == nil || !res.Exceeded.Reserved || !res.Exceeded.RetryAt.After(old.Due) {
				t.Fatalf("second take after the loss: %+v, want a slot booked after %v", res, old.Due)
			}
			res = take(old.Due, []limiter.PaidSlot{old})
			if res.Granted || res.Exceeded == nil || !res.Exceeded.Reserved {
				t.Fatalf("the slot booked before the loss, back at its due: %+v; want it decided again (a new slot booked)", res)
			}
			if got, want := res.Exceeded.RetryAt, at.Add(10*time.Second); !got.Equal(want) {
				t.Errorf("new slot at %v, want %v (behind the two booked since the loss)", got, want)
			}
		})
	}
}
