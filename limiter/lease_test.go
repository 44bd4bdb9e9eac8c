package limiter_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// TestLeaseServesCallersInOrder: the callers of one replica are served in
// arrival order, leased or not. At 1000/s, burst 10, one replica, the
// lease batch is 10 tokens. Eight Waits of 1 leave 2 leased tokens; A
// (cost 3) finds them short and leads a refill, reserved 10 ms ahead; B
// (cost 1), arriving after A, used to be served at once from the 2 left,
// ahead of A. Now B queues behind A and both go at +10 ms; C (cost 9)
// then finds 8 left and leads the next refill, due at +20 ms, and D (cost
// 1), behind C, is not served before it.
func TestLeaseServesCallersInOrder(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClockedStore(t, clk, 1000, 10, 1)
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Idle: time.Hour}}, s.watched)
	ctx := context.Background()
	for range 8 {
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu  sync.Mutex
		got []string // "NAME@+MS" in return order
	)
	returned := func(name string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range got {
			if g[:1] == name {
				return true
			}
		}
		return false
	}
	start := func(name string, cost int) {
		go func() {
			if err := b.Wait(ctx, cost); err != nil {
				t.Errorf("Wait(%d) of %s: %v", cost, name, err)
				return
			}
			mu.Lock()
			got = append(got, name+"@+"+clk.Now().Sub(storetest.Base).String())
			mu.Unlock()
		}()
	}
	// The idle timer, then A asleep on its reservation.
	start("A", 3)
	clk.WaitTimers(t, 2)
	start("B", 1)
	if !testenv.Within(5*time.Second, func() bool { return returned("B") || limiter.LeaseWaiting(b) == 1 }) {
		t.Fatal("B neither returned nor queued")
	}
	if returned("B") {
		t.Fatalf("B, arriving after A, was served before it: %v", got)
	}
	start("C", 9)
	testenv.Eventually(t, 5*time.Second, "C queued", func() bool { return limiter.LeaseWaiting(b) == 2 })
	start("D", 1)
	testenv.Eventually(t, 5*time.Second, "D queued", func() bool { return limiter.LeaseWaiting(b) == 3 })

	armed := clk.Armed()
	clk.Advance(10 * time.Millisecond)
	clk.WaitArmed(t, armed+1) // C asleep on the next refill
	testenv.Eventually(t, 5*time.Second, "A and B served", func() bool { return returned("A") && returned("B") })
	if returned("D") {
		t.Fatalf("D, queued behind C, was served before it: %v", got)
	}
	clk.Advance(10 * time.Millisecond)
	testenv.Eventually(t, 5*time.Second, "C and D served", func() bool { return returned("C") && returned("D") })
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		want := map[byte]string{'A': "10ms", 'B': "10ms", 'C': "20ms", 'D': "20ms"}[g[0]]
		if g[3:] != want {
			t.Errorf("%s, want %c at +%s", g, g[0], want)
		}
	}
}

// TestLeaseFollowsDemand: at 1,000,000/s with 100 replicas, a replica
// that asks for 400 tokens/s leases what it spends in the lease period,
// max(10 ms, 100 ÷ 4000 s = 25 ms): 10 tokens, not the 1% of rate ÷
// replicas (100) it used to lease whatever it asked. Its first lease,
// before any demand is measured, is the fair share's: 10,000/s × 25 ms.
func TestLeaseFollowsDemand(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClockedStore(t, clk, 1e6, 1e5, 100)
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Idle: time.Hour}}, s.watched)
	ctx := context.Background()
	if _, err := b.State(ctx); err != nil { // learns the 100 replicas
		t.Fatal(err)
	}
	var batches []int
	for range 100 { // 1 s: 4 tokens every 10 ms
		for range 4 {
			takes, before := s.takes.Load(), s.mem().StatusAt(clk.Now()).Tokens
			if err := b.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if s.takes.Load() != takes {
				batches = append(batches, int(math.Round(before-s.mem().StatusAt(clk.Now()).Tokens)))
			}
		}
		clk.Advance(10 * time.Millisecond)
	}
	if len(batches) < 3 || batches[0] != 250 {
		t.Fatalf("leases %v: want the fair share's 250 first, then more", batches)
	}
	for _, n := range batches[2:] { // the second is sized on the demand's first 100 ms
		if n < 9 || n > 11 {
			t.Fatalf("leases %v: want about 10 tokens (400/s × 25 ms) once the demand is measured", batches)
		}
	}
}

// TestLeaseStaysOnWhereItHelps: at 10,000/s with 100 replicas, leasing
// used to switch itself off (1% of the rate ÷ 100 is 1 token, below its
// minimum batch of 8), leaving the fleet at one Redis call per token. Now
// the batch is the replica's fair share over 100 ÷ 4000 s: 2 tokens; and
// since ten Waits at one instant run each lease dry at once, the next
// doubles: leases of 2, 4 and 8, three calls for ten tokens.
func TestLeaseStaysOnWhereItHelps(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClockedStore(t, clk, 1e4, 1e3, 100)
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Idle: time.Hour}}, s.watched)
	ctx := context.Background()
	if _, err := b.State(ctx); err != nil { // learns the 100 replicas
		t.Fatal(err)
	}
	for range 10 {
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.takes.Load(); n != 3 {
		t.Fatalf("%d store calls for 10 Waits, want 3 (leases of 2, 4 and 8)", n)
	}
}

// TestLeaseCoversTheRoundTrip: at 1,000,000/s with 1,000 replicas, whose
// store calls take 2 s to come back, a replica waits a round trip for each
// batch. Its first lease is the fair share's, 1,000/s × 250 ms = 250
// tokens, spent at once; the next used to double (500), so that the
// replica got 250 tokens/s for seconds while its batches grew. Now it
// covers the fair share over the round trip: 2,000 tokens.
func TestLeaseCoversTheRoundTrip(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	cs := newClockedStore(t, clk, 1e6, 1e5, 1000)
	s := &slowStore{clockedStore: cs}
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Idle: time.Hour}}, cs.watched)
	ctx := context.Background()
	if _, err := b.State(ctx); err != nil { // learns the 1,000 replicas
		t.Fatal(err)
	}
	s.lags.mu.Lock()
	s.lags.d = []time.Duration{2 * time.Second, 2 * time.Second}
	s.lags.mu.Unlock()
	for range 2 {
		timers := clk.Timers()
		done := make(chan error, 1)
		go func() { done <- b.Wait(ctx, 1) }()
		clk.WaitTimers(t, timers+1) // the answer on its way back
		clk.Advance(2 * time.Second)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for range limiter.LeaseTokens(b) {
			if err := b.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.costs) != 2 || s.costs[0] != 250 || s.costs[1] != 2000 {
		t.Fatalf("leases %v, want 250 then 2000", s.costs)
	}
}
