package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// classStore is a Store on a Memory driven by a fake clock that answers as
// a store with classes does about a reservation: its class (the request's)
// and that class's push counter. The test announces pushes and changes.
// It records the requests and counts the status reads.
type classStore struct {
	clk      *clocktest.Clock
	m        *limiter.Memory
	mu       sync.Mutex
	reqs     []limiter.TakeRequest
	counters [limiter.NumPriorities]float64
	changed  []func()
	pushed   []func(limiter.Push)
	statuses atomic.Int64
	down     atomic.Bool
}

func newClassStore(t *testing.T, clk *clocktest.Clock, rate float64, burst int) *classStore {
	t.Helper()
	return &classStore{clk: clk, m: newMemory(t, rate, burst)}
}

func (s *classStore) Take(_ context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	if s.down.Load() {
		return limiter.TakeResult{}, errDown
	}
	// The Memory serves every class alike, in the order of the takes: the
	// test moves reservations with pushes alone.
	plain := req
	plain.Priority, plain.MinShare = limiter.PriorityNormal, limiter.Shares{}
	res, err := s.m.TakeAt(s.clk.Now(), plain)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	res.Class, res.Pushed = req.Priority, s.counters[req.Priority]
	return res, err
}

func (s *classStore) Refund(_ context.Context, n int) error {
	s.m.RefundAt(s.clk.Now(), n)
	return nil
}

func (s *classStore) Pause(_ context.Context, d time.Duration) error {
	s.m.PauseAt(s.clk.Now(), d)
	return nil
}

func (s *classStore) Drain(_ context.Context, debt int) error {
	s.m.DrainAt(s.clk.Now(), debt)
	return nil
}

func (s *classStore) Status(_ context.Context) (limiter.State, error) {
	if s.down.Load() {
		return limiter.State{}, errDown
	}
	s.statuses.Add(1)
	st := s.m.StatusAt(s.clk.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	for c, n := range s.counters {
		st.Pushed[c] = n
	}
	return st, nil
}

func (s *classStore) Limits() (float64, int) { return s.m.Limits() }

func (s *classStore) Watch(ctx context.Context, changed func(), pushed func(limiter.Push)) {
	s.mu.Lock()
	s.changed = append(s.changed, changed)
	s.pushed = append(s.pushed, pushed)
	s.mu.Unlock()
	<-ctx.Done()
}

// push announces that class c was pushed back by tokens at the instant at
// (the store's clock).
func (s *classStore) push(c limiter.Priority, tokens float64, at time.Time) {
	s.mu.Lock()
	s.counters[c] += tokens
	p := limiter.Push{Class: c, Tokens: tokens, Counter: s.counters[c], At: at}
	fns := slices.Clone(s.pushed)
	s.mu.Unlock()
	for _, f := range fns {
		f(p)
	}
}

// pushSilently moves class c's counter as a push the Bucket does not hear.
func (s *classStore) pushSilently(c limiter.Priority, tokens float64) {
	s.mu.Lock()
	s.counters[c] += tokens
	s.mu.Unlock()
}

// announce announces a change, as a resubscription does.
func (s *classStore) announce() {
	s.mu.Lock()
	fns := slices.Clone(s.changed)
	s.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

// watched reports whether a Bucket watches the store.
func (s *classStore) watched() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pushed) > 0
}

func (s *classStore) requests() []limiter.TakeRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// classRig drives a Bucket at fixed instants, as rig does: callers of any
// class run in goroutines, and the clock moves one millisecond at a time
// once every caller is asleep.
type classRig struct {
	stepper
	// store is the classStore under the Bucket's store, if there is one.
	store *classStore
	open  atomic.Int64
	mu    sync.Mutex
	// grants maps a caller's name to the instant it returned, as an
	// offset from storetest.Base.
	grants map[string]time.Duration
	// keys are the requests' keys, for a layered store.
	keys map[string]string
}

// newClassRig drives a Bucket on a classStore of its own, which reserves
// up to 10 s ahead unless opts says otherwise.
func newClassRig(t *testing.T, rate float64, burst int, opts limiter.Options) *classRig {
	t.Helper()
	clk := clocktest.New(storetest.Base)
	cs := newClassStore(t, clk, rate, burst)
	if opts.MaxReserve == 0 {
		opts.MaxReserve = 10 * time.Second
	}
	r := newClassRigOn(t, clk, cs, cs.watched, opts)
	r.store = cs
	return r
}

// newClassRigOn drives a Bucket on s, whose clock is clk, once watching
// reports that the Bucket watches s.
func newClassRigOn(t *testing.T, clk *clocktest.Clock, s limiter.Store, watching func() bool, opts limiter.Options) *classRig {
	t.Helper()
	r := &classRig{grants: map[string]time.Duration{}}
	r.stepper = stepper{t: t, clk: clk, b: newClockedBucket(t, clk, s, opts, watching), open: &r.open}
	return r
}

// wait starts WaitN(cost) of class p, named name, and returns once it has
// returned or sleeps.
func (r *classRig) wait(name string, p limiter.Priority, cost int) {
	r.open.Add(1)
	go func() {
		defer r.open.Add(-1)
		if err := r.b.WaitN(context.Background(), limiter.Request{Cost: cost, Priority: p, Keys: r.keys}); err != nil {
			r.t.Errorf("%s: WaitN(%d) at +%v: %v", name, cost, r.at(), err)
			return
		}
		// A timer may fire inside a millisecond step, and the caller
		// read the clock then or at the step's end: count the step's end.
		at := (r.at() + time.Millisecond - 1).Truncate(time.Millisecond)
		r.mu.Lock()
		r.grants[name] = at
		r.mu.Unlock()
	}()
	r.settle()
}

func (r *classRig) granted() map[string]time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.grants)
}

func (r *classRig) check(want map[string]time.Duration) {
	r.t.Helper()
	got := r.granted()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		r.t.Fatalf("grants %v, want %v", got, want)
	}
}

// TestPushMovesOnlyTheSleepersOfItsClass: at 10/s, a low reservation is
// due at +100 ms and a normal one at +200 ms. A push of the normal class by
// 3 tokens moves the normal one back 300 ms and leaves the low one; a push
// of the low class by 2 tokens then moves the low one back 200 ms. Neither
// reads the store nor starts a generation.
func TestPushMovesOnlyTheSleepersOfItsClass(t *testing.T) {
	r := newClassRig(t, 10, 1, limiter.Options{})
	r.wait("first", limiter.PriorityNormal, 1)  // the burst
	r.wait("low", limiter.PriorityLow, 1)       // +100 ms
	r.wait("normal", limiter.PriorityNormal, 1) // +200 ms
	r.advance(ms(10))
	r.wake(1, func() { r.store.push(limiter.PriorityNormal, 3, r.clk.Now()) })
	r.advance(ms(10))
	r.wake(1, func() { r.store.push(limiter.PriorityLow, 2, r.clk.Now()) })
	r.advance(ms(600))
	r.check(map[string]time.Duration{"first": 0, "low": ms(300), "normal": ms(500)})
	if n := r.store.statuses.Load(); n != 0 {
		t.Fatalf("%d status reads for pushes, want 0", n)
	}
}

// TestPushAfterTheDueInstantIsIgnored: a push made (on the store's clock)
// after a reservation was due did not move it, however late it arrives;
// one made before it does, even when it arrives late.
func TestPushAfterTheDueInstantIsIgnored(t *testing.T) {
	r := newClassRig(t, 10, 1, limiter.Options{})
	r.wait("first", limiter.PriorityLow, 1)
	r.wait("low", limiter.PriorityLow, 1) // +100 ms
	r.advance(ms(50))
	r.wake(1, func() { r.store.push(limiter.PriorityLow, 1, storetest.Base.Add(ms(100))) })
	r.wake(1, func() { r.store.push(limiter.PriorityLow, 2, storetest.Base.Add(ms(60))) }) // +200 ms
	r.advance(ms(300))
	r.check(map[string]time.Duration{"first": 0, "low": ms(300)})
}

// TestResubscriptionCatchesUpWithTheCounters: pushes missed while the
// Bucket was not subscribed are in the store's counters; the change the
// resubscription announces moves the sleepers of the class back by them.
func TestResubscriptionCatchesUpWithTheCounters(t *testing.T) {
	r := newClassRig(t, 10, 1, limiter.Options{})
	r.wait("first", limiter.PriorityNormal, 1)
	r.wait("low", limiter.PriorityLow, 1)       // +100 ms
	r.wait("normal", limiter.PriorityNormal, 1) // +200 ms
	r.advance(ms(20))
	r.store.pushSilently(limiter.PriorityLow, 5)
	r.wake(2, r.store.announce)
	r.advance(ms(700))
	r.check(map[string]time.Duration{"first": 0, "low": ms(600), "normal": ms(200)})
}

// TestLeaseServesOnlyTheBucketsClass: a high Bucket's lease serves its own
// class; a low request goes to the store, for its cost alone, and a push
// leaves the lease alone.
func TestLeaseServesOnlyTheBucketsClass(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClassStore(t, clk, 100, 100)
	b, err := limiter.New(s, limiter.Options{Clock: clk, Logger: discardLogger(), Priority: limiter.PriorityHigh,
		Lease: limiter.LeaseOptions{Fraction: 0.5, MinBatch: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	steps := []struct {
		name string
		do   func() error
	}{
		{"Wait high: leases 50", func() error { return b.Wait(ctx, 1) }},
		{"WaitN low: the store", func() error { return b.WaitN(ctx, limiter.Request{Cost: 1, Priority: limiter.PriorityLow}) }},
		{"WaitN normal: the store", func() error { return b.WaitN(ctx, limiter.Request{Cost: 2}) }},
		{"WaitN high: the lease", func() error {
			return b.WaitN(ctx, limiter.Request{Cost: 1, Priority: limiter.PriorityHigh})
		}},
		{"a push", func() error { s.push(limiter.PriorityLow, 1, clk.Now()); return nil }},
		{"Allow high: the lease", func() error {
			if ok, err := b.Allow(ctx, 1); !ok || err != nil {
				return fmt.Errorf("Allow = %v, %v", ok, err)
			}
			return nil
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
	}
	var got []string
	for _, q := range s.requests() {
		got = append(got, fmt.Sprintf("%s:%d", q.Priority, q.Cost))
	}
	if want := []string{"high:50", "low:1", "normal:2"}; !slices.Equal(got, want) {
		t.Fatalf("store takes %v, want %v", got, want)
	}
	if n := s.statuses.Load(); n != 0 {
		t.Fatalf("%d status reads, want 0", n)
	}
}

// TestRequestsCarryTheirClass: Wait and Allow ask for the Bucket's class,
// WaitN for the request's as it is, and every take names the shares.
func TestRequestsCarryTheirClass(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClassStore(t, clk, 100, 100)
	shares := limiter.Shares{limiter.PriorityLow: 0.1}
	b, err := limiter.New(s, limiter.Options{Clock: clk, Logger: discardLogger(), Priority: limiter.PriorityLow,
		MinShare: shares, Lease: limiter.LeaseOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Allow(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, p := range []limiter.Priority{limiter.PriorityNormal, limiter.PriorityHigh} {
		if err := b.WaitN(ctx, limiter.Request{Cost: 1, Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, q := range s.requests() {
		if q.MinShare != shares {
			t.Errorf("take %+v: MinShare %v, want %v", q, q.MinShare, shares)
		}
		got = append(got, q.Priority.String())
	}
	if want := []string{"low", "low", "normal", "high"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v", got, want)
	}
	if err := b.WaitN(ctx, limiter.Request{Cost: 1, Priority: limiter.NumPriorities}); err == nil {
		t.Fatal("WaitN with an unknown class succeeded")
	}
}

// TestWaitingByPriorityAndPriorityWaited: the waiting callers are counted
// per class, and each successful wait is reported with its class.
func TestWaitingByPriorityAndPriorityWaited(t *testing.T) {
	type waited struct {
		p limiter.Priority
		d time.Duration
	}
	var mu sync.Mutex
	var seen []waited
	obs := &limiter.Observer{PriorityWaited: func(p limiter.Priority, d time.Duration) {
		mu.Lock()
		seen = append(seen, waited{p, d})
		mu.Unlock()
	}}
	r := newClassRig(t, 10, 1, limiter.Options{Observer: obs, Lease: limiter.LeaseOptions{Disabled: true}})
	r.wait("first", limiter.PriorityNormal, 1)
	r.wait("high", limiter.PriorityHigh, 1)  // +100 ms
	r.wait("low", limiter.PriorityLow, 1)    // +200 ms
	r.wait("high2", limiter.PriorityHigh, 1) // +300 ms
	want := [limiter.NumPriorities]int{}
	want[limiter.PriorityHigh], want[limiter.PriorityLow] = 2, 1
	if got := r.b.WaitingByPriority(); got != want || r.b.Waiting() != 3 {
		t.Fatalf("waiting by class %v, total %d; want %v, 3", got, r.b.Waiting(), want)
	}
	r.advance(ms(300))
	if got := r.b.WaitingByPriority(); got != ([limiter.NumPriorities]int{}) || r.b.Waiting() != 0 {
		t.Fatalf("waiting by class %v, total %d after the grants; want none", got, r.b.Waiting())
	}
	mu.Lock()
	defer mu.Unlock()
	wantSeen := []waited{{limiter.PriorityNormal, 0}, {limiter.PriorityHigh, ms(100)}, {limiter.PriorityLow, ms(200)}, {limiter.PriorityHigh, ms(300)}}
	if !slices.Equal(seen, wantSeen) {
		t.Fatalf("PriorityWaited %v, want %v", seen, wantSeen)
	}
}

// memClassStore is a Memory driven by a fake clock, whose own Watch
// announces the pushes its takes make.
type memClassStore struct {
	*limiter.Memory
	clk *clocktest.Clock
	// watching is set when the Bucket calls Watch.
	watching *atomic.Bool
}

func (s memClassStore) Watch(ctx context.Context, changed func(), pushed func(limiter.Push)) {
	s.watching.Store(true)
	s.Memory.Watch(ctx, changed, pushed)
}

func (s memClassStore) watched() bool { return s.watching.Load() }

func (s memClassStore) Take(_ context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	return s.TakeAt(s.clk.Now(), req)
}

func (s memClassStore) Refund(_ context.Context, n int) error {
	s.RefundAt(s.clk.Now(), n)
	return nil
}

func (s memClassStore) RefundClass(_ context.Context, n int, c limiter.Priority) error {
	s.RefundClassAt(s.clk.Now(), n, c)
	return nil
}

func (s memClassStore) Status(_ context.Context) (limiter.State, error) {
	return s.StatusAt(s.clk.Now()), nil
}

// sleeperOpts are the options of the Buckets whose low sleepers a high
// arrival moves: reservations up to 10 s ahead, and no lease.
var sleeperOpts = limiter.Options{MaxReserve: 10 * time.Second, Lease: limiter.LeaseOptions{Disabled: true}}

// newMemClassRig drives a Bucket on a memClassStore (rate, burst), with
// opts.
func newMemClassRig(t *testing.T, rate float64, burst int, opts limiter.Options) *classRig {
	t.Helper()
	clk := clocktest.New(storetest.Base)
	s := memClassStore{newMemory(t, rate, burst), clk, new(atomic.Bool)}
	return newClassRigOn(t, clk, s, s.watched, opts)
}

// highArrives: two low callers, low1 and low2, sleep on reservations due
// at +100 and +200 ms of a 10/s bucket. A high caller that arrives at
// +10 ms gets the next slot (+110 ms), and the low ones move back a slot
// each. before are the grants made before (the burst's, if any).
func (r *classRig) highArrives(before map[string]time.Duration) {
	r.t.Helper()
	r.advance(ms(10))
	r.wake(2, func() { r.wait("high", limiter.PriorityHigh, 1) })
	r.advance(ms(400))
	want := map[string]time.Duration{"high": ms(110), "low1": ms(200), "low2": ms(300)}
	maps.Copy(want, before)
	r.check(want)
}

// TestHighArrivalMovesLowSleepersOnMemory: on the Memory store, whose
// takes announce their pushes, a high request that arrives while two low
// ones sleep on reservations at +100 and +200 ms gets the next slot
// (+110 ms), and the low ones move back a slot each.
func TestHighArrivalMovesLowSleepersOnMemory(t *testing.T) {
	r := newMemClassRig(t, 10, 1, sleeperOpts)
	r.wait("first", limiter.PriorityLow, 1)
	r.wait("low1", limiter.PriorityLow, 1) // +100 ms
	r.wait("low2", limiter.PriorityLow, 1) // +200 ms
	r.highArrives(map[string]time.Duration{"first": 0})
}

// TestLocalFallbackMovesLowSleepers: while the store is down, the local
// bucket orders the classes as the shared one does: a high request that
// arrives while two low ones sleep on local reservations at +100 and
// +200 ms gets the next slot, and the low ones move back a slot each,
// so the local rate holds.
func TestLocalFallbackMovesLowSleepers(t *testing.T) {
	r := newClassRig(t, 10, 1, sleeperOpts)
	r.localLowSleepers()
	r.highArrives(nil)
}

// localLowSleepers takes the store down and starts low1 and low2, which
// the local bucket, empty at first, serves at +100 and +200 ms.
func (r *classRig) localLowSleepers() {
	r.t.Helper()
	r.store.down.Store(true)
	r.wait("low1", limiter.PriorityLow, 1) // the local bucket starts empty: +100 ms
	if r.b.Mode() != limiter.ModeLocal {
		r.t.Fatalf("mode %s, want local", r.b.Mode())
	}
	r.wait("low2", limiter.PriorityLow, 1) // +200 ms
}

// layeredClassStore is a memClassStore on a LayeredMemory's shared
// bucket whose layered takes and refunds go to the LayeredMemory, at the
// fake clock's instant.
type layeredClassStore struct {
	memClassStore
	lm *limiter.LayeredMemory
}

func (s layeredClassStore) Layers() []limiter.Layer { return s.lm.Layers() }

func (s layeredClassStore) TakeLayers(_ context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	return s.lm.TakeLayersAt(s.clk.Now(), req)
}

func (s layeredClassStore) RefundLayers(_ context.Context, req limiter.LayerRequest, res limiter.LayerResult) error {
	return s.lm.RefundLayersAt(s.clk.Now(), req, res)
}

func (s layeredClassStore) DelayLayers(_ context.Context, req limiter.LayerRequest, res limiter.LayerResult, from time.Time, by time.Duration) (bool, error) {
	return s.lm.DelayLayersAt(s.clk.Now(), req, res, from, by)
}

// TestHighArrivalMovesLayeredLowSleepers: the same as on the Memory store,
// through WaitN on a layered store whose keyed layer leaves the shared
// bucket the limit. The layer is charged when each low request goes out
// (+100, +200 ms), and a request that goes out before one charged later
// finds it used up to that instant less its burst: its burst (100 at
// 1000/s) covers the 200 ms the low ones reserved ahead.
func TestHighArrivalMovesLayeredLowSleepers(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	lm := newLayeredMemory(t, 10, 1, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 100}})
	s := layeredClassStore{memClassStore{lm.Memory, clk, new(atomic.Bool)}, lm}
	r := newClassRigOn(t, clk, s, s.watched, sleeperOpts)
	r.keys = map[string]string{"per-key": "a"}
	r.wait("first", limiter.PriorityLow, 1)
	r.wait("low1", limiter.PriorityLow, 1) // +100 ms
	r.wait("low2", limiter.PriorityLow, 1) // +200 ms
	r.highArrives(map[string]time.Duration{"first": 0})
}

// floorStore is a classStore whose high takes a floor holds back: after a
// high grant, the next high take is refused (TakeResult.Floor) until
// `every` has passed, with the exact wait.
type floorStore struct {
	*classStore
	every time.Duration
	mu    sync.Mutex
	next  time.Time // the first instant the floor lets a high take through
	highs int       // high takes asked
}

func (s *floorStore) Take(ctx context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	if req.Priority != limiter.PriorityHigh {
		return s.classStore.Take(ctx, req)
	}
	now := s.clk.Now()
	s.mu.Lock()
	s.highs++
	if now.Before(s.next) {
		wait := s.next.Sub(now)
		s.mu.Unlock()
		rate, burst := s.Limits()
		return limiter.TakeResult{Wait: wait, Rate: rate, Burst: burst, At: now, Class: limiter.PriorityHigh, Floor: true}, nil
	}
	s.next = now.Add(s.every)
	s.mu.Unlock()
	return s.classStore.Take(ctx, req)
}

// openLayers is a classStore with one layer that never limits: WaitN
// takes through TakeLayers. take, if set, serves the takes instead of the
// classStore (a floorStore's Take); the classStore can be taken down, and
// WaitN then decides the layers locally.
type openLayers struct {
	*classStore
	take func(context.Context, limiter.TakeRequest) (limiter.TakeResult, error)
}

func (s openLayers) Layers() []limiter.Layer {
	return []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}}
}

func (s openLayers) Take(ctx context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	if s.take != nil {
		return s.take(ctx, req)
	}
	return s.classStore.Take(ctx, req)
}

func (s openLayers) TakeLayers(ctx context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	res, err := s.Take(ctx, limiter.TakeRequest{Cost: req.Cost, Extra: req.Extra, MaxWait: req.MaxWait, Priority: req.Priority, MinShare: req.MinShare})
	return limiter.LayerResult{TakeResult: res}, err
}

func (s openLayers) RefundLayers(ctx context.Context, req limiter.LayerRequest, res limiter.LayerResult) error {
	return s.Refund(ctx, res.Tokens)
}

func (openLayers) DelayLayers(context.Context, limiter.LayerRequest, limiter.LayerResult, time.Time, time.Duration) (bool, error) {
	return true, nil
}

// TestFloorRefusalsQueueTheClass: a floor lets one high take through per
// 100 ms. Five high callers arrive at once: they are granted in order of
// arrival, 100 ms apart, and only the head of the line asks the store
// while the floor holds the class back: 9 high takes (one refused and one
// granted per caller after the first), where every caller asking at each
// turn would make 15. A normal caller meanwhile is not held. The same
// through WaitN on a layered store.
func TestFloorRefusalsQueueTheClass(t *testing.T) {
	for _, layered := range []bool{false, true} {
		t.Run(fmt.Sprint("layered=", layered), func(t *testing.T) {
			clk := clocktest.New(storetest.Base)
			s := &floorStore{classStore: newClassStore(t, clk, 100, 100), every: ms(100)}
			var store limiter.Store = s
			var keys map[string]string
			if layered {
				store, keys = openLayers{s.classStore, s.Take}, map[string]string{"per-key": "a"}
			}
			r := newClassRigOn(t, clk, store, s.watched, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
			r.store, r.keys = s.classStore, keys
			for i := range 5 {
				r.wait(fmt.Sprint("high", i), limiter.PriorityHigh, 1)
			}
			r.wait("normal", limiter.PriorityNormal, 1)
			r.advance(ms(450))
			r.check(map[string]time.Duration{"high0": 0, "high1": ms(100), "high2": ms(200), "high3": ms(300), "high4": ms(400), "normal": 0})
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.highs != 9 {
				t.Fatalf("%d high takes, want 9", s.highs)
			}
		})
	}
}

// TestFloorSharesTheRateOnMemory: on the Memory store at 10/s with
// MinShare{low: 0.5}, six high requests arrive 10 ms after six low ones.
// The high ones jump the low queue only as far as the floor allows: they
// come one per 200 ms, in order of arrival, and the low ones keep the
// other half of the rate meanwhile.
func TestFloorSharesTheRateOnMemory(t *testing.T) {
	opts := sleeperOpts
	opts.MinShare = limiter.Shares{limiter.PriorityLow: 0.5}
	r := newMemClassRig(t, 10, 1, opts)
	for i := range 6 {
		r.wait(fmt.Sprint("low", i), limiter.PriorityLow, 1)
	}
	r.advance(ms(10))
	for i := range 6 {
		r.wait(fmt.Sprint("high", i), limiter.PriorityHigh, 1)
	}
	r.advance(ms(2000))
	// Each high jump moves the low queue back one slot; once the low
	// queue is empty (+1 s), the last high one takes the next slot.
	r.check(map[string]time.Duration{
		"low0": 0, "low1": ms(200), "low2": ms(400), "low3": ms(600), "low4": ms(800), "low5": ms(1000),
		"high0": ms(110), "high1": ms(310), "high2": ms(510), "high3": ms(710), "high4": ms(910), "high5": ms(1101),
	})
}

// TestLocalLayersMoveLowSleepers: the same as TestLocalFallbackMovesLowSleepers
// through WaitN on a layered store, whose layers the fallback decides
// locally too.
func TestLocalLayersMoveLowSleepers(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	cs := newClassStore(t, clk, 10, 1)
	r := newClassRigOn(t, clk, openLayers{classStore: cs}, cs.watched, sleeperOpts)
	r.store, r.keys = cs, map[string]string{"per-key": "a"}
	r.localLowSleepers()
	r.highArrives(nil)
}

// TestRateRiseBringsLayeredReservationsForward: at 2/s, four layered
// callers, each to its own recipient, hold reservations 0.5–2 s ahead
// when the rate is raised to 100/s. They move forward with the shared
// bucket's queue, as plain reservations do, and all come due within
// 40 ms. They used to keep their old instants while the raised bucket
// handed the same tokens out again: with an override set lower and then
// cleared, a fleet with layers delivered 30–41 in a second against 25.
func TestRateRiseBringsLayeredReservationsForward(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	lm := newLayeredMemory(t, 2, 1, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1}})
	s := layeredClassStore{memClassStore{lm.Memory, clk, new(atomic.Bool)}, lm}
	r := newClassRigOn(t, clk, s, s.watched, sleeperOpts)
	for _, name := range []string{"first", "r1", "r2", "r3", "r4"} {
		r.keys = map[string]string{"per-key": name}
		r.wait(name, limiter.PriorityNormal, 1) // +0, +0.5 s, ... +2 s
	}
	r.wake(4, func() {
		if err := lm.SetRateAt(clk.Now(), 100, 1); err != nil {
			t.Fatal(err)
		}
	})
	r.advance(ms(100))
	want := map[string]time.Duration{"first": 0, "r1": ms(10), "r2": ms(20), "r3": ms(30), "r4": ms(40)}
	r.check(want)
}

// TestRateRiseKeepsLayeredSpacing: the same rise does not bring a
// reservation before its key's layer had room. h's second message waits
// on the shared bucket (due at +1.5 s, its key had room at +1 s); raised
// to 100/s, it goes out at +1 s, 1 s after h's first, not at once.
func TestRateRiseKeepsLayeredSpacing(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	lm := newLayeredMemory(t, 2, 1, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1}})
	s := layeredClassStore{memClassStore{lm.Memory, clk, new(atomic.Bool)}, lm}
	r := newClassRigOn(t, clk, s, s.watched, sleeperOpts)
	for _, w := range []struct{ name, key string }{{"h1", "h"}, {"x1", "x"}, {"y1", "y"}} {
		r.keys = map[string]string{"per-key": w.key}
		r.wait(w.name, limiter.PriorityNormal, 1) // +0, +0.5 s, +1 s
	}
	r.advance(ms(500)) // x1 goes out
	r.keys = map[string]string{"per-key": "h"}
	r.wait("h2", limiter.PriorityNormal, 1) // shared: +1.5 s; h had room at +1 s
	r.wake(2, func() {
		if err := lm.SetRateAt(clk.Now(), 100, 1); err != nil {
			t.Fatal(err)
		}
	})
	r.advance(ms(1100))
	r.check(map[string]time.Duration{"h1": 0, "x1": ms(500), "y1": ms(510), "h2": ms(1000)})
}

// TestPushKeepsLayeredSpacing: a high request pushes a low one of sender
// s from +100 ms (what its per-sender layer, 5/s, was charged for) to
// +200 ms. The next message of s, asked for after the push, must still go
// out 200 ms after the pushed one, not 100 ms: the pushed reservation
// charges its layers for the move. Without that, a fleet with classes
// beside a per-sender layer sent one sender's messages 0–61 ms apart
// against 200 ms.
func TestPushKeepsLayeredSpacing(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	lm := newLayeredMemory(t, 10, 1, []limiter.Layer{{Name: "per-sender", Keyed: true, Rate: 5, Burst: 1}})
	s := layeredClassStore{memClassStore{lm.Memory, clk, new(atomic.Bool)}, lm}
	r := newClassRigOn(t, clk, s, s.watched, sleeperOpts)
	as := func(sender string) { r.keys = map[string]string{"per-sender": sender} }
	as("x")
	r.wait("first", limiter.PriorityLow, 1)
	as("s")
	r.wait("l1", limiter.PriorityLow, 1) // +100 ms
	r.advance(ms(10))
	as("y")
	r.wake(1, func() { r.wait("high", limiter.PriorityHigh, 1) }) // takes +100 ms, pushes l1 to +200
	r.advance(ms(10))
	as("s")
	r.wait("l2", limiter.PriorityLow, 1)
	r.advance(ms(700))
	got := r.granted()
	if len(got) != 4 {
		t.Fatalf("granted %v, want 4", got)
	}
	// l1 is pushed back while l2 is decided: whichever notices first goes
	// first (l2 may take +300 ms and l1 be decided again behind it), and
	// either way the two stay the layer's 200 ms apart.
	gap := got["l2"] - got["l1"]
	if gap < 0 {
		gap = -gap
	}
	if gap < ms(199) {
		t.Errorf("sender s: l1 at +%v, l2 at +%v: %v apart, want at least the layer's 200 ms (grants %v)", got["l1"], got["l2"], gap, got)
	}
}

// paidSlotRig is a Bucket on a shared bucket of sharedRate (burst 1) with
// a per-recipient delay layer (1/s, burst 1, lateness 100 ms) whose key r
// holds a booked slot, and behind more booked after it: the clock is late
// past the slot's Due, and a low message to x took the shared token, so
// that the paid message to r, sent by paid, waits on the shared bucket.
type paidSlotRig struct {
	t   *testing.T
	clk *clocktest.Clock
	b   *limiter.Bucket
}

func newPaidSlotRig(t *testing.T, sharedRate float64, late time.Duration, behind int) (*paidSlotRig, <-chan error) {
	clk := clocktest.New(storetest.Base)
	lm := newLayeredMemory(t, sharedRate, 1, []limiter.Layer{{Name: "per-recipient", Keyed: true, Rate: 1, Burst: 1, OnExceed: limiter.ActionDelay}})
	s := layeredClassStore{memClassStore{lm.Memory, clk, new(atomic.Bool)}, lm}
	r := &paidSlotRig{t: t, clk: clk, b: newClockedBucket(t, clk, s, sleeperOpts, s.watched)}
	if err := r.wait(limiter.PriorityLow, "r", nil); err != nil {
		t.Fatal(err)
	}
	var le *limiter.LimitError
	if err := r.wait(limiter.PriorityLow, "r", nil); !errors.As(err, &le) || !le.Reserved {
		t.Fatalf("second message to r: %v, want refused with a booked slot", err)
	}
	for i := range behind {
		var next *limiter.LimitError
		if err := r.wait(limiter.PriorityLow, "r", nil); !errors.As(err, &next) || !next.Reserved {
			t.Fatalf("message %d to r: %v, want refused with a booked slot", i+3, err)
		}
	}
	clk.Advance(le.Wait + late)
	if err := r.wait(limiter.PriorityLow, "x", nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.wait(limiter.PriorityLow, "r", []limiter.PaidSlot{le.Slot()}) }()
	clk.WaitTimers(t, 1) // granted on its slot, waiting on the shared bucket
	return r, done
}

func (r *paidSlotRig) wait(p limiter.Priority, key string, paid []limiter.PaidSlot) error {
	return r.b.WaitN(context.Background(), limiter.Request{Cost: 1, Priority: p, Keys: map[string]string{"per-recipient": key}, Paid: paid})
}

// highs starts n high requests to keys of their own, which push the paid
// message back.
func (r *paidSlotRig) highs(n int) {
	for i := range n {
		go func() { _ = r.wait(limiter.PriorityHigh, fmt.Sprint("h", i), nil) }()
	}
	r.clk.WaitTimers(r.t, n)
}

// sent advances the clock a millisecond at a time until the paid message
// returns, checks it was granted, and returns the instant it went out.
func (r *paidSlotRig) sent(done <-chan error, within time.Duration) time.Time {
	for range within / time.Millisecond {
		time.Sleep(time.Millisecond) // let the sleeper hear the pushes
		r.clk.Advance(time.Millisecond)
		select {
		case err := <-done:
			if err != nil {
				r.t.Fatalf("the pushed paid message: %v, want it sent", err)
			}
			return r.clk.Now()
		default:
		}
	}
	r.t.Fatalf("the pushed paid message was not sent within %v", within)
	return time.Time{}
}

// refusedAgain advances the clock a millisecond at a time until the paid
// message returns, and checks it was refused with a new slot.
func (r *paidSlotRig) refusedAgain(done <-chan error, within time.Duration, what string) {
	for range within / time.Millisecond {
		time.Sleep(time.Millisecond) // let the sleeper hear the pushes
		r.clk.Advance(time.Millisecond)
		select {
		case err := <-done:
			var again *limiter.LimitError
			if !errors.As(err, &again) || !again.Reserved {
				r.t.Fatalf("the pushed paid message: %v, want refused with a new slot", err)
			}
			return
		default:
		}
	}
	r.t.Fatal(what)
}

// TestPushedPaidSlotMovesWithIt: a message back on the slot a delay layer
// booked for it (Request.Paid) waits on the shared bucket, and two high
// requests push it back 200 ms, past the layer's lateness (100 ms at 1/s).
// No other message of its key was charged after it, so the slot moves with
// it: the layer is charged for the move, and the key's next message is
// booked a full second after the moved one went out. Without the charge,
// a fleet with classes sent per-recipient messages 772–834 ms apart
// against 2 s when a rate cut moved them back; forfeiting the slot
// instead cost the key a slot each time, and a message late on every
// slot under load waited in the limiter for a minute.
func TestPushedPaidSlotMovesWithIt(t *testing.T) {
	r, done := newPaidSlotRig(t, 10, 0, 0) // due 100 ms after its slot
	r.highs(2)
	sent := r.sent(done, 400*time.Millisecond)
	var le *limiter.LimitError
	if err := r.wait(limiter.PriorityLow, "r", nil); !errors.As(err, &le) || !le.Reserved {
		t.Fatalf("the next message to r: %v, want refused with a booked slot", err)
	}
	// The layer's 1 s, less its lateness (100 ms), less the 1 ms step on
	// which the send is seen. Left as it was, the layer booked the next
	// slot 800 ms after it.
	if gap := r.clk.Now().Add(le.Wait).Sub(sent); gap < 899*time.Millisecond {
		t.Errorf("the next message to r is booked %v after the moved one went out, want at least 900 ms (1 s less its lateness)", gap)
	}
}

// TestPaidSlotLatenessCountsFromItsDue: a message back 60 ms after its
// slot's Due, granted on it (its send, 40 ms later, is within the slot's
// 100 ms lateness), with the key's next slot booked a second after its
// own, and then pushed 40 ms further by a high request: it would go out
// 140 ms after its slot, 860 ms before the next. Past Due+100 ms, its slot
// cannot move without coming too close to the next one, so it is refused
// again with a new slot, although the push alone was small. Counting the
// lateness from the grant instead let such a message go out up to twice
// the lateness after its slot, 1.6 s before the key's next against 2 s.
func TestPaidSlotLatenessCountsFromItsDue(t *testing.T) {
	r, done := newPaidSlotRig(t, 25, 60*time.Millisecond, 1) // due 40 ms on
	r.highs(1)
	r.refusedAgain(done, 200*time.Millisecond, "the paid message went out 140 ms after its slot, 860 ms before the next slot of its key, want it refused again")
}
