package limiter_test

import (
	"context"
	"fmt"
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
// arrival order, leased or not. At 1000/s, burst 40, one replica, a hold
// of 30 ms (the first batch, from the full bucket, charged as of +30 ms:
// the bucket is empty after it, and no batch's deadline comes before +30
// ms), the lease batch is 10 tokens. Eight Waits of 1 leave 2 leased tokens; A
// (cost 3) finds them short and leads a refill, reserved 10 ms ahead; B
// (cost 1), arriving after A, used to be served at once from the 2 left,
// ahead of A. Now B queues behind A and both go at +10 ms; C (cost 9)
// then finds 8 left and leads the next refill, due at +20 ms, and D (cost
// 1), behind C, is not served before it.
func TestLeaseServesCallersInOrder(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClockedStore(t, clk, 1000, 40, 1)
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Idle: time.Hour, Hold: 30 * time.Millisecond}}, s.watched)
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
	// The idle and the deadline timers, then A asleep on its reservation.
	start("A", 3)
	clk.WaitTimers(t, 3)
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
// replicas (100) it used to lease whatever it asked. Until the demand's
// first 100 ms are measured it leases the fair share's batch, which its
// deadline, 25 ms after the grant (the hold, from a full bucket), cuts
// short: the rest goes back. Its first lease,
// before any demand is measured, is the fair share's: 10,000/s × 25 ms.
func TestLeaseFollowsDemand(t *testing.T) {
	clk, s, b := leasedBucket(t, 1e6, 1e5, 100, limiter.LeaseOptions{Idle: time.Hour}) // learns the 100 replicas
	ctx := context.Background()
	for range 100 { // 1 s: 4 tokens every 10 ms
		for range 4 {
			if err := b.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(10 * time.Millisecond)
	}
	s.mu.Lock()
	batches := append([]int(nil), s.costs...)
	s.mu.Unlock()
	if len(batches) < 6 || batches[0] != 250 {
		t.Fatalf("leases %v: want the fair share's 250 first, then more", batches)
	}
	first := 0 // the leases before the demand was measured
	for first < len(batches) && batches[first] == 250 {
		first++
	}
	if first > 4 {
		t.Fatalf("leases %v: want at most 4 of 250 (100 ms ÷ 25 ms)", batches)
	}
	for _, n := range batches[first:] {
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
	_, s, b := leasedBucket(t, 1e4, 1e3, 100, limiter.LeaseOptions{Idle: time.Hour}) // learns the 100 replicas
	ctx := context.Background()
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
// tokens. The next used to double (500), so that the replica got 250
// tokens/s for seconds while its batches grew; now it covers the fair
// share over the round trip: 2,000 tokens. Each answer, 2 s past its
// deadline, is given back and its caller asks again, without a batch (its
// demand over 2 s is too low for one), and goes out with that answer.
func TestLeaseCoversTheRoundTrip(t *testing.T) {
	clk, s, b := leasedBucket(t, 1e6, 1e5, 1000, limiter.LeaseOptions{Idle: time.Hour}) // learns the 1,000 replicas
	ctx := context.Background()
	s.lags.mu.Lock()
	s.lags.d = []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}
	s.lags.mu.Unlock()
	for _, answers := range []int{2, 1} { // the second's retry has no lag
		armed := clk.Armed()
		done := make(chan error, 1)
		go func() { done <- b.Wait(ctx, 1) }()
		for range answers {
			clk.WaitArmed(t, armed+1) // the answer on its way back
			armed = clk.Armed()
			clk.Advance(2 * time.Second)
		}
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
	if len(s.costs) != 4 || s.costs[0] != 250 || s.costs[1] != 1 || s.costs[2] != 2000 || s.costs[3] != 1 {
		t.Fatalf("costs asked %v, want 250, 1 (asked again), 2000, 1", s.costs)
	}
}

// TestLeaseSpentLateKeepsTheWindow: at 1,000/s, burst 100, one replica,
// the lease batch is 10 tokens and its hold 10 ms (the lease period). A
// lease taken at +0 from the full bucket spends 1 token then, and its
// other 9 at +9 ms, while another replica takes every token the bucket
// holds, at +9 ms and every 10 ms after. The tokens out in the second from
// +9 ms used to be 1,108, above rate + burst (the lease was charged at +0,
// and the bucket refilled to its burst meanwhile): 9 + 99 + 1,000. Charged
// as of +10 ms, the lease leaves the other replica 89: 1,098.
func TestLeaseSpentLateKeepsTheWindow(t *testing.T) {
	clk, s, b := leasedBucket(t, 1000, 100, 1, limiter.LeaseOptions{Idle: time.Hour})
	ctx := context.Background()
	if err := b.Wait(ctx, 1); err != nil { // the lease, at +0
		t.Fatal(err)
	}
	clk.Advance(9 * time.Millisecond)
	out := 0 // tokens out from +9 ms to +1009 ms
	for range 9 {
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
		out++
	}
	if n := s.takes.Load(); n != 1 {
		t.Fatalf("%d store calls, want 1: the 9 tokens come from the lease", n)
	}
	other := func() int { // the other replica takes what the bucket holds
		m := s.mem()
		n := int(math.Floor(m.StatusAt(clk.Now()).Tokens + 1e-9))
		if n < 1 {
			return 0
		}
		res, err := m.TakeAt(clk.Now(), limiter.TakeRequest{Cost: n})
		if err != nil || !res.Granted {
			t.Fatalf("take %d: %+v, %v", n, res, err)
		}
		return n
	}
	out += other()
	for range 100 {
		clk.Advance(10 * time.Millisecond)
		out += other()
	}
	if out > 1100 {
		t.Fatalf("%d tokens out in the second from +9 ms, want at most rate + burst = 1100", out)
	}
}

// TestLeasePastItsDeadlineGoesBack: the lease of
// TestLeaseSpentLateKeepsTheWindow (10 tokens at +0 from the full bucket,
// 1 spent, a hold of 10 ms) has its other 9 tokens given back at +10 ms,
// its deadline, and a caller at +15 ms asks the store: they used to stay
// leased, without use, for Idle.
func TestLeasePastItsDeadlineGoesBack(t *testing.T) {
	clk, s, b := leasedBucket(t, 1000, 100, 1, limiter.LeaseOptions{Idle: time.Hour})
	ctx := context.Background()
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(15 * time.Millisecond)
	testenv.Eventually(t, 5*time.Second, "the 9 leased tokens given back", func() bool { return s.refunded.Load() == 9 })
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := s.takes.Load(); n != 2 {
		t.Fatalf("%d store calls, want 2: the lease's tokens past its deadline do not go out", n)
	}
}

// TestLateLeaseKeepsWhatFits: at 1,000/s, burst 100, one replica, a hold
// of 2 ms, another replica leaves 40 tokens; a lease of 10 takes them down
// to 30, and its answer comes back 66 ms late. Past its grant by that much,
// the bucket holding the 10 would have refilled past its burst (30 + 10 +
// 65 > 100): only 5 could still go out, 3 of them for the hold. It keeps
// those 3 (its caller's 1 among them) and gives back the other 7, without
// asking again. A lease's late answer used to go out whole.
func TestLateLeaseKeepsWhatFits(t *testing.T) {
	clk, s, b := leasedBucket(t, 1000, 100, 1, limiter.LeaseOptions{Idle: time.Hour, Hold: 2 * time.Millisecond}, 66*time.Millisecond)
	ctx := context.Background()
	if _, err := s.mem().TakeAt(clk.Now(), limiter.TakeRequest{Cost: 60}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx, 1) }()
	clk.WaitTimers(t, 1) // the answer on its way back
	clk.Advance(66 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, r, left := s.takes.Load(), s.refunded.Load(), limiter.LeaseTokens(b); n != 1 || r != 7 || left != 2 {
		t.Fatalf("%d store calls, %d tokens given back, %d leased; want 1, 7 and 2", n, r, left)
	}
}

// leasedBucket returns a Bucket leasing with opts on a clocked store of
// rate, burst and replicas whose answers lag by lags in turn (slowStore),
// once its State has learnt the replicas.
func leasedBucket(t *testing.T, rate float64, burst int, replicas int, opts limiter.LeaseOptions, lags ...time.Duration) (*clocktest.Clock, *slowStore, *limiter.Bucket) {
	t.Helper()
	clk := clocktest.New(storetest.Base)
	cs := newClockedStore(t, clk, rate, burst, replicas)
	s := &slowStore{clockedStore: cs, lags: answerLags{d: lags}}
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: opts}, cs.watched)
	if _, err := b.State(context.Background()); err != nil {
		t.Fatal(err)
	}
	return clk, s, b
}

// reservedRefill runs one refill of b's lease at a saturated bucket of
// 1,000,000/s: the other replicas take what the bucket holds and reserve
// debt tokens more; a caller of b then finds its lease dry and leads a
// refill, which the store reserves behind them, and queued more callers
// queue behind it; the clock moves to the refill's slot (1 token/µs), and
// once they return, b's lease is spent at once.
func reservedRefill(t *testing.T, clk *clocktest.Clock, s *slowStore, b *limiter.Bucket, debt, queued int) {
	t.Helper()
	ctx := context.Background()
	m := s.mem()
	takes := []int{int(math.Floor(m.StatusAt(clk.Now()).Tokens + 1e-9))}
	for left := debt; left > 0; left -= 50_000 { // each take within the burst
		takes = append(takes, min(left, 50_000))
	}
	for _, n := range takes {
		if n <= 0 {
			continue
		}
		if res, err := m.TakeAt(clk.Now(), limiter.TakeRequest{Cost: n, MaxWait: time.Second}); err != nil || !res.Granted {
			t.Fatalf("the others' take of %d: %+v, %v", n, res, err)
		}
	}
	done := make(chan error, 1+queued)
	go func() { done <- b.Wait(ctx, 1) }()
	// The refill reserved behind the others', its caller asleep until
	// then; the lease's own timers (AfterFunc) may arm meanwhile.
	clk.WaitSleepers(t, 1)
	for range queued {
		go func() { done <- b.Wait(ctx, 1) }()
	}
	testenv.Eventually(t, 5*time.Second, "callers queued behind the refill", func() bool { return limiter.LeaseWaiting(b) == queued })
	s.mu.Lock()
	asked := s.costs[len(s.costs)-1]
	s.mu.Unlock()
	clk.Advance(time.Duration(debt+asked) * time.Microsecond)
	for range 1 + queued {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range limiter.LeaseTokens(b) { // dry at once
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWastedLeaseDoesNotDouble: at 1,000,000/s with 1,000 replicas (a
// lease period of 250 ms, a hold of 25 ms), a replica asks for a token
// every 50 ms. Its first lease, the fair share's 250 tokens, goes back
// but 1 at its deadline, +25 ms; the caller at +50 ms finds the lease
// empty, 50 ms after the refill. Taking that for a lease short of tokens,
// its batches used to double while they went back unspent: 250, 500,
// 1,000, ... 10,000 (given back while a saturated bucket queues, such
// tokens are lost). A lease whose tokens went back unspent since its last
// refill now covers its demand: the fair share's until the demand is
// measured (+100 ms), then 20 to 30 tokens/s × 250 ms.
func TestWastedLeaseDoesNotDouble(t *testing.T) {
	t.Parallel()
	clk, s, b := leasedBucket(t, 1e6, 1e5, 1000, limiter.LeaseOptions{Idle: time.Hour})
	ctx := context.Background()
	for range 10 {
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(50 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.costs) != 10 || s.costs[0] != 250 || s.costs[1] != 250 {
		t.Fatalf("leases %v: want one per Wait, the first two of 250", s.costs)
	}
	for _, n := range s.costs[2:] {
		if n < 5 || n > 8 {
			t.Fatalf("leases %v: want 5 to 8 tokens (20 to 30/s × 250 ms) once the demand is measured", s.costs)
		}
	}
}

// TestSaturatedLeaseStaysNearItsShare: while the store reserves every
// refill (the other replicas keep the bucket in debt), a lease that runs
// dry at once grows to twice its fair share of a period and no further:
// at 1,000,000/s among 100 replicas, 10,000/s × 25 ms × 2 = 500 tokens.
// Doubling up to MaxBatch instead had every replica reserve 10,000-token
// batches, a second of reservations queued ahead of each caller.
func TestSaturatedLeaseStaysNearItsShare(t *testing.T) {
	clk, s, b := leasedBucket(t, 1e6, 1e5, 100, limiter.LeaseOptions{Idle: time.Hour}) // learns the 100 replicas
	for range 8 {
		reservedRefill(t, clk, s, b, 1000, 0) // the others reserve 1,000 tokens ahead of each refill
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.costs[0] != 250 {
		t.Fatalf("leases asked %v: want the fair share's 250 first", s.costs)
	}
	for _, n := range s.costs {
		if n > 500 {
			t.Fatalf("leases asked %v: want none above 500 (twice the fair share of 25 ms) while the store reserves them", s.costs)
		}
	}
}

// TestSaturatedShortLeaseAsksItsShare: at 1,000,000/s among 1,000
// replicas (a lease period of 250 ms, a fair share of 250 tokens a
// period), a replica whose demand was measured low (a token every 50 ms:
// batches of 5 to 8) then has three callers on each refill, its leader
// and two queued behind it, and runs dry at once after it, while the
// other replicas keep the bucket 200 ms in debt, so that the store
// reserves every refill. Its batches used to double from there, 10, 20,
// 40, ...: a reservation per step, its callers served a few tokens a
// reservation. The scale benchmark (1,000 replicas, 1,000,000/s) found
// replicas in that state refilling 1 to 22 tokens at a time, and the
// least replica share at 0.01 to 0.03 of the mean. Now a lease whose
// callers queue for refills that the store reserves asks for at least its
// fair share at once, and no more than twice it.
func TestSaturatedShortLeaseAsksItsShare(t *testing.T) {
	t.Parallel()
	clk, s, b := leasedBucket(t, 1e6, 1e5, 1000, limiter.LeaseOptions{Idle: time.Hour}) // learns the 1,000 replicas
	ctx := context.Background()
	for range 20 { // a low demand, measured: 20/s
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(50 * time.Millisecond)
	}
	s.mu.Lock()
	low := len(s.costs)
	s.mu.Unlock()
	for range 6 {
		reservedRefill(t, clk, s, b, 200_000, 2) // 200 ms of the others' reservations ahead; two callers behind the leader
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	saturated := s.costs[low:]
	if len(saturated) != 6 || saturated[0] > 10 {
		t.Fatalf("leases asked %v, saturated %v: want 6 refills, the first sized by the low demand", s.costs, saturated)
	}
	for _, n := range saturated[1:] {
		if n < 250 || n > 500 {
			t.Fatalf("leases asked while saturated %v: want the first sized by the low demand, then 250 (the fair share of 250 ms) to 500", saturated)
		}
	}
}

// TestSaturatedLeaseCapsItsDemand: at 1,000,000/s among 1,000 replicas
// (a lease period of 250 ms, a fair share of 250 tokens a period), a
// replica that spent 100,000 tokens/s for 200 ms while the bucket still
// granted at once sized its batches by that demand, 10,000 tokens (the
// cap), and kept doing so once the others kept the bucket in debt and the
// store reserved every refill (10,000, 10,000, 10,000, 8,849, 10,000).
// In the scale benchmark's unequal demand, 100 saturated replicas and
// 900 asking 20 tokens/s, the 900 got about 6 tokens/s each: their
// waits were reservations behind such batches. Now, while the store
// reserves its refills, a replica's batch is at most twice its fair share
// of a period, whatever its demand.
func TestSaturatedLeaseCapsItsDemand(t *testing.T) {
	t.Parallel()
	clk, s, b := leasedBucket(t, 1e6, 1e5, 1000, limiter.LeaseOptions{Idle: time.Hour}) // learns the 1,000 replicas
	ctx := context.Background()
	for range 20 { // 1,000 tokens every 10 ms: 100,000/s, from a bucket that grants at once
		for range 1000 {
			if err := b.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(10 * time.Millisecond)
	}
	// Past the last batch's deadline: its tokens lapse. The demand of
	// the last 500 ms is still 40,000/s.
	clk.Advance(300 * time.Millisecond)
	s.mu.Lock()
	unsaturated := len(s.costs)
	s.mu.Unlock()
	for range 5 {
		reservedRefill(t, clk, s, b, 200_000, 0) // 200 ms of the others' reservations ahead
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	saturated := s.costs[unsaturated:]
	if len(saturated) != 5 || saturated[0] < 10000 {
		t.Fatalf("leases asked %v, saturated %v: want 5 refills, the first sized by the demand (10,000, the cap)", s.costs, saturated)
	}
	for _, n := range saturated[1:] {
		if n > 500 {
			t.Fatalf("leases asked while the store reserves them %v: want the first sized by the demand, then at most 500 (twice the fair share of 250 ms)", saturated)
		}
	}
}

// TestDrainingBucketLeaseStaysNearItsShare: while a bucket still grants
// refills at once but is nearly drained, a lease that runs dry at once
// grows only as far as its share of what the bucket held after its last
// refill, and at least to twice its fair share of a period: at
// 1,000,000/s among 100 replicas, with the other replicas leaving 3,000
// tokens before each refill, 500 tokens. Its batches used to double,
// 250, 500, 1,000, 2,000 and then 4,000, reserved once the bucket no
// longer held them: at a fleet's start, where every replica's batches
// doubled while the full bucket drained, every caller then waited 75 to
// 123 ms behind the others' large reservations (the scale benchmark, 100
// replicas: worst wait 103 to 123 ms before, 54 to 98 ms after).
func TestDrainingBucketLeaseStaysNearItsShare(t *testing.T) {
	clk, s, b := leasedBucket(t, 1e6, 1e5, 100, limiter.LeaseOptions{Idle: time.Hour}) // learns the 100 replicas
	ctx := context.Background()
	const left = 3000 // what the other replicas leave before each refill
	done := make(chan error, 1)
	go func() {
		for range 6 {
			m := s.mem()
			if n := int(math.Floor(m.StatusAt(clk.Now()).Tokens+1e-9)) - left; n > 0 {
				if res, err := m.TakeAt(clk.Now(), limiter.TakeRequest{Cost: n, MaxWait: time.Second}); err != nil || !res.Granted {
					done <- fmt.Errorf("the others' take of %d: %+v, %v", n, res, err)
					return
				}
			}
			for range 1 + limiter.LeaseTokens(b) { // what is left, then one more: a refill
				if err := b.Wait(ctx, 1); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second): // a refill reserved: it sleeps on the test's clock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.costs) != 6 || s.costs[0] != 250 {
		t.Fatalf("leases asked %v: want 6, the fair share's 250 first", s.costs)
	}
	for _, n := range s.costs {
		if n > 500 {
			t.Fatalf("leases asked %v: want none above 500 (twice the fair share of 25 ms, more than 3,000 ÷ 100 replicas) while the bucket nearly drained", s.costs)
		}
	}
}
