package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// fairClocked is layeredClocked with fair shares, counting its
// TakeLayers calls.
type fairClocked struct {
	*layeredClocked
	takes atomic.Int64
	asked chan struct{} // a send after each TakeLayers, when not nil
}

func newFairClocked(t *testing.T, clk *clocktest.Clock, rate float64, burst int, fair limiter.Fair) *fairClocked {
	t.Helper()
	s := &fairClocked{layeredClocked: newLayeredClocked(t, clk, rate, burst, 1)}
	if err := s.m.SetFair(fair); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *fairClocked) Fair() *limiter.Fair { return s.m.Fair() }

func (s *fairClocked) TakeLayers(ctx context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	s.takes.Add(1)
	res, err := s.layeredClocked.TakeLayers(ctx, req)
	if s.asked != nil {
		s.asked <- struct{}{}
	}
	return res, err
}

// fairRefusal returns err's *limiter.LimitError when it is a refusal by
// the fair share, else nil.
func fairRefusal(err error) *limiter.LimitError {
	var le *limiter.LimitError
	if errors.As(err, &le) && le.Layer == limiter.FairLayer && le.Action == limiter.ActionDelay {
		return le
	}
	return nil
}

// TestFairBucketShares: on an in-process store at 200/s, 100 callers of
// tenant a and 100 of tenant b (weight 3) that never stop share the rate
// 1:3, where without fair shares they would share it by callers. The
// callers start one at a time, a's and b's in turn; the clock moves in
// steps of 10 ms once every caller is asleep (on its reservation or its
// share), and the shares are counted over 2 s after a warm-up of 0.5 s.
func TestFairBucketShares(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newFairClocked(t, clk, 200, 1, limiter.Fair{Weights: map[string]float64{"b": 3}})
	b := newLayeredBucket(t, clk, s)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	const callers = 100
	for i := range 2 * callers {
		tenant := []string{"a", "b"}[i%2]
		wg.Go(func() {
			for ctx.Err() == nil {
				if b.WaitN(ctx, limiter.Request{Cost: 1, Tenant: tenant}) == nil {
					mu.Lock()
					got[tenant]++
					mu.Unlock()
				}
			}
		})
		clk.WaitTimers(t, i+1)
	}
	step := func(n int) {
		for range n {
			clk.Advance(10 * time.Millisecond)
			// The callers woken sleep again, each on a new timer.
			clk.WaitTimers(t, 2*callers)
		}
	}
	count := func() (a, b int) {
		mu.Lock()
		defer mu.Unlock()
		return got["a"], got["b"]
	}
	step(50)
	a0, b0 := count()
	step(200)
	a1, b1 := count()
	cancel()
	wg.Wait()
	a, bb := a1-a0, b1-b0
	share := float64(bb) / float64(a+bb)
	t.Logf("over 2 s: a %d, b %d: b's share %.3f", a, bb, share)
	if a+bb < 395 || a+bb > 401 {
		t.Errorf("granted %d in 2 s at 200/s, want 400", a+bb)
	}
	if share < 0.72 || share > 0.78 {
		t.Errorf("b's share = %.3f, want 0.75 ± 0.03", share)
	}
}

// TestFairBurstLeavesOthersTheirRate: on an in-process store at 200/s,
// 100 callers each asking for the next of 1,000 tenants keep the bucket
// saturated; 100 callers of one more tenant, as many as all the others
// together, join. That tenant gets its share as one tenant among the
// waiting ones (about 1 in 101 grants) and the others keep the rest,
// where without fair shares the rate splits by callers, half each. The
// clock moves as in TestFairBucketShares; the grants are counted over 2 s
// after a warm-up of 0.5 s.
func TestFairBurstLeavesOthersTheirRate(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newFairClocked(t, clk, 200, 1, limiter.Fair{})
	b := newLayeredBucket(t, clk, s)
	ctx, cancel := context.WithCancel(context.Background())
	var others, burst, next atomic.Int64
	var wg sync.WaitGroup
	const callers = 100
	for i := range 2 * callers {
		isBurst := i >= callers
		wg.Go(func() {
			for ctx.Err() == nil {
				tenant := "burst"
				if !isBurst {
					tenant = fmt.Sprintf("t%03d", next.Add(1)%1000)
				}
				if b.WaitN(ctx, limiter.Request{Cost: 1, Tenant: tenant}) != nil {
					continue
				}
				if isBurst {
					burst.Add(1)
				} else {
					others.Add(1)
				}
			}
		})
		clk.WaitTimers(t, i+1)
	}
	step := func(n int) {
		for range n {
			clk.Advance(10 * time.Millisecond)
			clk.WaitTimers(t, 2*callers)
		}
	}
	step(50)
	o0, b0 := others.Load(), burst.Load()
	step(200)
	o, bb := others.Load()-o0, burst.Load()-b0
	cancel()
	wg.Wait()
	share := float64(o) / float64(o+bb)
	t.Logf("over 2 s: the others %d, the burst's tenant %d: the others' share %.3f", o, bb, share)
	if o+bb < 395 || o+bb > 401 {
		t.Errorf("granted %d in 2 s at 200/s, want 400", o+bb)
	}
	if share < 0.95 {
		t.Errorf("the others' share = %.3f with one tenant's burst, want ≥ 0.95 (one tenant among 101)", share)
	}
	if bb == 0 {
		t.Error("the burst's tenant got nothing in 2 s, want its share")
	}
}

// tenantBurstSpent returns a fair bucket of 10/s, burst 1, whose 100 ms
// horizon gives tenant a a share of 1 token, on a fake clock, with the
// burst's token already spent by a's request req (FairWaiting waiting).
func tenantBurstSpent(t *testing.T, waiting int) (*clocktest.Clock, *fairClocked, *limiter.Bucket, limiter.Request) {
	t.Helper()
	clk := clocktest.New(storetest.Base)
	s := newFairClocked(t, clk, 10, 1, limiter.Fair{Horizon: 100 * time.Millisecond})
	b := newLayeredBucket(t, clk, s)
	req := limiter.Request{Cost: 1, Tenant: "a", FairWaiting: waiting}
	if err := b.WaitN(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	return clk, s, b, req
}

// TestFairGrantedLeavesTenantWaiting: a request that waited for its
// tenant's share and is then granted, waiting for its reservation, no
// longer counts among the tenant's FairWaiting, so that the tenant's next
// request may wait for the share rather than be refused (it was counted
// until it went out, and a tenant could book only FairWaiting
// reservations at a time per replica, below its share).
func TestFairGrantedLeavesTenantWaiting(t *testing.T) {
	clk, _, b, req := tenantBurstSpent(t, 1)
	ctx := context.Background()
	first := waitN(b, ctx, req) // reserved, due at 100 ms
	clk.WaitTimers(t, 1)
	second := waitN(b, ctx, req) // over a's share: waits for it until 100 ms
	clk.WaitTimers(t, 2)
	clk.Advance(100 * time.Millisecond)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// second is granted at 100 ms, its reservation due at 200 ms.
	clk.WaitTimers(t, 1)
	third := waitN(b, ctx, req)
	clk.WaitTimers(t, 2)
	select {
	case err := <-third:
		t.Fatalf("a's third request at 100 ms = %v, want it waiting for a's share (the second is granted and no longer waits for it)", err)
	default:
	}
	clk.Advance(100 * time.Millisecond)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	clk.WaitTimers(t, 1)
	clk.Advance(100 * time.Millisecond)
	if err := <-third; err != nil {
		t.Fatalf("a's third request = %v, want granted at 300 ms", err)
	}
}

// TestFairHeldBackWithoutStore: while FairWaiting of a tenant's requests
// wait for its share, a further request of the tenant is refused for its
// share without a store call, with the wait until the room the store
// announced and the waiting ones' turns (a spacing each) after it, and the
// tenant's spacing; once none waits, the store decides again.
func TestFairHeldBackWithoutStore(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	// 10/s, burst 1; a's share of a 200 ms horizon is 2 tokens.
	s := newFairClocked(t, clk, 10, 1, limiter.Fair{Horizon: 200 * time.Millisecond})
	b := newLayeredBucket(t, clk, s)
	ctx := context.Background()
	req := limiter.Request{Cost: 1, Tenant: "a", FairWaiting: 1}
	if err := b.WaitN(ctx, req); err != nil { // the burst's token
		t.Fatal(err)
	}
	r1 := waitN(b, ctx, req) // reserved, due at 100 ms
	clk.WaitTimers(t, 1)
	r2 := waitN(b, ctx, req) // at 200 ms
	clk.WaitTimers(t, 2)
	waiting := waitN(b, ctx, req) // over a's share until 100 ms
	clk.WaitTimers(t, 3)
	calls := s.takes.Load()
	// At 50 ms: refused, not asked.
	clk.Advance(50 * time.Millisecond)
	err := b.WaitN(ctx, req)
	le := fairRefusal(err)
	if le == nil {
		t.Fatalf("a's request at 50 ms = %v, want a refusal by the fair share", err)
	}
	if n := s.takes.Load() - calls; n != 0 {
		t.Errorf("store calls for the refusal = %d, want 0", n)
	}
	if le.Wait != 150*time.Millisecond || le.Spacing != 100*time.Millisecond {
		t.Errorf("refusal's wait %v, spacing %v; want 150ms (the room at 100 ms, then the waiting one's turn) and 100ms (a's pace at 10/s)", le.Wait, le.Spacing)
	}
	// Another tenant is asked as usual.
	other := waitN(b, ctx, limiter.Request{Cost: 1, Tenant: "b", FairWaiting: 1})
	clk.WaitTimers(t, 4)
	if n := s.takes.Load() - calls; n != 1 {
		t.Errorf("store calls for b's request = %d, want 1", n)
	}
	// At 100 ms the waiting request asks again and waits for a's share
	// until 200 ms (r2 due): still refused without a call.
	clk.Advance(50 * time.Millisecond)
	if err := <-r1; err != nil {
		t.Fatal(err)
	}
	clk.WaitTimers(t, 3) // r2, b's reservation, and the waiting one's
	calls = s.takes.Load()
	if err := b.WaitN(ctx, req); fairRefusal(err) == nil {
		t.Fatalf("a's request at 100 ms = %v, want a refusal by the fair share", err)
	}
	if n := s.takes.Load() - calls; n != 0 {
		t.Errorf("store calls for a's request at 100 ms = %d, want 0", n)
	}
	// At 200 ms the waiting request is granted (due at 400 ms): none of
	// a's waits for the share, and the store decides a's next request,
	// which waits for the share.
	clk.Advance(100 * time.Millisecond)
	if err := <-r2; err != nil {
		t.Fatal(err)
	}
	clk.WaitTimers(t, 2)
	calls = s.takes.Load()
	next := waitN(b, ctx, req)
	clk.WaitTimers(t, 3)
	if n := s.takes.Load() - calls; n != 1 {
		t.Errorf("store calls for a's request at 200 ms = %d, want 1", n)
	}
	for _, c := range []<-chan error{other, waiting} {
		clk.Advance(100 * time.Millisecond)
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	// next: granted at 400 ms, due at 500 ms.
	clk.WaitTimers(t, 1)
	clk.Advance(100 * time.Millisecond)
	if err := <-next; err != nil {
		t.Fatal(err)
	}
}

// TestFairWaitersAskInTurn: a tenant's requests waiting for its share ask
// the store one at a time: at each room the first asks and, granted,
// hands the turn to the next, which sleeps until the room a spacing later
// without a call (it asked at once to learn it: 7 calls), unless the
// store's last answer is a horizon old. Four waiting requests cost 5
// calls for their 4 grants, where every waiting request asked at every
// room (up to 4 + 3 + 2 + 1 = 10).
func TestFairWaitersAskInTurn(t *testing.T) {
	clk, s, b, req := tenantBurstSpent(t, 4)
	ctx := context.Background()
	s.asked = make(chan struct{}, 100)
	done := make(chan error, 5)
	for i := range 5 { // the first reserved, due at 100 ms; then 4 wait for a's share
		go func() { done <- b.WaitN(ctx, req) }()
		if i < 2 { // the others queue behind the first waiting one without a call
			<-s.asked
		}
		if !testenv.Within(10*time.Second, func() bool { return limiter.FairQueued(b, "a") == i }) {
			t.Fatalf("%d of a's requests wait for its share, want %d", limiter.FairQueued(b, "a"), i)
		}
	}
	clk.WaitTimers(t, 2) // the reservation, the first waiting one's room
	calls := s.takes.Load()
	within := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s at %v", what, clk.Now().Sub(storetest.Base))
		}
	}
	// At each room (100 ms to 400 ms) one request goes out and the first
	// waiting one is granted: one call, then the two timers (the
	// reservation, the next one's room, a's spacing later). At 200 ms the
	// store's last answer (at 0) is a horizon old: the next one asks at
	// once for the next room, a second call.
	for _, step := range []struct{ asks, timers int }{{1, 2}, {2, 2}, {1, 2}, {1, 1}, {0, 0}} {
		clk.Advance(100 * time.Millisecond)
		out := make(chan struct{})
		go func() {
			if err := <-done; err != nil {
				t.Error(err)
			}
			close(out)
		}()
		within("request out", out)
		for range step.asks {
			within("store call", s.asked)
		}
		clk.WaitTimers(t, step.timers)
	}
	if n := s.takes.Load() - calls; n != 5 {
		t.Errorf("store calls for the 4 waiting requests = %d, want 5", n)
	}
}

// TestFairJoinsWaitersWithoutAsking: a tenant's request that comes while
// fewer than FairWaiting of its requests wait for its share queues behind
// them without a store call (the first of them asks at the tenant's next
// room, so the store could only make it wait too), and goes out in its
// turn. Before, each such request asked once to be told to wait.
func TestFairJoinsWaitersWithoutAsking(t *testing.T) {
	clk, s, b, req := tenantBurstSpent(t, 4)
	ctx := context.Background()
	r1 := waitN(b, ctx, req) // reserved, due at 100 ms
	clk.WaitTimers(t, 1)
	r2 := waitN(b, ctx, req) // over a's share until 100 ms: waits for it
	clk.WaitTimers(t, 2)
	calls := s.takes.Load()
	// At 50 ms two more of a's requests queue behind it: no call.
	clk.Advance(50 * time.Millisecond)
	var r34 [2]<-chan error
	for i := range r34 {
		r34[i] = waitN(b, ctx, req)
		if !testenv.Within(10*time.Second, func() bool { return limiter.FairQueued(b, "a") == 2+i }) {
			t.Fatalf("%d of a's requests wait for its share, want %d", limiter.FairQueued(b, "a"), 2+i)
		}
	}
	r3, r4 := r34[0], r34[1]
	if n := s.takes.Load() - calls; n != 0 {
		t.Errorf("store calls for the 2 requests queued behind the waiting one = %d, want 0", n)
	}
	// Then each goes out in its turn, one room (100 ms) apart: at each,
	// the first waiting one is granted, and the next one waits for the
	// room after it (at 200 ms the store's last answer is a horizon old:
	// it asks at once to learn it).
	s.asked = make(chan struct{}, 100)
	clk.Advance(50 * time.Millisecond)
	for i, step := range []struct {
		c            <-chan error
		asks, timers int
	}{{r1, 1, 2}, {r2, 2, 2}, {r3, 1, 1}, {r4, 0, 0}} {
		select {
		case err := <-step.c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d not out at %v", i+1, clk.Now().Sub(storetest.Base))
		}
		for range step.asks {
			select {
			case <-s.asked:
			case <-time.After(10 * time.Second):
				t.Fatalf("no store call after request %d out", i+1)
			}
		}
		clk.WaitTimers(t, step.timers)
		clk.Advance(100 * time.Millisecond)
	}
}
