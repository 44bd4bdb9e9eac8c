package limiter_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// flakyStore wraps a Store and fails every call while down is set.
type flakyStore struct {
	limiter.Store
	down  atomic.Bool
	takes atomic.Int64
}

var errDown = &limiter.StoreError{Op: "take", Bucket: "t", Err: errors.New("connection refused")}

func (f *flakyStore) Take(ctx context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	f.takes.Add(1)
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
	deadline := time.Now().Add(2 * time.Second)
	for b.Mode() != want {
		if time.Now().After(deadline) {
			t.Fatalf("mode = %s, want %s", b.Mode(), want)
		}
		time.Sleep(time.Millisecond)
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

func TestWaitSleepsExactlyTheReservation(t *testing.T) {
	b, err := limiter.NewLocal(20, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	start := time.Now()
	for range 3 { // 1 from the burst, then 2 at 50 ms each
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("3 tokens at 20/s burst 1 took %v, want >= 100ms", d)
	}
}

func TestPauseDelaysEveryWaiter(t *testing.T) {
	b, err := limiter.NewLocal(1000, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.Pause(ctx, 150*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.State(ctx); st.Rate != 0 || st.PausedFor <= 0 {
		t.Fatalf("State while paused = %+v", st)
	}
	start := time.Now()
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 140*time.Millisecond {
		t.Fatalf("Wait during a 150ms pause returned after %v", d)
	}
}

func TestStoreFailureFallsBackLocallyAndRecovers(t *testing.T) {
	f := newFlaky(t, 100, 10)
	var modes modeLog
	b, err := limiter.New(f, limiter.Options{ProbeInterval: 10 * time.Millisecond, Observer: modes.observer()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	f.down.Store(true)
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatalf("Wait with the store down = %v; want served by the local fallback", err)
	}
	if b.Mode() != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", b.Mode())
	}
	// In fallback, the per-message path does not touch the store.
	before := f.takes.Load()
	for range 5 {
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.takes.Load() - before; n != 0 {
		t.Fatalf("%d store calls while in fallback, want 0", n)
	}
	if st, _ := b.State(ctx); st.Mode != limiter.ModeLocal || st.Rate != 100 {
		t.Fatalf("state in fallback = %+v; want local at the whole rate for one replica", st)
	}
	f.down.Store(false)
	waitForMode(t, b, limiter.ModeShared)
	if err := b.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// ModeChanged runs after the switch, so the recovery may be reported a
	// moment after Mode shows it.
	deadline := time.Now().Add(2 * time.Second)
	for len(modes.get()) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := modes.get(); len(got) != 2 || got[0] != "shared>local" || got[1] != "local>shared" {
		t.Fatalf("transitions = %v, want one each way", got)
	}
}

func TestFallbackUsesTheConfiguredShare(t *testing.T) {
	f := newFlaky(t, 100, 10)
	b, err := limiter.New(f, limiter.Options{FallbackRate: 20, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f.down.Store(true)
	ctx := context.Background()
	start := time.Now()
	for range 5 { // the local bucket starts empty: 5 tokens at 20/s
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 240*time.Millisecond {
		t.Fatalf("5 tokens at a 20/s fallback took %v, want >= 250ms", d)
	}
	// A cost above the local burst is still served, just slower.
	if err := b.Wait(ctx, 10); err != nil {
		t.Fatalf("Wait(10) in fallback = %v", err)
	}
}

func TestClosedPolicyBlocksUntilTheStoreIsBack(t *testing.T) {
	f := newFlaky(t, 100, 10)
	b, err := limiter.New(f, limiter.Options{OnStoreError: limiter.ModeClosed, ProbeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f.down.Store(true)
	done := make(chan error, 1)
	go func() { done <- b.Wait(context.Background(), 1) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while closed", err)
	case <-time.After(100 * time.Millisecond):
	}
	if ok, _ := b.Allow(context.Background(), 1); ok {
		t.Fatal("Allow granted while closed")
	}
	f.down.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Wait still blocked after the store came back")
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

func TestLeasingServesFromABatchAndGivesBackOnClose(t *testing.T) {
	m, _ := limiter.NewMemory(1e6, 1e6)
	c := &countingStore{Store: m}
	b, err := limiter.New(c, limiter.Options{Lease: limiter.LeaseOptions{Idle: time.Hour}})
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

func TestLeasedTokensGoBackWhenIdle(t *testing.T) {
	m, _ := limiter.NewMemory(1e5, 1e5)
	c := &countingStore{Store: m}
	b, err := limiter.New(c, limiter.Options{Lease: limiter.LeaseOptions{Idle: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 3 {
		if err := b.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for c.refunded.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("leased tokens were not given back after the idle time")
		}
		time.Sleep(5 * time.Millisecond)
	}
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
