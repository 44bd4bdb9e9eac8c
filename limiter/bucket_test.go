package limiter_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// flakyStore wraps a Store and fails every call while down is set.
type flakyStore struct {
	limiter.Store
	down atomic.Bool
}

var errDown = &limiter.StoreError{Op: "take", Bucket: "t", Err: errors.New("connection refused")}

func (f *flakyStore) Take(ctx context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	if f.down.Load() {
		return limiter.TakeResult{}, errDown
	}
	return f.Store.Take(ctx, req)
}

func (f *flakyStore) Status(ctx context.Context) (limiter.State, error) {
	if f.down.Load() {
		return limiter.State{}, errDown
	}
	return f.Store.Status(ctx)
}

func newFlaky(t *testing.T, rate float64, burst int) *flakyStore {
	t.Helper()
	m, err := limiter.NewMemory(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return &flakyStore{Store: m}
}

// modeLog records the Observer's mode transitions.
type modeLog struct {
	mu   sync.Mutex
	seen []string
}

func (l *modeLog) observer() *limiter.Observer {
	return &limiter.Observer{ModeChanged: func(from, to limiter.Mode, _ error) {
		l.mu.Lock()
		l.seen = append(l.seen, string(from)+">"+string(to))
		l.mu.Unlock()
	}}
}

func (l *modeLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

func waitForMode(t *testing.T, b *limiter.Bucket, want limiter.Mode) {
	t.Helper()
	if !testenv.Within(2*time.Second, func() bool { return b.Mode() == want }) {
		t.Fatalf("mode = %s, want %s", b.Mode(), want)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	m, _ := limiter.NewMemory(1, 1)
	for _, o := range []limiter.Options{
		{OnStoreError: "sometimes"},
		{FallbackRate: -1},
		{Lease: limiter.LeaseOptions{Fraction: 2}},
	} {
		if _, err := limiter.New(m, o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
	if _, err := limiter.New(nil, limiter.Options{}); err == nil {
		t.Error("New(nil store) succeeded")
	}
	if _, err := limiter.NewMemory(0, 1); err == nil {
		t.Error("NewMemory(rate 0) succeeded")
	}
}

func TestWaitRejectsBadCosts(t *testing.T) {
	b, err := limiter.NewLocal(10, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.Wait(ctx, 0); !errors.Is(err, limiter.ErrInvalidCost) {
		t.Errorf("Wait(0) = %v", err)
	}
	if err := b.Wait(ctx, 3); !errors.Is(err, limiter.ErrCostExceedsBurst) {
		t.Errorf("Wait(3) with burst 2 = %v", err)
	}
	if _, err := b.Allow(ctx, 3); !errors.Is(err, limiter.ErrCostExceedsBurst) {
		t.Errorf("Allow(3) with burst 2 = %v", err)
	}
}

func TestAllowAndState(t *testing.T) {
	b, err := limiter.NewLocal(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		ok, err := b.Allow(ctx, 1)
		if err != nil || ok != want {
			t.Fatalf("Allow #%d = %v, %v; want %v", i, ok, err, want)
		}
	}
	st, err := b.State(ctx)
	if err != nil || st.Burst != 2 || st.Rate != 1 || st.Tokens > 0.1 || st.Mode != limiter.ModeShared {
		t.Fatalf("State = %+v, %v", st, err)
	}
}

// TestWaitSleepsExactlyTheReservation: at 20/s, burst 1, three callers
// return at +0 (the burst), +50 and +100 ms, each when its reservation is
// due, on the Bucket's clock.
func TestWaitSleepsExactlyTheReservation(t *testing.T) {
	r := newRig(t, 20, 1, 1, limiter.Options{})
	for range 3 { // 1 from the burst, then 2 at 50 ms each
		r.wait(1)
	}
	r.advance(ms(100))
	if got, want := r.grants(), []time.Duration{0, ms(50), ms(100)}; !equalDurations(got, want) {
		t.Fatalf("3 tokens at 20/s burst 1 granted at %v, want %v", got, want)
	}
}

// TestPauseDelaysEveryWaiter: a caller that comes during a 150 ms pause
// returns when the pause ends, not before.
func TestPauseDelaysEveryWaiter(t *testing.T) {
	r := newRig(t, 1000, 10, 1, limiter.Options{})
	ctx := context.Background()
	if err := r.b.Pause(ctx, ms(150)); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.b.State(ctx); st.Rate != 0 || st.PausedFor <= 0 {
		t.Fatalf("State while paused = %+v", st)
	}
	r.wait(1)
	r.advance(ms(149))
	if g := r.grants(); len(g) != 0 {
		t.Fatalf("Wait during a 150ms pause returned at %v", g)
	}
	r.advance(ms(10))
	if got, want := r.grants(), []time.Duration{ms(150)}; !equalDurations(got, want) {
		t.Fatalf("Wait during a 150ms pause returned at %v, want %v", got, want)
	}
}

func TestStoreFailureFallsBackLocallyAndRecovers(t *testing.T) {
	var modes modeLog
	r := newRig(t, 100, 10, 1, limiter.Options{ProbeInterval: ms(10), Observer: modes.observer()})
	ctx := context.Background()
	r.store.down.Store(true)
	r.wait(1) // served by the local fallback, which starts empty: +10 ms
	if r.b.Mode() != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", r.b.Mode())
	}
	// In fallback, the per-message path does not touch the store.
	before := r.store.takes.Load()
	for range 5 {
		r.wait(1)
	}
	r.advance(ms(9)) // just before the first grant and the first probe, at +10 ms
	if n := r.store.takes.Load() - before; n != 0 {
		t.Fatalf("%d store calls while in fallback, want 0", n)
	}
	if st, _ := r.b.State(ctx); st.Mode != limiter.ModeLocal || st.Rate != 100 {
		t.Fatalf("state in fallback = %+v; want local at the whole rate for one replica", st)
	}
	r.advance(ms(51))
	if got, want := r.grants(), []time.Duration{ms(10), ms(20), ms(30), ms(40), ms(50), ms(60)}; !equalDurations(got, want) {
		t.Fatalf("grants in fallback at %v, want %v (100/s from empty)", got, want)
	}
	r.store.down.Store(false)
	r.advance(ms(10)) // the next probe finds the store back
	waitForMode(t, r.b, limiter.ModeShared)
	r.wait(1) // from the shared bucket, drained on the way back: +80 ms
	r.advance(ms(20))
	if got, want := r.grants(), []time.Duration{ms(80)}; !equalDurations(got, want) {
		t.Fatalf("grants after the recovery at %v, want %v", got, want)
	}
	// ModeChanged runs after the switch, so the recovery may be reported a
	// moment after Mode shows it.
	testenv.Within(2*time.Second, func() bool { return len(modes.get()) >= 2 })
	if got := modes.get(); len(got) != 2 || got[0] != "shared>local" || got[1] != "local>shared" {
		t.Fatalf("transitions = %v, want one each way", got)
	}
}

// TestFallbackUsesTheConfiguredShare: with FallbackRate 20 the local
// bucket, which starts empty, grants 20/s, and a cost above its burst is
// still served, only later.
func TestFallbackUsesTheConfiguredShare(t *testing.T) {
	r := newRig(t, 100, 10, 1, limiter.Options{FallbackRate: 20})
	r.store.down.Store(true)
	for range 5 { // the local bucket starts empty: 5 tokens at 20/s
		r.wait(1)
	}
	if r.b.Mode() != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", r.b.Mode())
	}
	r.advance(ms(250))
	if got, want := r.grants(), []time.Duration{ms(50), ms(100), ms(150), ms(200), ms(250)}; !equalDurations(got, want) {
		t.Fatalf("5 tokens at a 20/s fallback granted at %v, want %v", got, want)
	}
	// A cost above the local burst is still served, just slower.
	r.wait(10)
	r.advance(ms(500))
	if got, want := r.grants(), []time.Duration{ms(750)}; !equalDurations(got, want) {
		t.Fatalf("Wait(10) in fallback returned at %v, want %v (10 tokens at 20/s)", got, want)
	}
}

// TestClosedPolicyBlocksUntilTheStoreIsBack: under ModeClosed a caller
// waits while the store is down, however long, and is served by the first
// probe that finds it back.
func TestClosedPolicyBlocksUntilTheStoreIsBack(t *testing.T) {
	r := newRig(t, 100, 10, 1, limiter.Options{OnStoreError: limiter.ModeClosed, ProbeInterval: ms(10)})
	ctx := context.Background()
	r.store.down.Store(true)
	if ok, _ := r.b.Allow(ctx, 1); ok {
		t.Fatal("Allow granted while closed")
	}
	r.open.Add(1) // a closed caller waits on the recovery, not on a timer
	done := make(chan error, 1)
	go func() {
		defer r.open.Add(-1)
		err := r.b.Wait(ctx, 1)
		if err == nil {
			r.mu.Lock()
			r.results = append(r.results, r.at())
			r.mu.Unlock()
		}
		done <- err
	}()
	for range 10 { // 100 ms of probes that fail
		armed := r.clk.Armed()
		r.clk.Advance(ms(10))
		r.clk.WaitArmed(t, armed+1)
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while closed", err)
	default:
	}
	if ok, _ := r.b.Allow(ctx, 1); ok {
		t.Fatal("Allow granted while closed")
	}
	r.store.down.Store(false)
	r.clk.Advance(ms(10))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Wait still blocked after the store came back")
	}
	if got, want := r.grants(), []time.Duration{ms(110)}; !equalDurations(got, want) {
		t.Fatalf("Wait returned at %v, want %v: at the first probe that found the store back", got, want)
	}
}

func TestClosedPolicyWaitHonoursContext(t *testing.T) {
	f := newFlaky(t, 100, 10)
	b, err := limiter.New(f, limiter.Options{OnStoreError: limiter.ModeClosed, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f.down.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want DeadlineExceeded", err)
	}
}

func TestOpenPolicyGrantsEverything(t *testing.T) {
	f := newFlaky(t, 1, 1)
	b, err := limiter.New(f, limiter.Options{OnStoreError: limiter.ModeOpen, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f.down.Store(true)
	start := time.Now()
	for range 100 {
		if err := b.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("open mode took %v for 100 tokens at 1/s", d)
	}
}

// countingStore counts Take calls.
type countingStore struct {
	limiter.Store
	takes, refunded atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	c.takes.Add(1)
	return c.Store.Take(ctx, req)
}

func (c *countingStore) Refund(ctx context.Context, n int) error {
	c.refunded.Add(int64(n))
	return c.Store.Refund(ctx, n)
}

// TestLeasingServesFromABatchAndGivesBackOnClose runs at a fixed instant:
// a batch goes out within a deadline (LeaseOptions), which on the real
// clock a loaded machine passed (7 store calls for the 5000 tokens).
func TestLeasingServesFromABatchAndGivesBackOnClose(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	c := newClockedStore(t, clk, 1e6, 1e6, 1)
	b, err := limiter.New(c, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Idle: time.Hour}, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 5000 {
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	// The first call learns the rate; after that each call leases 1% of
	// 1e6 = 10000 tokens.
	if n := c.takes.Load(); n > 3 {
		t.Fatalf("%d store calls for 5000 tokens, want <= 3", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if c.refunded.Load() == 0 {
		t.Fatal("Close gave no leased tokens back")
	}
}

func TestLeasingSwitchesOffAtLowRates(t *testing.T) {
	m, _ := limiter.NewMemory(100, 100) // 1% of 100/s is 1 token: below MinBatch
	c := &countingStore{Store: m}
	b, err := limiter.New(c, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 50 {
		if err := b.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.takes.Load(); n != 50 {
		t.Fatalf("%d store calls for 50 tokens at 100/s, want exactly 50 (no leasing)", n)
	}
}

// TestLeasedTokensGoBackWhenIdle: the tokens a Bucket leased go back to
// the store once they sat unused for a whole Lease.Idle (on the Bucket's
// clock: at +40 ms with Idle 20 ms, the lease taken at +0), not before
// Idle. Its hold, 100 ms, puts its deadline past the test's end.
func TestLeasedTokensGoBackWhenIdle(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClockedStore(t, clk, 1e5, 1e5, 1)
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Idle: ms(20), Hold: ms(100)}}, s.watched)
	for range 3 {
		if err := b.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	clk.WaitTimers(t, 1) // the idle timer
	clk.Advance(ms(19))
	if n := s.refunded.Load(); n != 0 {
		t.Fatalf("%d leased tokens given back before the idle time", n)
	}
	// The timer runs every Idle while the pool holds tokens; the first run
	// finds them used since the last one, the second gives them back.
	armed := clk.Armed()
	clk.Advance(ms(1))
	clk.WaitArmed(t, armed+1)
	clk.Advance(ms(20))
	testenv.Eventually(t, 2*time.Second, "the leased tokens given back after the idle time", func() bool { return s.refunded.Load() > 0 })
}

// TestCloseStopsWaiters: a caller asleep on a reservation returns
// ErrClosed at Close. The fake clock shows the caller asleep before Close,
// so the test exercises the sleeping path, not the check at Wait's start.
func TestCloseStopsWaiters(t *testing.T) {
	r := newRig(t, 0.1, 1, 1, limiter.Options{MaxReserve: time.Minute})
	r.wait(1) // the burst
	done := make(chan error, 1)
	armed := r.clk.Armed()
	go func() { done <- r.b.Wait(context.Background(), 1) }() // reserved 10 s ahead
	r.clk.WaitArmed(t, armed+1)
	r.b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, limiter.ErrClosed) {
			t.Fatalf("Wait after Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
	// The reservation of the caller Close stopped went back to the store.
	if st := r.store.mem().StatusAt(r.clk.Now()); st.Tokens < -0.01 {
		t.Fatalf("tokens after Close = %v, want the cancelled reservation refunded (0)", st.Tokens)
	}
}

// The re-timing of sleeping reservations on a rate change or a pause is
// tested at fixed instants in fixed_test.go.
