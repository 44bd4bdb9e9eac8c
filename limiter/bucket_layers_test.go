package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

var errLayersDown = &limiter.StoreError{Op: "take layers", Bucket: "t", Err: errors.New("connection refused")}

// layeredClocked is a LayeredStore on a LayeredMemory driven by a fake
// clock, which can be taken down. Its status reports `replicas` live
// replicas.
type layeredClocked struct {
	clk      *clocktest.Clock
	m        *limiter.LayeredMemory
	down     atomic.Bool
	replicas int
}

func newLayeredClocked(t *testing.T, clk *clocktest.Clock, rate float64, burst, replicas int, layers ...limiter.Layer) *layeredClocked {
	t.Helper()
	return &layeredClocked{clk: clk, m: newLayeredMemory(t, rate, burst, layers), replicas: replicas}
}

func (s *layeredClocked) fail() error {
	if s.down.Load() {
		return errLayersDown
	}
	return nil
}

func (s *layeredClocked) Take(_ context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	if err := s.fail(); err != nil {
		return limiter.TakeResult{}, err
	}
	return s.m.TakeAt(s.clk.Now(), req)
}

func (s *layeredClocked) Refund(_ context.Context, n int) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.m.RefundAt(s.clk.Now(), n)
	return nil
}

func (s *layeredClocked) Pause(_ context.Context, d time.Duration) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.m.PauseAt(s.clk.Now(), d)
	return nil
}

func (s *layeredClocked) Drain(_ context.Context, debt int) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.m.DrainAt(s.clk.Now(), debt)
	return nil
}

func (s *layeredClocked) Status(_ context.Context) (limiter.State, error) {
	if err := s.fail(); err != nil {
		return limiter.State{}, err
	}
	st := s.m.StatusAt(s.clk.Now())
	st.Replicas = s.replicas
	return st, nil
}

func (s *layeredClocked) Limits() (float64, int) { return s.m.Limits() }

func (s *layeredClocked) Layers() []limiter.Layer { return s.m.Layers() }

func (s *layeredClocked) TakeLayers(_ context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	if err := s.fail(); err != nil {
		return limiter.LayerResult{}, err
	}
	return s.m.TakeLayersAt(s.clk.Now(), req)
}

func (s *layeredClocked) RefundLayers(_ context.Context, req limiter.LayerRequest, res limiter.LayerResult) error {
	if err := s.fail(); err != nil {
		return err
	}
	return s.m.RefundLayersAt(s.clk.Now(), req, res)
}

func (s *layeredClocked) DelayLayers(_ context.Context, req limiter.LayerRequest, res limiter.LayerResult, from time.Time, by time.Duration) (bool, error) {
	if err := s.fail(); err != nil {
		return false, err
	}
	return s.m.DelayLayersAt(s.clk.Now(), req, res, from, by)
}

func (s *layeredClocked) ChargeLayers(_ context.Context, charges []limiter.LayerCharge) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.m.ChargeLayersAt(s.clk.Now(), charges)
	return nil
}

func (s *layeredClocked) layer(t *testing.T, layer, key string) limiter.LayerState {
	t.Helper()
	st, err := s.m.LayerStatusAt(s.clk.Now(), layer, key)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func newLayeredBucket(t *testing.T, clk *clocktest.Clock, s limiter.Store, obs ...*limiter.Observer) *limiter.Bucket {
	t.Helper()
	opts := limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger()}
	if len(obs) > 0 {
		opts.Observer = obs[0]
	}
	b, err := limiter.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func keyReq(k string) limiter.Request {
	return limiter.Request{Cost: 1, Keys: map[string]string{"per-key": k}}
}

// waitN runs WaitN in a goroutine and returns its result channel.
func waitN(b *limiter.Bucket, ctx context.Context, req limiter.Request) <-chan error {
	done := make(chan error, 1)
	go func() { done <- b.WaitN(ctx, req) }()
	return done
}

// grantedIn advances clk by d in two steps and checks that the WaitN behind
// done returns nil at the second, and not a millisecond before.
func grantedIn(t *testing.T, clk *clocktest.Clock, done <-chan error, d time.Duration) {
	t.Helper()
	clk.Advance(d - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("WaitN returned after %v (%v), want after %v", d-time.Millisecond, err, d)
	default:
	}
	clk.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWaitNDeadLetterChargesNothing(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 100, 10, 1,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 1, Burst: 1, OnExceed: limiter.ActionDeadLetter})
	var exceeded []string
	b := newLayeredBucket(t, clk, s, &limiter.Observer{LimitExceeded: func(layer string, action limiter.Action) {
		exceeded = append(exceeded, layer+"/"+string(action))
	}})
	ctx := context.Background()
	if err := b.WaitN(ctx, keyReq("a")); err != nil {
		t.Fatal(err)
	}
	err := b.WaitN(ctx, keyReq("a"))
	if len(exceeded) != 1 || exceeded[0] != "per-key/dead_letter" {
		t.Errorf("Observer.LimitExceeded calls = %v, want [per-key/dead_letter]", exceeded)
	}
	var le *limiter.LimitError
	if !errors.As(err, &le) || le.Layer != "per-key" || le.Action != limiter.ActionDeadLetter || !errors.Is(err, limiter.ErrLimitExceeded) {
		t.Fatalf("second WaitN on key a = %v, want a dead_letter LimitError of per-key", err)
	}
	if st := s.m.StatusAt(clk.Now()); !nearTokens(st.Tokens, 9) {
		t.Errorf("shared tokens = %v, want 9: the refusal charged the shared bucket", st.Tokens)
	}
	if err := b.WaitN(ctx, keyReq("b")); err != nil {
		t.Errorf("WaitN on key b = %v", err)
	}
	if err := b.WaitN(ctx, limiter.Request{Cost: 1}); !errors.Is(err, limiter.ErrMissingKey) {
		t.Errorf("WaitN without a key = %v, want ErrMissingKey", err)
	}
	if err := b.WaitN(ctx, limiter.Request{Cost: 2, Keys: map[string]string{"per-key": "c"}}); !errors.Is(err, limiter.ErrCostExceedsBurst) || !errors.As(err, &le) || le.Layer != "per-key" {
		t.Errorf("WaitN above the layer's burst = %v, want ErrCostExceedsBurst naming per-key", err)
	}
	// Both refusals are counted for the heartbeat report.
	if got := b.Exceeded(); len(got) != 1 || got["per-key"] != 2 {
		t.Errorf("Exceeded() = %v, want map[per-key:2]", got)
	}
}

func TestWaitNWaitsForTheSlowestLayer(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 100, 10, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 10, Burst: 1})
	waited := make(chan string, 10)
	b := newLayeredBucket(t, clk, s, &limiter.Observer{LayerWaited: func(layer string, d time.Duration) {
		waited <- layer + "/" + d.String()
	}})
	ctx := context.Background()
	if err := b.WaitN(ctx, keyReq("a")); err != nil {
		t.Fatal(err)
	}
	done := waitN(b, ctx, keyReq("a"))
	clk.WaitTimers(t, 1)
	// Another key is not held up.
	if err := b.WaitN(ctx, keyReq("b")); err != nil {
		t.Fatal(err)
	}
	grantedIn(t, clk, done, 100*time.Millisecond) // key a at 10/s
	for _, want := range []string{"/0s", "/0s", "per-key/100ms"} {
		if got := <-waited; got != want {
			t.Errorf("Observer.LayerWaited = %s, want %s", got, want)
		}
	}
	// Nothing was reserved while key a waited: the shared bucket, refilled
	// to its burst by then, was charged when the message went out.
	if st := s.m.StatusAt(clk.Now()); !nearTokens(st.Tokens, 9) {
		t.Errorf("shared tokens = %v, want 9 (charged at 100ms, from the burst)", st.Tokens)
	}
	if got := s.layer(t, "per-key", "a"); !nearTokens(got.Tokens, 0) {
		t.Errorf("per-key a tokens = %v, want 0", got.Tokens)
	}
}

func TestWaitNCancelRefundsTheSharedBucket(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	// The shared bucket (1/s, burst 1) is the longest wait, so the second
	// request holds a reservation on every layer.
	s := newLayeredClocked(t, clk, 1, 1, 1,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 1, Burst: 1},
		limiter.Layer{Name: "daily", Quota: 100, Per: limiter.PerDay})
	b := newLayeredBucket(t, clk, s)
	if err := b.WaitN(context.Background(), keyReq("b")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := waitN(b, ctx, keyReq("a")) // reserved: due in 1s
	clk.WaitTimers(t, 1)
	if got := s.layer(t, "daily", ""); got.Used != 2 {
		t.Fatalf("daily used while reserved = %d, want 2", got.Used)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled WaitN = %v", err)
	}
	// The layers keep the charge: a refunded token of a layer charged
	// again after this one would go out next to that later message.
	if got := s.layer(t, "daily", ""); got.Used != 2 {
		t.Errorf("daily used after the cancel = %d, want 2 (kept)", got.Used)
	}
	if got := s.layer(t, "per-key", "a"); !nearTokens(got.Tokens, -1) {
		t.Errorf("per-key a tokens after the cancel = %v, want -1 (kept)", got.Tokens)
	}
	if st := s.m.StatusAt(clk.Now()); !nearTokens(st.Tokens, 0) {
		t.Errorf("shared tokens after the cancel = %v, want 0 (from -1)", st.Tokens)
	}
}

// TestWaitNFallbackKeepsLayersAtShare takes the store down: the layers go on
// in this process at this replica's share (of 2 replicas), so a key whose
// burst is 2 gets 1.
func TestWaitNFallbackKeepsLayersAtShare(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 100, 10, 2,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 1, Burst: 2, OnExceed: limiter.ActionDeadLetter})
	b := newLayeredBucket(t, clk, s)
	ctx := context.Background()
	if err := b.Check(ctx); err != nil {
		t.Fatal(err)
	}
	// The local bucket starts empty and refills at 50/s: 20ms.
	takeDownFirstLocal(t, clk, s, b, keyReq("a"))
	var le *limiter.LimitError
	if err := b.WaitN(ctx, keyReq("a")); !errors.As(err, &le) || le.Layer != "per-key" {
		t.Fatalf("second WaitN on key a in fallback = %v, want refused by per-key (burst 2 at a share of 1/2)", err)
	}
	if got := s.layer(t, "per-key", "a"); !nearTokens(got.Tokens, 2) {
		t.Errorf("Redis-side per-key a = %v, want untouched (2)", got.Tokens)
	}
}

func nearTokens(a, b float64) bool { return math.Abs(a-b) < 0.0015 }

// recordingLayers records the requests a Bucket sends to its layered store.
type recordingLayers struct {
	*layeredClocked
	reqs []limiter.LayerRequest
}

func (s *recordingLayers) TakeLayers(ctx context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	s.reqs = append(s.reqs, req)
	return s.layeredClocked.TakeLayers(ctx, req)
}

// TestWaitNLeasesTheSharedBucket: with leasing on, one WaitN asks for a
// batch of shared tokens with its message, and the next ones, served by the
// lease, ask the store for their layers alone.
func TestWaitNLeasesTheSharedBucket(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := &recordingLayers{layeredClocked: newLayeredClocked(t, clk, 1e5, 1e5, 1,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 10, Burst: 10})}
	b, err := limiter.New(s, limiter.Options{Clock: clk, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	for i := range 5 {
		if err := b.WaitN(ctx, keyReq(fmt.Sprint("k", i))); err != nil {
			t.Fatal(err)
		}
	}
	if g := b.Granted(); g != 5 {
		t.Errorf("Granted() = %d after 5 WaitN, want 5", g)
	}
	if len(s.reqs) != 5 || s.reqs[0].Extra != 999 || s.reqs[0].SkipShared {
		t.Fatalf("first request = %+v, want a lease of 999 extra tokens (1%% of 1e5/s) with the message", s.reqs[0])
	}
	for i, r := range s.reqs[1:] {
		if !r.SkipShared || r.Extra != 0 {
			t.Errorf("request %d = %+v, want the layers alone (the lease pays the shared bucket)", i+1, r)
		}
	}
	if st := s.m.StatusAt(clk.Now()); !nearTokens(st.Tokens, 1e5-1000) {
		t.Errorf("shared tokens = %v, want %v: one lease of 1000", st.Tokens, 1e5-1000)
	}
	if got := s.layer(t, "per-key", "k3"); !nearTokens(got.Tokens, 9) {
		t.Errorf("per-key k3 = %v, want 9: the layer is charged per message", got.Tokens)
	}
}

// TestRecoveryChargesTheKeysSentLocally: a key sent while the store was
// down (decided by the local fallback) must not go again through the
// store right after it is back, within the key's spacing: the store never
// saw the local send. Before, the store's key was full after the recovery
// and the key's next message went out at once, a second burst per key
// per outage (a campaign saw a per-recipient pair 394 ms apart against
// 2 s, both from one replica).
func TestRecoveryChargesTheKeysSentLocally(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 100, 10, 1,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1, OnExceed: limiter.ActionDeadLetter})
	b := newProbingBucket(t, clk, s)
	ctx := context.Background()
	if err := b.Check(ctx); err != nil {
		t.Fatal(err)
	}
	takeDownFirstLocal(t, clk, s, b, keyReq("a"))
	s.down.Store(false)
	awaitShared(t, clk, b)
	if got := s.layer(t, "per-key", "a"); got.Tokens > 0.5 {
		t.Errorf("store's per-key a after the recovery = %v tokens, want charged for the local send (at most 0.5)", got.Tokens)
	}
	// The shared bucket, charged on the recovery, may make the request
	// wait on the clock: advance it, within the key's spacing.
	sentAgo := clk.Now().Sub(storetest.Base)
	err := waitNAdvancing(t, clk, b, ctx, keyReq("a"), 100*time.Millisecond)
	var le *limiter.LimitError
	if !errors.As(err, &le) || le.Layer != "per-key" {
		t.Fatalf("WaitN on key a right after the recovery (sent locally %v before it) = %v, want refused by per-key (spacing 2 s)", sentAgo, err)
	}
}

// TestRecoveryChargesTheBudgetSpentLocally: a budget spent by the local
// fallback is charged to the store when it is back. Before, the store knew
// only what was spent before the outage, and allowed the rest of the
// budget again: 1.60 spent of 1.00 here, where now the overspend is the
// 0.20 that the local share could not know of.
func TestRecoveryChargesTheBudgetSpentLocally(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 100, 10, 1,
		limiter.Layer{Name: "spend", Budget: 1_000_000, Per: limiter.PerDay, OnExceed: limiter.ActionDeadLetter})
	b := newProbingBucket(t, clk, s)
	ctx := context.Background()
	req := limiter.Request{Cost: 1, Price: 400_000} // 0.40
	if err := b.WaitN(ctx, req); err != nil {
		t.Fatal(err)
	}
	s.down.Store(true)
	for range 2 { // 0.80 more, locally: the local share is the whole budget
		if err := waitNAdvancing(t, clk, b, ctx, req, 200*time.Millisecond); err != nil {
			t.Fatalf("local WaitN: %v", err)
		}
	}
	if m := b.Mode(); m != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", m)
	}
	s.down.Store(false)
	awaitShared(t, clk, b)
	if got := s.layer(t, "spend", ""); got.Spent != 1_200_000 {
		t.Errorf("store's spend after the recovery = %d millionths, want 1,200,000 (0.40 before the outage, 0.80 locally)", got.Spent)
	}
	var le *limiter.LimitError
	if err := waitNAdvancing(t, clk, b, ctx, req, 200*time.Millisecond); !errors.As(err, &le) || le.Layer != "spend" {
		t.Fatalf("WaitN after the recovery = %v, want refused by the spent budget", err)
	}
}

// waitNAdvancing runs WaitN while it waits on the clock, advancing the
// clock 10 ms at a time, up to limit; it fails the test if WaitN is still
// blocked then, instead of hanging.
func waitNAdvancing(t *testing.T, clk *clocktest.Clock, b *limiter.Bucket, ctx context.Context, req limiter.Request, limit time.Duration) error {
	t.Helper()
	done := waitN(b, ctx, req)
	for waited := time.Duration(0); ; waited += 10 * time.Millisecond {
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Millisecond):
			if waited >= limit {
				t.Fatalf("WaitN still blocked after %v on the clock", waited)
			}
			clk.Advance(10 * time.Millisecond)
		}
	}
}

// failingCharges is a layeredClocked whose ChargeLayers fails on its
// failAt-th call, and counts the charges of each key it took.
type failingCharges struct {
	*layeredClocked
	calls, failAt int
	charged       map[string]int
}

func (s *failingCharges) ChargeLayers(ctx context.Context, charges []limiter.LayerCharge) error {
	s.calls++
	if s.calls == s.failAt {
		return errLayersDown
	}
	for _, c := range charges {
		s.charged[c.Key]++
	}
	return s.layeredClocked.ChargeLayers(ctx, charges)
}

// TestRecoveryChargesInChunks: the keys an outage touched are charged a
// chunk at a time; when a chunk fails, the Bucket stays in its fallback and
// charges the rest, and only the rest, at its next probe.
func TestRecoveryChargesInChunks(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := &failingCharges{layeredClocked: newLayeredClocked(t, clk, 1e6, 1e6, 1,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1, OnExceed: limiter.ActionDeadLetter}), failAt: 2, charged: map[string]int{}}
	b := newProbingBucket(t, clk, s)
	ctx := context.Background()
	if err := b.Check(ctx); err != nil {
		t.Fatal(err)
	}
	s.down.Store(true)
	const keys = 5000 // two chunks
	for i := range keys {
		if err := waitNAdvancing(t, clk, b, ctx, keyReq(fmt.Sprint("k", i)), 200*time.Millisecond); err != nil {
			t.Fatalf("local WaitN %d: %v", i, err)
		}
	}
	s.down.Store(false)
	awaitShared(t, clk, b)
	if s.calls != 3 {
		t.Errorf("ChargeLayers called %d times, want 3 (a chunk, a failed one, then the rest at the next probe)", s.calls)
	}
	for i := range keys {
		k := fmt.Sprint("k", i)
		if n := s.charged[k]; n != 1 {
			t.Fatalf("%s charged %d times, want once", k, n)
		}
		if got := s.layer(t, "per-key", k).Tokens; got > 0.9 {
			t.Fatalf("per-key %s after the recovery = %v tokens, want charged for its send", k, got)
		}
	}
}

// newProbingBucket is a Bucket on s without leasing that probes a failed
// store every 100 ms of clk.
func newProbingBucket(t *testing.T, clk *clocktest.Clock, s limiter.Store) *limiter.Bucket {
	t.Helper()
	b, err := limiter.New(s, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(), ProbeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// awaitShared advances clk a probe interval at a time until b shares the
// bucket again, and fails the test if it does not within 2 s of clk. After
// each step it gives the probe up to 250 ms of real time to end, so that
// the clock does not run on while a probe works (a loaded machine).
func awaitShared(t *testing.T, clk *clocktest.Clock, b *limiter.Bucket) {
	t.Helper()
	for range 20 {
		clk.Advance(100 * time.Millisecond)
		for deadline := time.Now().Add(250 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if b.Mode() == limiter.ModeShared {
				return
			}
		}
	}
	t.Fatalf("mode = %s after the store came back, want shared", b.Mode())
}

// takeDownFirstLocal takes s down and runs req on b, the first request of
// the local fallback, whose bucket starts empty: it advances clk 20 ms
// once b's caller sleeps, which serves a local share of 50/s or more, and
// checks that req was granted and b limits locally.
func takeDownFirstLocal(t *testing.T, clk *clocktest.Clock, s *layeredClocked, b *limiter.Bucket, req limiter.Request) {
	t.Helper()
	s.down.Store(true)
	done := waitN(b, context.Background(), req)
	// Two timers: the caller's sleep and the probe of the store (waiting
	// for one alone could advance the clock before the caller slept).
	clk.WaitTimers(t, 2)
	clk.Advance(20 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m := b.Mode(); m != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", m)
	}
}

// TestRecoveryDoesNotPassSlotsBookedLocally: a slot that the local
// fallback booked is known to its local bucket only. Back on the store,
// another replica has booked the key past that slot's due meanwhile; the
// slot, back at its due, must not pass the store's layer beside that
// booking. Before, it carried the store's signature and passed (the
// store's state, older than the slot, held a booking after its due):
// the key got two messages at once against a spacing of 2 s.
func TestRecoveryDoesNotPassSlotsBookedLocally(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newLayeredClocked(t, clk, 100, 10, 1,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1, OnExceed: limiter.ActionDelay})
	b := newProbingBucket(t, clk, s)
	ctx := context.Background()
	// The store's state is older than what follows, and the Bucket signs
	// with the store's secret (a slot booked for key other).
	if err := b.WaitN(ctx, keyReq("other")); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitN(ctx, keyReq("other")); !errors.Is(err, limiter.ErrLimitExceeded) {
		t.Fatalf("second WaitN on other = %v, want a slot booked", err)
	}
	takeDownFirstLocal(t, clk, s, b, keyReq("a"))
	var local *limiter.LimitError
	if err := waitNAdvancing(t, clk, b, ctx, keyReq("a"), 100*time.Millisecond); !errors.As(err, &local) || !local.Reserved {
		t.Fatalf("second WaitN on a, limiting locally = %v, want a slot booked", err)
	}
	slot := local.Slot()
	// Another replica, sharing the store, sends to a and books it twice.
	other := limiter.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": "a"}, SkipShared: true}
	for i := range 3 {
		res, err := s.m.TakeLayersAt(clk.Now(), other)
		if err != nil || (i == 0) != res.Granted {
			t.Fatalf("the other replica's take %d = %+v, %v", i, res, err)
		}
	}
	s.down.Store(false)
	awaitShared(t, clk, b)
	if d := slot.Due.Sub(clk.Now()); d > 0 {
		clk.Advance(d)
	}
	req := keyReq("a")
	req.Paid = []limiter.PaidSlot{slot}
	err := waitNAdvancing(t, clk, b, ctx, req, 200*time.Millisecond)
	var le *limiter.LimitError
	if !errors.As(err, &le) || !le.Reserved {
		t.Fatalf("the slot booked locally, back at its due on the store = %v, want its layer decided again (a new slot booked)", err)
	}
	if st := b.Stats(); st.PaidForfeit < 1 {
		t.Errorf("Stats.PaidForfeit = %d, want the local slot counted", st.PaidForfeit)
	}
}

// countingLayers counts the TakeLayers calls of a layeredClocked.
type countingLayers struct {
	*layeredClocked
	calls atomic.Int64
}

func (s *countingLayers) TakeLayers(ctx context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	s.calls.Add(1)
	return s.layeredClocked.TakeLayers(ctx, req)
}

// TestWaitNBooksAtOnceBeyondAHorizonTooShort is
// TestWaitBooksAtOnceBeyondAHorizonTooShort on a store with layers: turned
// away by a shared horizon (MaxReserve, 1 s) shorter than the shared
// queue (2 s), the caller books its place at once.
func TestWaitNBooksAtOnceBeyondAHorizonTooShort(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := &countingLayers{layeredClocked: newLayeredClocked(t, clk, 10, 1, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000})}
	for range 21 { // another replica's reservations
		if _, err := s.m.TakeLayersAt(clk.Now(), limiter.LayerRequest{Cost: 1, MaxWait: time.Minute, Keys: map[string]string{"per-key": "other"}}); err != nil {
			t.Fatal(err)
		}
	}
	b := newLayeredBucket(t, clk, s)
	done := waitN(b, context.Background(), keyReq("a"))
	clk.WaitTimers(t, 1)
	if n := s.calls.Load(); n != 2 {
		t.Fatalf("%d store calls before the caller sleeps, want 2: turned away, then booked at once", n)
	}
	grantedIn(t, clk, done, 2100*time.Millisecond) // its place at the queue's end
}
