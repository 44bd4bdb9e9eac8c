package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// warmClockedStore is a clockedStore whose bucket has a warm-up, which it
// tells the Bucket (limiter.WarmupStore) as the Redis store does.
type warmClockedStore struct{ *clockedStore }

func (s warmClockedStore) Warmup() time.Duration { return s.mem().Warmup() }

// newWarmRig is newRig on a shared bucket with the warm-up warm.
func newWarmRig(t *testing.T, rate float64, burst, replicas int, warm time.Duration, opts limiter.Options) *rig {
	t.Helper()
	clk := clocktest.New(storetest.Base)
	r := &rig{t: t, clk: clk, store: newClockedStore(t, clk, rate, burst, replicas)}
	if err := r.store.m.SetWarmup(warm); err != nil {
		t.Fatal(err)
	}
	opts.Clock = clk
	opts.Lease.Disabled = true
	opts.ProbeInterval = time.Hour
	opts.Logger = discardLogger()
	b, err := limiter.New(warmClockedStore{r.store}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r.b = b
	testenv.Eventually(t, 10*time.Second, "the Bucket watching the store", r.store.watched)
	return r
}

// skip moves the clock by d at once; no caller may be asleep.
func (r *rig) skip(d time.Duration) {
	r.clk.Advance(d)
	r.settle()
}

func wantGrants(t *testing.T, r *rig, want []time.Duration, why string) {
	t.Helper()
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v (%s)", got, want, why)
	}
}

// TestFallbackContinuesTheRamp: 30/s, burst 30, a warm-up of 60s, and a
// FallbackRate of 30/s. The store fails half-way through the ramp (the
// shared rate is 30/√5 = 13.42/s): the local bucket goes on along the
// same curve, at 13.42/s then, 30/√3 = 17.32/s at 45s, and its full
// FallbackRate from 60s, never above it. Before, it granted at 30/s at
// once.
func TestFallbackContinuesTheRamp(t *testing.T) {
	r := newWarmRig(t, 30, 30, 1, time.Minute, limiter.Options{FallbackRate: 30})
	r.wait(1) // cold shared bucket: 10/s
	r.skip(30 * time.Second)
	r.wait(1) // 13.42/s
	wantGrants(t, r, []time.Duration{0, 30 * time.Second}, "shared")
	r.store.down.Store(true)
	for range 3 {
		r.wait(1) // local, empty: reserved at 1/13.42 s apart
	}
	if r.b.Mode() != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", r.b.Mode())
	}
	r.advance(ms(300))
	at := 30 * time.Second
	wantGrants(t, r, []time.Duration{at + ms(75), at + ms(150), at + ms(224)}, "local at 13.42/s; 34, 67, 100 ms at 30/s")

	r.skip(15*time.Second - ms(300))
	r.wait(30) // the local burst, full
	r.wait(1)
	r.advance(ms(100))
	at = 45 * time.Second
	wantGrants(t, r, []time.Duration{at, at + ms(58)}, "local at 17.32/s")

	r.skip(16*time.Second - ms(100))
	r.wait(30)
	r.wait(1)
	r.advance(ms(100))
	at = 61 * time.Second
	wantGrants(t, r, []time.Duration{at, at + ms(34)}, "local at the FallbackRate once the ramp is over")
}

// TestFallbackStartsColdWithoutTheSharedRate: a replica whose store is
// down from the start never saw the shared bucket's rate: it may be cold,
// so the local bucket ramps from a third of the FallbackRate.
func TestFallbackStartsColdWithoutTheSharedRate(t *testing.T) {
	r := newWarmRig(t, 30, 30, 1, time.Minute, limiter.Options{FallbackRate: 30})
	r.store.down.Store(true)
	r.wait(1)
	r.wait(1)
	r.advance(ms(300))
	wantGrants(t, r, []time.Duration{ms(100), ms(200)}, "local at 10/s; 34, 67 ms at 30/s")
}

// TestFallbackStaysWarmAndRampsAfterIdle: without a FallbackRate the local
// rate is the last effective rate over the replicas; a warm shared bucket
// gives a warm local one. Idle for longer than the warm-up, the local
// bucket ramps again from a third of its rate, as the shared one would.
func TestFallbackStaysWarmAndRampsAfterIdle(t *testing.T) {
	r := newWarmRig(t, 30, 30, 1, time.Minute, limiter.Options{})
	if _, err := r.b.State(context.Background()); err != nil { // learns 1 replica
		t.Fatal(err)
	}
	r.wait(1)
	r.skip(30 * time.Second)
	r.wait(1)
	r.skip(31 * time.Second)
	r.wait(1) // the ramp is over: 30/s
	wantGrants(t, r, []time.Duration{0, 30 * time.Second, 61 * time.Second}, "shared")
	r.store.down.Store(true)
	r.wait(1)
	r.advance(ms(100))
	at := 61 * time.Second
	wantGrants(t, r, []time.Duration{at + ms(34)}, "local at 30/s")

	r.skip(61*time.Second - ms(100))
	at = 122 * time.Second
	r.wait(10) // cold: a third of the burst
	r.wait(1)  // and a third of the rate
	r.advance(ms(200))
	wantGrants(t, r, []time.Duration{at, at + ms(100)}, "local ramp from 10/s after idle")
}

// warmLayered is a layeredClocked whose shared bucket has a warm-up.
type warmLayered struct{ *layeredClocked }

func (s warmLayered) Warmup() time.Duration { return s.m.Warmup() }

// TestLayeredFallbackRamps: the local layers share the local bucket, so a
// layered take in fallback ramps as a plain one: a replica whose store is
// down from the start reserves at 10/s (a third of 30/s), not 30/s.
func TestLayeredFallbackRamps(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 30, 30, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 100, Burst: 100})
	if err := s.m.SetWarmup(time.Minute); err != nil {
		t.Fatal(err)
	}
	b := newLayeredBucket(t, clk, warmLayered{s})
	ctx := context.Background()
	if err := b.Check(ctx); err != nil { // learns 1 replica
		t.Fatal(err)
	}
	s.down.Store(true)
	done := waitN(b, ctx, keyReq("a"))
	clk.WaitTimers(t, 2) // the caller's sleep and the probe's
	clk.Advance(99 * time.Millisecond)
	if n := clk.Timers(); n != 2 {
		t.Fatalf("%d timers at +99ms: the caller's sleep ended before +100ms (local 10/s), at 30/s", n)
	}
	clk.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m := b.Mode(); m != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", m)
	}
}
