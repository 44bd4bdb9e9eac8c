package limiter_test

import (
	"context"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestRateCutHeardAtDifferentInstantsKeepsTheFleetApart: two replicas hold
// interleaved reservations at 10/s when the rate is cut to 1/s. One reads
// the new settings at once, the other 50 ms later (its announcement or its
// read was slow). Each reservation must come due where the store's queue
// puts it, 1 s after the one ahead of it whichever replica holds it. The
// replica that read later used to count those 50 ms as refilled at the old
// rate, so its reservations moved half a token forward and came due 0.5 s
// after the other's: pairs at twice the new rate for the length of the
// queue.
func TestRateCutHeardAtDifferentInstantsKeepsTheFleetApart(t *testing.T) {
	opts := limiter.Options{MaxReserve: 30 * time.Second}
	r := newRig(t, 10, 1, 2, opts)
	opts.Lease.Disabled = true
	second := newClockedBucket(t, r.clk, r.store, opts, func() bool {
		r.store.mu.Lock()
		defer r.store.mu.Unlock()
		return len(r.store.watchers) == 2
	})
	waitOn := func(b *limiter.Bucket) {
		r.open.Add(1)
		go func() {
			defer r.open.Add(-1)
			if err := b.Wait(context.Background(), 1); err != nil {
				t.Errorf("Wait at +%v: %v", r.at(), err)
				return
			}
			r.mu.Lock()
			r.results = append(r.results, r.at())
			r.mu.Unlock()
		}()
		r.settle()
	}
	waitOn(r.b)        // the burst, at once
	for i := range 8 { // +100 ms ... +800 ms, alternating replicas
		if i%2 == 0 {
			waitOn(second)
		} else {
			waitOn(r.b)
		}
	}
	r.advance(ms(10))
	if err := r.store.mem().SetRateAt(r.clk.Now(), 1, 1); err != nil {
		t.Fatal(err)
	}
	r.store.mu.Lock()
	first, late := r.store.watchers[0], r.store.watchers[1]
	r.store.mu.Unlock()
	r.change(4, first)
	r.advance(ms(50))
	r.change(4, late)
	r.advance(10 * time.Second)
	got := r.grants()
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	// Position p at the cut (+10 ms: 0.9, 1.9, ... 7.9 tokens) is due
	// p s after it.
	want := []time.Duration{0}
	for p := 0.9; p < 8; p++ {
		want = append(want, ms(10)+time.Duration(math.Round(p*1000))*time.Millisecond)
	}
	if !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v", got, want)
	}
}
