package limiter_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// watchedLayered is a layeredClocked whose Buckets hear its changes (a rate
// set or cleared), as a Redis store's subscribers do.
type watchedLayered struct {
	*layeredClocked
	watching atomic.Int64
	// trip, when set, returns how long a request takes to reach the
	// store and its answer to come back, slept on the fake clock.
	trip func() (there, back time.Duration)
	// trace, when set, is told of every TakeLayers and DelayLayers.
	trace func(string)
}

// legs returns how long a call's request and answer travel: trip's, or
// nothing.
func (s *watchedLayered) legs() (there, back time.Duration) {
	if s.trip == nil {
		return 0, 0
	}
	return s.trip()
}

// travel sleeps d on the store's fake clock.
func (s *watchedLayered) travel(d time.Duration) {
	if d > 0 {
		<-s.clk.NewTimer(d).C()
	}
}

func (s *watchedLayered) TakeLayers(ctx context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	there, back := s.legs()
	s.travel(there)
	res, err := s.layeredClocked.TakeLayers(ctx, req)
	if s.trace != nil {
		s.trace(fmt.Sprintf("+%v take %v class=%v paid=%d skip=%v: granted=%v wait=%v layersDue=%v limiting=%q class=%v rem=%.2f exceeded=%v err=%v",
			s.clk.Now().Sub(storetest.Base), req.Keys, req.Priority, len(req.Paid), req.SkipShared, res.Granted, res.Wait, res.LayersDue, res.Limiting, res.Class, res.Remaining, res.Exceeded != nil, err))
	}
	s.travel(back)
	return res, err
}

func (s *watchedLayered) DelayLayers(ctx context.Context, req limiter.LayerRequest, res limiter.LayerResult, from time.Time, by time.Duration) (bool, error) {
	there, back := s.legs()
	s.travel(there)
	ok, err := s.layeredClocked.DelayLayers(ctx, req, res, from, by)
	if s.trace != nil {
		s.trace(fmt.Sprintf("+%v delay %v from +%v by %v: %v %v", s.clk.Now().Sub(storetest.Base), req.Keys, from.Sub(storetest.Base), by, ok, err))
	}
	s.travel(back)
	return ok, err
}

func (s *watchedLayered) Watch(ctx context.Context, changed func(), pushed func(limiter.Push)) {
	s.watching.Add(1)
	s.m.Watch(ctx, changed, pushed)
}

// layerFleet drives Buckets on one watchedLayered at fixed instants: each
// worker takes the next message and waits for it, over and over, and the
// clock moves one millisecond at a time once every worker sleeps.
type layerFleet struct {
	t      *testing.T
	clk    *clocktest.Clock
	store  *watchedLayered
	active atomic.Int64

	mu    sync.Mutex
	next  int
	msgs  []map[string]string
	sends []fleetSend
}

type fleetSend struct {
	at   time.Duration
	keys map[string]string
}

func (f *layerFleet) take() (map[string]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.next >= len(f.msgs) {
		return nil, false
	}
	f.next++
	return f.msgs[f.next-1], true
}

func (f *layerFleet) worker(b *limiter.Bucket) {
	defer f.active.Add(-1)
	for {
		keys, ok := f.take()
		if !ok {
			return
		}
		if err := b.WaitN(context.Background(), limiter.Request{Cost: 1, Keys: keys}); err != nil {
			f.t.Errorf("WaitN(%v) at +%v: %v", keys, f.clk.Now().Sub(storetest.Base), err)
			return
		}
		f.mu.Lock()
		f.sends = append(f.sends, fleetSend{f.clk.Now().Sub(storetest.Base), keys})
		f.mu.Unlock()
	}
}

// settle waits until every worker left sleeps on a timer.
func (f *layerFleet) settle() {
	f.t.Helper()
	if !testenv.Within(10*time.Second, func() bool { return f.clk.Timers() == int(f.active.Load()) }) {
		f.t.Fatalf("at +%v: %d timers, %d workers", f.clk.Now().Sub(storetest.Base), f.clk.Timers(), f.active.Load())
	}
}

// setRate sets the shared rate (an override, or its clear) and waits
// until the workers it woke sleep again.
func (f *layerFleet) setRate(rate float64, burst int) {
	f.t.Helper()
	armed, n := f.clk.Armed(), int(f.active.Load())
	if err := f.store.m.SetRateAt(f.clk.Now(), rate, burst); err != nil {
		f.t.Fatal(err)
	}
	f.clk.WaitArmed(f.t, armed+n)
	f.settle()
}

// closestPairs returns, for each key of layer, its closest pair of sends
// (the gap, and when the first of the two went out).
func closestPairs(sends []fleetSend, layer string) map[string][2]time.Duration {
	by := map[string][]time.Duration{}
	for _, s := range sends {
		by[s.keys[layer]] = append(by[s.keys[layer]], s.at)
	}
	out := map[string][2]time.Duration{}
	for k, ats := range by {
		sort.Slice(ats, func(i, j int) bool { return ats[i] < ats[j] })
		for i := 1; i < len(ats); i++ {
			if d := ats[i] - ats[i-1]; i == 1 || d < out[k][0] {
				out[k] = [2]time.Duration{d, ats[i-1]}
			}
		}
	}
	return out
}

// TestOverrideClearedKeepsTheWaitLayerSpacing: three replicas share a
// bucket of 20/s, burst 5, with a per-sender layer of 5/s, burst 1, wait;
// three senders in turn, so the layer binds (15/s together). The rate is
// cut to 10/s, so the shared bucket binds and reservations queue, then
// cleared while they do. Every pair of one sender's messages must stay
// the layer's spacing (200 ms) apart, as the sink sees them.
func TestOverrideClearedKeepsTheWaitLayerSpacing(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	lc := newLayeredClocked(t, clk, 20, 5, 3, limiter.Layer{Name: "per-sender", Keyed: true, Rate: 5, Burst: 1, OnExceed: limiter.ActionWait})
	s := &watchedLayered{layeredClocked: lc}
	f := &layerFleet{t: t, clk: clk, store: s}
	for i := range 150 {
		f.msgs = append(f.msgs, map[string]string{"per-sender": fmt.Sprintf("s%d", i%3)})
	}
	var buckets []*limiter.Bucket
	for range 3 {
		b, err := limiter.New(s, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(), ProbeInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		buckets = append(buckets, b)
	}
	testenv.Eventually(t, 10*time.Second, "the Buckets watching the store", func() bool { return s.watching.Load() == 3 })
	for _, b := range buckets {
		for range 3 {
			f.active.Add(1)
			go f.worker(b)
		}
	}
	f.settle()
	for step := 0; f.active.Load() > 0; step++ {
		switch step {
		case 1500:
			f.setRate(10, 5)
		case 4500:
			f.setRate(20, 5)
		}
		clk.Advance(time.Millisecond)
		f.settle()
		if step > 60000 {
			t.Fatalf("%d workers still waiting after 60 s", f.active.Load())
		}
	}
	t.Logf("%d sends, last at +%v", len(f.sends), f.sends[len(f.sends)-1].at)
	f.mu.Lock()
	pairs := closestPairs(f.sends, "per-sender")
	f.mu.Unlock()
	for k, p := range pairs {
		d := p[0]
		t.Logf("sender %s: closest %v", k, d)
		if d < 199*time.Millisecond {
			t.Errorf("sender %s: closest pair %v apart, want the layer's 200ms", k, d)
		}
	}
}
