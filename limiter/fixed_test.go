package limiter_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// clockedStore is a Store on a Memory driven by a fake clock, which can be
// taken down or made to refuse this client. It reports `replicas` live
// replicas in its status, without tracking heartbeats, so a Bucket on it
// runs no heartbeat timer.
type clockedStore struct {
	clk      *clocktest.Clock
	mu       sync.Mutex
	m        *limiter.Memory
	down     atomic.Bool
	refuse   atomic.Bool
	replicas int
	drained  []int
	watchers []func()
	// takes counts the calls of Take, refunded the tokens given back.
	takes, refunded atomic.Int64
}

var errRefused = &limiter.StoreError{Op: "take", Bucket: "t", Err: errors.New("WRONGPASS"), Misconfigured: true}

func newClockedStore(t *testing.T, clk *clocktest.Clock, rate float64, burst, replicas int) *clockedStore {
	t.Helper()
	m, err := limiter.NewMemory(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return &clockedStore{clk: clk, m: m, replicas: replicas}
}

func (s *clockedStore) mem() *limiter.Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

func (s *clockedStore) fail() error {
	switch {
	case s.refuse.Load():
		return errRefused
	case s.down.Load():
		return errDown
	}
	return nil
}

func (s *clockedStore) Take(_ context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	s.takes.Add(1)
	if err := s.fail(); err != nil {
		return limiter.TakeResult{}, err
	}
	return s.mem().TakeAt(s.clk.Now(), req)
}

func (s *clockedStore) Refund(_ context.Context, n int) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.mem().RefundAt(s.clk.Now(), n)
	s.refunded.Add(int64(n))
	return nil
}

func (s *clockedStore) RefundPast(_ context.Context, n int) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.mem().RefundPastAt(s.clk.Now(), n)
	s.refunded.Add(int64(n))
	return nil
}

func (s *clockedStore) Pause(_ context.Context, d time.Duration) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.mem().PauseAt(s.clk.Now(), d)
	s.announce()
	return nil
}

func (s *clockedStore) PauseBy(_ context.Context, d time.Duration, by string) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.mem().PauseByAt(s.clk.Now(), d, by)
	s.announce()
	return nil
}

// setRate changes the rate now, as an operator's override, and announces
// it.
func (s *clockedStore) setRate(t *testing.T, rate float64, burst int) {
	if err := s.mem().SetRateAt(s.clk.Now(), rate, burst); err != nil {
		t.Fatal(err)
	}
	s.announce()
}

func (s *clockedStore) announce() {
	s.mu.Lock()
	ws := append([]func(){}, s.watchers...)
	s.mu.Unlock()
	for _, w := range ws {
		w()
	}
}

func (s *clockedStore) Drain(_ context.Context, debt int) error {
	if err := s.fail(); err != nil {
		return err
	}
	s.mu.Lock()
	s.drained = append(s.drained, debt)
	s.mu.Unlock()
	s.mem().DrainAt(s.clk.Now(), debt)
	return nil
}

func (s *clockedStore) Status(_ context.Context) (limiter.State, error) {
	if err := s.fail(); err != nil {
		return limiter.State{}, err
	}
	st := s.mem().StatusAt(s.clk.Now())
	st.Replicas = s.replicas
	return st, nil
}

func (s *clockedStore) Limits() (float64, int) { return s.mem().Limits() }

func (s *clockedStore) Watch(ctx context.Context, changed func(), _ func(limiter.Push)) {
	s.mu.Lock()
	s.watchers = append(s.watchers, changed)
	s.mu.Unlock()
	<-ctx.Done()
}

// rig drives a Bucket at fixed instants: callers run in goroutines, and the
// clock moves one millisecond at a time, each step only once every caller
// is asleep again.
type rig struct {
	t     *testing.T
	clk   *clocktest.Clock
	store *clockedStore
	b     *limiter.Bucket
	// open counts callers that have not returned; results get their
	// return instants (as offsets from storetest.Base).
	open    atomic.Int64
	mu      sync.Mutex
	results []time.Duration
}

func newRig(t *testing.T, rate float64, burst, replicas int, opts limiter.Options) *rig {
	t.Helper()
	clk := clocktest.New(storetest.Base)
	r := &rig{t: t, clk: clk, store: newClockedStore(t, clk, rate, burst, replicas)}
	opts.Lease.Disabled = true
	r.b = newClockedBucket(t, clk, r.store, opts, r.store.watched)
	return r
}

// watched reports whether a Bucket watches the store.
func (s *clockedStore) watched() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers) > 0
}

// steps returns the rig's stepper.
func (r *rig) steps() stepper { return stepper{r.t, r.clk, r.b, &r.open} }

// change runs f, which wakes the n callers asleep, and waits until they
// sleep again.
func (r *rig) change(n int, f func()) { r.steps().wake(n, f) }

func (r *rig) at() time.Duration { return r.steps().at() }

// wait starts a Wait(cost) and returns once it has returned or sleeps.
func (r *rig) wait(cost int) { r.waitN(limiter.Request{Cost: cost}) }

// waitN starts a WaitN(req) and returns once it has returned or sleeps.
func (r *rig) waitN(req limiter.Request) {
	r.open.Add(1)
	go func() {
		defer r.open.Add(-1)
		if err := r.b.WaitN(context.Background(), req); err != nil {
			r.t.Errorf("WaitN(%v) at +%v: %v", req, r.at(), err)
			return
		}
		r.mu.Lock()
		r.results = append(r.results, r.at())
		r.mu.Unlock()
	}()
	r.settle()
}

// settle waits until every open caller sleeps on a timer.
func (r *rig) settle() {
	r.t.Helper()
	r.steps().settle()
}

// advance moves the clock by d, one millisecond at a time.
func (r *rig) advance(d time.Duration) { r.steps().advance(d) }

// grants returns the return instants so far, in order, and forgets them.
func (r *rig) grants() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.results
	r.results = nil
	return g
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// newClockedBucket returns a Bucket on s driven by clk, which logs nothing
// and probes hourly unless opts sets ProbeInterval, closed when the test
// ends. It returns once watching reports that the Bucket watches s.
func newClockedBucket(t *testing.T, clk *clocktest.Clock, s limiter.Store, opts limiter.Options, watching func() bool) *limiter.Bucket {
	t.Helper()
	opts.Clock = clk
	opts.Logger = discardLogger()
	if opts.ProbeInterval == 0 {
		opts.ProbeInterval = time.Hour
	}
	b, err := limiter.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	testenv.Eventually(t, 10*time.Second, "the Bucket watching the store", watching)
	return b
}

// stepper moves a fake clock under a Bucket's callers, which run in
// goroutines: one millisecond at a time, each step only once every caller
// is asleep again. rig and classRig drive their Buckets with it.
type stepper struct {
	t   *testing.T
	clk *clocktest.Clock
	b   *limiter.Bucket
	// open counts the callers that have not returned.
	open *atomic.Int64
}

// at is the clock's instant as an offset from storetest.Base.
func (s stepper) at() time.Duration { return s.clk.Now().Sub(storetest.Base) }

// background is the number of timers that are not callers' sleeps: the
// probe while the Bucket is not shared.
func (s stepper) background() int {
	if s.b.Mode() == limiter.ModeShared {
		return 0
	}
	return 1
}

// settle waits until every open caller sleeps on a timer, or waits in
// line behind its class's head while a floor holds the class back.
func (s stepper) settle() {
	s.t.Helper()
	if !testenv.Within(10*time.Second, func() bool {
		return s.clk.Timers() == int(s.open.Load())-limiter.FloorQueued(s.b)+s.background()
	}) {
		s.t.Fatalf("at +%v: %d timers, want %d callers asleep (%d more in line) and %d background",
			s.at(), s.clk.Timers(), int(s.open.Load())-limiter.FloorQueued(s.b), limiter.FloorQueued(s.b), s.background())
	}
}

// wake runs f, which wakes n sleepers, and waits until they sleep again.
func (s stepper) wake(n int, f func()) {
	armed := s.clk.Armed()
	f()
	s.clk.WaitArmed(s.t, armed+n)
	s.settle()
}

// advance moves the clock by d, one millisecond at a time.
func (s stepper) advance(d time.Duration) {
	for end := s.clk.Now().Add(d); s.clk.Now().Before(end); {
		s.clk.Advance(time.Millisecond)
		s.settle()
	}
}

// TestFallbackStartsAfterTheSharedBookings: at 20/s with two replicas, four
// tokens are booked in the shared bucket 50–200 ms ahead when it fails.
// They are still served; the local bucket (10/s, the replica's share)
// must start after them. It used to start at once, so the first second of
// an outage saw the booked tokens and the local rate together (35 instead
// of 20 deliveries in the fault test).
func TestFallbackStartsAfterTheSharedBookings(t *testing.T) {
	r := newRig(t, 20, 5, 2, limiter.Options{})
	if _, err := r.b.State(context.Background()); err != nil { // learns 2 replicas
		t.Fatal(err)
	}
	r.wait(5) // the burst, at once
	for range 4 {
		r.wait(1) // reserved at +50, +100, +150, +200 ms
	}
	r.store.down.Store(true)
	r.wait(1)
	if r.b.Mode() != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local", r.b.Mode())
	}
	r.wait(1)
	r.advance(ms(500))
	want := []time.Duration{0, ms(50), ms(100), ms(150), ms(200), ms(300), ms(400)}
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v (local 10/s only after the shared bookings end at +200ms)", got, want)
	}
}

// TestRecoveryDrainsTheSharedBucket: a replica in local mode with tokens
// booked ahead finds Redis back, restarted empty (a full bucket). It must
// charge its local bookings, and the other replica's (about as many), and
// not let the new bucket's burst add to them: before, 44 deliveries came in
// the second after a restart, against 30.
func TestRecoveryDrainsTheSharedBucket(t *testing.T) {
	r := newRig(t, 20, 5, 2, limiter.Options{ProbeInterval: ms(100)})
	if _, err := r.b.State(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.store.down.Store(true)
	for range 3 {
		r.wait(1) // local 10/s from empty: +100, +200, +300 ms
	}
	// Redis restarts empty of state, so the bucket is full again.
	fresh, _ := limiter.NewMemory(20, 5)
	r.store.mu.Lock()
	r.store.m = fresh
	r.store.mu.Unlock()
	r.store.down.Store(false)
	r.advance(ms(100)) // the probe fires at +100ms, with +200 and +300 still booked
	if r.b.Mode() != limiter.ModeShared {
		t.Fatalf("mode = %s after the probe, want shared", r.b.Mode())
	}
	st := fresh.StatusAt(r.clk.Now())
	if st.Tokens > -3.99 {
		t.Fatalf("shared bucket after recovery holds %v tokens; want drained and charged with the 2 booked locally, times 2 replicas (-4)", st.Tokens)
	}
	r.wait(1) // the first shared grant comes after the fleet's bookings: -4 -1 at 20/s = +250ms from now
	r.advance(ms(400))
	want := []time.Duration{ms(100), ms(200), ms(300), ms(350)}
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v", got, want)
	}
}

// TestMisconfiguredStoreClosesTheBucket: a store that refuses the client
// is not an outage, whatever the policy: no local fallback, and Check says
// so at start.
func TestMisconfiguredStoreClosesTheBucket(t *testing.T) {
	for _, policy := range []limiter.Mode{limiter.ModeLocal, limiter.ModeOpen} {
		t.Run(string(policy), func(t *testing.T) {
			r := newRig(t, 20, 5, 1, limiter.Options{OnStoreError: policy, ProbeInterval: ms(100)})
			r.store.refuse.Store(true)
			if err := r.b.Check(context.Background()); !errors.Is(err, limiter.ErrMisconfigured) {
				t.Fatalf("Check = %v, want ErrMisconfigured", err)
			}
			if r.b.Mode() != limiter.ModeClosed {
				t.Fatalf("mode = %s, want closed", r.b.Mode())
			}
			if ok, _ := r.b.Allow(context.Background(), 1); ok {
				t.Fatal("Allow granted while misconfigured")
			}
			r.open.Add(1) // a closed caller waits on the recovery, not on a timer
			go func() {
				defer r.open.Add(-1)
				if err := r.b.Wait(context.Background(), 1); err == nil {
					r.mu.Lock()
					r.results = append(r.results, r.at())
					r.mu.Unlock()
				}
			}()
			r.clk.Advance(ms(100)) // the probe: still refused
			r.clk.WaitTimers(t, 1)
			if g := r.grants(); len(g) != 0 || r.b.Mode() != limiter.ModeClosed {
				t.Fatalf("granted %v, mode %s while still refused", g, r.b.Mode())
			}
			r.store.refuse.Store(false)
			r.clk.Advance(ms(100))
			deadline := time.Now().Add(5 * time.Second)
			for r.open.Load() > 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if g := r.grants(); len(g) != 1 || r.b.Mode() != limiter.ModeShared {
				t.Fatalf("after the fix: granted %v, mode %s; want one grant, shared", g, r.b.Mode())
			}
		})
	}
}

// TestUnknownShareAtStart: a replica that never reached the store does not
// know how many replicas share the bucket. Three of them starting during an
// outage used to run at the whole rate each (3×). Without a FallbackRate
// they stay closed; with one, they use it.
func TestUnknownShareAtStart(t *testing.T) {
	const rate, replicas = 20, 3
	fleet := func(fallback float64) int {
		total := 0
		for range replicas {
			clk := clocktest.New(storetest.Base)
			s := &trackedStore{clockedStore: newClockedStore(t, clk, rate, 5, 0)}
			s.down.Store(true)
			b, err := limiter.New(s, limiter.Options{Clock: clk, FallbackRate: fallback, ProbeInterval: time.Hour, Logger: discardLogger()})
			if err != nil {
				t.Fatal(err)
			}
			clk.WaitTimers(t, 1) // the heartbeat failed and sleeps
			for range 100 {
				if ok, _ := b.Allow(context.Background(), 1); ok {
					total++
				}
				clk.Advance(ms(100)) // 10 s in all
			}
			b.Close()
		}
		return total
	}
	if got := fleet(0); got != 0 {
		t.Errorf("3 replicas started during an outage without FallbackRate granted %d in 10 s, want 0 (closed)", got)
	}
	// With FallbackRate = rate/3 the fleet stays within the rate: 10 s at
	// 20/s, plus nothing for the local buckets start empty.
	if got, limit := fleet(rate/replicas), int(math.Ceil(1.1*rate*10)); got > limit || got < rate*10*8/10 {
		t.Errorf("3 replicas at FallbackRate %v granted %d in 10 s, want about %d and at most %d", float64(rate)/replicas, got, rate*10, limit)
	}
}

// trackedStore is a clockedStore that tracks replicas, as Redis does.
type trackedStore struct{ *clockedStore }

func (s *trackedStore) Heartbeat(context.Context, string, time.Duration) (int, error) {
	if err := s.fail(); err != nil {
		return 0, err
	}
	return max(1, s.replicas), nil
}

func (s *trackedStore) Leave(context.Context, string) error { return s.fail() }

// TestRateCutKeepsTheQueueInOrder: at 20/s, ten callers hold reservations
// 50–500 ms ahead when the rate is cut to 5/s. Each keeps its place and
// comes due at the new rate: 200 ms, 400 ms, ... It used to give its tokens
// back and take them again, which put every caller at the end of the
// queue together: a stall, then several due within a few milliseconds.
func TestRateCutKeepsTheQueueInOrder(t *testing.T) {
	r := newRig(t, 20, 5, 1, limiter.Options{MaxReserve: 10 * time.Second})
	r.wait(5)
	for range 10 {
		r.wait(1) // +50 ms ... +500 ms
	}
	r.advance(ms(10))
	r.change(10, func() { r.store.setRate(t, 5, 5) })
	r.advance(ms(2100))
	// Position p (tokens before it is due, at +10 ms: 0.8, 1.8, ... 9.8)
	// is due p/5 s after the change.
	want := []time.Duration{0}
	for p := 0.8; p < 10; p++ {
		want = append(want, ms(10)+time.Duration(math.Round(p/5*1000))*time.Millisecond)
	}
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v", got, want)
	}
}

// TestRateRiseBringsReservationsForward: the same queue, raised to 100/s,
// comes due at once in order.
func TestRateRiseBringsReservationsForward(t *testing.T) {
	r := newRig(t, 2, 1, 1, limiter.Options{MaxReserve: 10 * time.Second})
	r.wait(1)
	for range 4 {
		r.wait(1) // +0.5 s ... +2 s
	}
	r.change(4, func() { r.store.setRate(t, 100, 1) })
	r.advance(ms(50))
	want := []time.Duration{0, ms(10), ms(20), ms(30), ms(40)}
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v", got, want)
	}
}

// TestPauseMovesReservationsBehindIt: a pause keeps the queue and starts it
// when the pause ends.
func TestPauseMovesReservationsBehindIt(t *testing.T) {
	r := newRig(t, 10, 1, 1, limiter.Options{})
	r.wait(1)
	r.wait(1) // +100 ms
	r.wait(1) // +200 ms
	r.advance(ms(20))
	r.change(2, func() {
		if err := r.b.Pause(context.Background(), ms(400)); err != nil {
			t.Fatal(err)
		}
	})
	r.advance(ms(700))
	want := []time.Duration{0, ms(420 + 80), ms(420 + 180)}
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v", got, want)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if d := a[i] - b[i]; d < -time.Millisecond || d > time.Millisecond {
			return false
		}
	}
	return true
}

// TestAnnouncementEndsTheFallbackAtOnce: a replica in fallback that hears
// the store (its subscription is back, or another replica announced its
// recovery) probes at once instead of at its next ProbeInterval. Replicas
// that came back up to a second apart ran the shared rate and their local
// shares together: 42 deliveries in a second after a Sentinel promotion,
// against 40.
func TestAnnouncementEndsTheFallbackAtOnce(t *testing.T) {
	r := newRig(t, 20, 5, 2, limiter.Options{ProbeInterval: time.Hour})
	r.store.down.Store(true)
	if ok, _ := r.b.Allow(context.Background(), 1); ok || r.b.Mode() != limiter.ModeLocal {
		t.Fatalf("mode = %s, want local (from empty)", r.b.Mode())
	}
	r.store.down.Store(false)
	r.store.announce()
	deadline := time.Now().Add(10 * time.Second)
	for r.b.Mode() != limiter.ModeShared {
		if time.Now().After(deadline) {
			t.Fatal("still in fallback after an announcement, with the probe an hour away")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestCallersTurnedAwayLocallyGoSharedOnRecovery: callers that the local
// bucket told to come back later must, when they come back after the
// store recovered, take from the shared bucket. They used to keep taking
// from the old local bucket, whose grants after the recovery nobody
// charged: 44 deliveries in the second after a Sentinel promotion, at
// 30/s with burst 5.
func TestCallersTurnedAwayLocallyGoSharedOnRecovery(t *testing.T) {
	r := newRig(t, 20, 5, 2, limiter.Options{ProbeInterval: ms(50), MaxReserve: ms(100)})
	if _, err := r.b.State(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.store.down.Store(true)
	for range 4 {
		r.wait(1) // local 10/s, horizon 100 ms: +100 ms booked, the rest told to come back at +100 ms
	}
	r.store.down.Store(false)
	r.advance(ms(50)) // the probe: back to shared, charged the 0.5 token still booked locally
	if r.b.Mode() != limiter.ModeShared {
		t.Fatalf("mode = %s, want shared", r.b.Mode())
	}
	r.advance(ms(450))
	// At +100 ms the local reservation is due, and the three callers come
	// back to the shared bucket (-1 at +50 ms, 20/s): +150, +200, +250 ms.
	// Before, they took from the old local bucket: +200, +300, +400 ms.
	want := []time.Duration{ms(100), ms(150), ms(200), ms(250)}
	if got := r.grants(); !equalDurations(got, want) {
		t.Fatalf("grants at %v, want %v", got, want)
	}
	if st := r.store.mem().StatusAt(r.clk.Now()); st.Tokens < 4.9 {
		t.Fatalf("shared tokens at +500 ms = %v, want refilled to 5 after its 3 grants", st.Tokens)
	}
}

// TestFallbackAssumesTheQueueKeptItsDepth: a replica that last saw the
// shared bucket booked 200 ms deep, 150 ms before the failure, must assume
// the other replicas kept it about that deep: its local bucket starts 200
// ms after the failure, not 50 ms. (A replica that noticed the failure
// late started its local share while the others' bookings still ran.)
func TestFallbackAssumesTheQueueKeptItsDepth(t *testing.T) {
	r := newRig(t, 20, 5, 2, limiter.Options{})
	if _, err := r.b.State(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.wait(5)
	for range 4 {
		r.wait(1) // booked to +200 ms, queue 4 tokens deep
	}
	r.advance(ms(150)) // the other replicas keep the queue 4 deep meanwhile
	for range 3 {
		if _, err := r.store.mem().TakeAt(r.clk.Now(), limiter.TakeRequest{Cost: 1, MaxWait: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	r.store.down.Store(true)
	r.grants()
	r.wait(1)
	r.advance(ms(500))
	// Local 10/s from +150 + 200 ms: due at +450 ms.
	if got := r.grants(); len(got) != 2 || !equalDurations(got[1:], []time.Duration{ms(450)}) {
		t.Fatalf("grants at %v; want the last shared one at +200 ms, then the local one at +450 ms", got)
	}
}

// TestObserverHearsPauses: the Observer hears this replica's own pause and
// one that another replica set, with who set it, so that a replica can log
// "bucket paused 3s by push-back from replica r2".
func TestObserverHearsPauses(t *testing.T) {
	type pause struct {
		d  time.Duration
		by string
	}
	heard := make(chan pause, 4)
	obs := &limiter.Observer{Paused: func(d time.Duration, by string) { heard <- pause{d, by} }}
	r := newRig(t, 10, 5, 1, limiter.Options{ReplicaID: "r1", Observer: obs})
	if err := r.b.Pause(context.Background(), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if p := <-heard; p != (pause{3 * time.Second, "r1"}) {
		t.Fatalf("own pause heard as %+v", p)
	}
	r.clk.Advance(4 * time.Second)
	r.store.mem().PauseByAt(r.clk.Now(), 2*time.Second, "r2")
	r.store.announce()
	select {
	case p := <-heard:
		if p != (pause{2 * time.Second, "r2"}) {
			t.Fatalf("another replica's pause heard as %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("another replica's pause was not heard")
	}
	// Another announcement during the same pause is not a new pause.
	r.store.announce()
	r.store.announce()
	r.clk.Advance(time.Second)
	r.store.mem().PauseByAt(r.clk.Now(), 3*time.Second, "r3")
	r.store.announce()
	if p := <-heard; p != (pause{3 * time.Second, "r3"}) {
		t.Fatalf("after repeated announcements, heard %+v; want only the new pause by r3", p)
	}
}

// reportingStore records the reports heartbeats carry.
type reportingStore struct {
	*trackedStore
	reports chan limiter.ReplicaReport
}

func (s *reportingStore) HeartbeatReport(ctx context.Context, id string, ttl time.Duration, r limiter.ReplicaReport) (int, error) {
	s.reports <- r
	return s.Heartbeat(ctx, id, ttl)
}

// TestHeartbeatCarriesTheReport: each heartbeat says the replica's mode,
// the tokens it granted so far and its waiting calls, for `bucket watch`.
func TestHeartbeatCarriesTheReport(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := &reportingStore{trackedStore: &trackedStore{clockedStore: newClockedStore(t, clk, 10, 5, 1)}, reports: make(chan limiter.ReplicaReport, 8)}
	b, err := limiter.New(s, limiter.Options{Clock: clk, Logger: discardLogger(), Lease: limiter.LeaseOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if r := <-s.reports; !reflect.DeepEqual(r, limiter.ReplicaReport{Mode: limiter.ModeShared}) { // the first beat, at start
		t.Fatalf("first report = %+v", r)
	}
	for range 3 {
		if ok, err := b.Allow(context.Background(), 1); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if err := b.Wait(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	clk.WaitTimers(t, 1)
	clk.Advance(500 * time.Millisecond) // the second beat
	if r := <-s.reports; !reflect.DeepEqual(r, limiter.ReplicaReport{Mode: limiter.ModeShared, Granted: 5}) {
		t.Fatalf("report after granting 5 tokens = %+v", r)
	}
}

// TestRecoveryWithAFallbackRateChargesTheFleet: replicas that started
// during an outage with FallbackRate = rate/3 never counted each other.
// Coming back, each must still charge the fleet's bookings (3 × its own),
// as the share it ran at implies, not only its own: three replicas back
// at once gave 35 deliveries in a second against 30 (20/s, burst 5).
func TestRecoveryWithAFallbackRateChargesTheFleet(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := &trackedStore{clockedStore: newClockedStore(t, clk, 30, 5, 0)}
	s.down.Store(true)
	b, err := limiter.New(s, limiter.Options{Clock: clk, FallbackRate: 10, ProbeInterval: ms(150), Logger: discardLogger(), Lease: limiter.LeaseOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	clk.WaitTimers(t, 1) // the failed first heartbeat sleeps
	done := make(chan error, 4)
	for range 4 {
		go func() { done <- b.Wait(context.Background(), 1) }()
	}
	// Local 10/s from empty: booked at +100, +200, +300 and +400 ms.
	clk.WaitTimers(t, 1+1+4) // heartbeat, probe, 4 callers
	s.down.Store(false)
	fresh, _ := limiter.NewMemory(30, 5) // Redis came back empty: full
	s.mu.Lock()
	s.m = fresh
	s.mu.Unlock()
	clk.Advance(ms(150)) // the probe at +150 ms: 2.5 tokens still booked here
	deadline := time.Now().Add(10 * time.Second)
	for b.Mode() != limiter.ModeShared && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	if b.Mode() != limiter.ModeShared {
		t.Fatal("did not recover")
	}
	// 30/s over a FallbackRate of 10/s: 3 replicas, each about as booked.
	if got := s.drained; len(got) != 1 || got[0] != 8 {
		t.Fatalf("drains = %v, want one charging ceil(2.5 × 3) = 8", got)
	}
	clk.Advance(time.Second)
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedProbesAreReported: every failed probe reaches
// Observer.StoreError, so an error counter keeps rising through an outage
// instead of stopping at the failure that started the fallback.
func TestFailedProbesAreReported(t *testing.T) {
	var errs atomic.Int64
	r := newRig(t, 20, 5, 1, limiter.Options{ProbeInterval: ms(100), Observer: &limiter.Observer{StoreError: func(error) { errs.Add(1) }}})
	r.store.down.Store(true)
	if ok, _ := r.b.Allow(context.Background(), 1); ok {
		t.Fatal("granted from an empty local bucket")
	}
	if n := errs.Load(); n != 1 {
		t.Fatalf("%d store errors reported at the failure, want 1", n)
	}
	r.clk.WaitTimers(t, 1) // the probe sleeps
	for i := range 3 {
		armed := r.clk.Armed()
		r.clk.Advance(ms(100))
		r.clk.WaitArmed(t, armed+1) // the probe failed and sleeps again
		if n := errs.Load(); n != int64(2+i) {
			t.Fatalf("%d store errors after %d failed probes, want %d", n, i+1, 2+i)
		}
	}
	if n := errs.Load(); n != 4 {
		t.Fatalf("%d store errors after 3 failed probes, want 4", n)
	}
}

// TestWaitBooksAtOnceBeyondAHorizonTooShort: a replica whose horizon
// (MaxReserve, or its callers times the replicas) is shorter than the queue
// the store holds is turned away; the answer shows the queue's depth, and
// the caller books its place at once. Before, it waited outside until the
// queue's end came within its horizon (+1.1 s here) and booked then,
// behind every request made meanwhile: a caller of the same replica that
// asked after it went first (at 1,000 replicas, 500 ms late in a 3 s
// queue).
func TestWaitBooksAtOnceBeyondAHorizonTooShort(t *testing.T) {
	r := newRig(t, 10, 1, 1, limiter.Options{MaxReserve: time.Second})
	// Another replica's reservations: the queue ends 2 s ahead.
	for range 21 {
		if _, err := r.store.mem().TakeAt(r.clk.Now(), limiter.TakeRequest{Cost: 1, MaxWait: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	r.wait(1)
	if n := r.store.takes.Load(); n != 2 {
		t.Fatalf("%d store calls before the caller sleeps, want 2: turned away, then booked at once", n)
	}
	r.advance(ms(2100))
	if got, want := r.grants(), []time.Duration{ms(2100)}; !equalDurations(got, want) {
		t.Fatalf("granted at %v, want %v: its place at the queue's end when it asked", got, want)
	}
}
