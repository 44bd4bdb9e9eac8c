package limiter_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// slowStore is a clockedStore whose answers come back late: each Take runs
// at once and its answer takes the next lag of lags to return, on the fake
// clock.
type slowStore struct {
	*clockedStore
	lags answerLags
	mu   sync.Mutex
	// costs are the costs asked for, in order.
	costs []int
}

func (s *slowStore) Take(ctx context.Context, req limiter.TakeRequest) (limiter.TakeResult, error) {
	res, err := s.clockedStore.Take(ctx, req)
	s.mu.Lock()
	s.costs = append(s.costs, req.Cost)
	s.mu.Unlock()
	s.lags.wait(s.clk)
	return res, err
}

// answerLags are the lags of a slow store's answers, in order: wait
// sleeps the next one on the fake clock (none once they run out).
type answerLags struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *answerLags) wait(clk *clocktest.Clock) {
	l.mu.Lock()
	var lag time.Duration
	if len(l.d) > 0 {
		lag, l.d = l.d[0], l.d[1:]
	}
	l.mu.Unlock()
	if lag > 0 {
		<-clk.NewTimer(lag).C()
	}
}

// TestLateReservationAsksAgain: at 10/s with a burst of 2, six callers ask
// at 0: two go at once, the others are due at +100, +200, +300 and +400 ms.
// The answer of the one due at +200 comes back at +350 ms, past its slot by
// more than the burst allows beside the refill (1 + 1.5 > 2). It used to go
// out at once, 50 ms before the slot at +400 and 50 ms after the one at
// +300; it now asks again and goes out at the next free slot, +500 ms,
// giving back nothing (the bucket could not have held it: it would have
// refilled past its burst). When its answer comes back at +250 ms instead
// (1 + 0.5 ≤ 2), it goes out then. It asks again once: when the second
// answer comes back late too, it goes out then.
func TestLateReservationAsksAgain(t *testing.T) {
	for _, c := range []struct {
		lag, again time.Duration // of the late answer, and of its second ask's
		want       []time.Duration
		takes      int64
	}{
		{ms(350), 0, []time.Duration{0, 0, ms(100), ms(300), ms(400), ms(500)}, 7},
		{ms(250), 0, []time.Duration{0, 0, ms(100), ms(250), ms(300), ms(400)}, 6},
		// Late again: it goes out then, rather than never.
		{ms(350), ms(350), []time.Duration{0, 0, ms(100), ms(300), ms(400), ms(700)}, 7},
	} {
		clk := clocktest.New(storetest.Base)
		cs := newClockedStore(t, clk, 10, 2, 1)
		s := &slowStore{clockedStore: cs, lags: answerLags{d: []time.Duration{0, 0, 0, c.lag, 0, 0, c.again}}}
		r := &rig{t: t, clk: clk, store: cs}
		r.b = newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}}, cs.watched)
		for range 6 {
			r.wait(1)
		}
		r.advance(ms(800))
		if got := r.grants(); !equalDurations(got, c.want) {
			t.Errorf("answer back after %v: grants at %v, want %v", c.lag, got, c.want)
		}
		if got := cs.takes.Load(); got != c.takes {
			t.Errorf("answer back after %v: %d takes, want %d", c.lag, got, c.takes)
		}
		if got := cs.refunded.Load(); got != 0 {
			t.Errorf("answer back after %v: %d refunded, want 0", c.lag, got)
		}
		if got, want := r.b.Stats().Retimed, c.takes-6; got != want {
			t.Errorf("answer back after %v: Stats().Retimed = %d, want %d", c.lag, got, want)
		}
	}
}

// TestLateGrantAsksAgain: at 10/s with a burst of 5, a caller asks for 2
// tokens at 0 from the full bucket (3 left) and its answer takes 500 ms to
// come back, its Bucket's first: the bucket refilled to its burst
// meanwhile, and five callers asking then take all 5. The late grant used
// to go out beside them, 7 tokens at +500 where the bucket holds 5 (and
// 16 in the second from +500, against rate + burst = 15). The bucket
// could not have held its tokens that long (3 + 2 + 5 > 5): it now asks
// again, quickly granted from the full bucket, and the others go out at
// its pace, 3 at once and the rest 100 ms apart.
func TestLateGrantAsksAgain(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	cs := newClockedStore(t, clk, 10, 5, 1)
	s := &slowStore{clockedStore: cs, lags: answerLags{d: []time.Duration{ms(500)}}}
	r := &rig{t: t, clk: clk, store: cs}
	r.b = newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}}, cs.watched)
	r.wait(2)
	r.advance(ms(500))
	for range 5 {
		r.wait(1)
	}
	r.advance(ms(500))
	if got, want := r.grants(), []time.Duration{ms(500), ms(500), ms(500), ms(500), ms(600), ms(700)}; !equalDurations(got, want) {
		t.Errorf("grants at %v, want %v", got, want)
	}
	if got, want := r.b.Stats().Retimed, int64(1); got != want {
		t.Errorf("Stats().Retimed = %d, want %d", got, want)
	}
}

// TestLateGrantBurstOfTheCost: at 1/s, a caller asks for 1 token from a
// full bucket and its answer, its Bucket's first, comes back 5 ms later:
// past the 1 ms timer slack, so it asks again. Tokens go back whole, and
// the bucket could have held only 0.995 of this one: with a burst of 1
// nothing goes back and the second ask waits one token's refill, going out
// at +1 s; with a burst of 2 the second ask takes the other token at once.
func TestLateGrantBurstOfTheCost(t *testing.T) {
	for _, c := range []struct {
		burst int
		want  time.Duration
	}{
		{1, time.Second},
		{2, ms(5)},
	} {
		clk := clocktest.New(storetest.Base)
		cs := newClockedStore(t, clk, 1, c.burst, 1)
		s := &slowStore{clockedStore: cs, lags: answerLags{d: []time.Duration{ms(5)}}}
		r := &rig{t: t, clk: clk, store: cs}
		r.b = newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}}, cs.watched)
		r.wait(1)
		r.advance(ms(1500))
		if got := r.grants(); !equalDurations(got, []time.Duration{c.want}) {
			t.Errorf("burst %d: granted at %v, want %v", c.burst, got, c.want)
		}
		if got := r.b.Stats().Retimed; got != 1 {
			t.Errorf("burst %d: Stats().Retimed = %d, want 1", c.burst, got)
		}
	}
}

// lagClock is a fake clock whose first timer of a given length fires lag
// after it was due: a wake-up the scheduler delayed, on one goroutine only.
type lagClock struct {
	*clocktest.Clock
	mu   sync.Mutex
	d    time.Duration // the timer length to delay, once
	lag  time.Duration
	done bool
}

func (c *lagClock) NewTimer(d time.Duration) limiter.Timer {
	c.mu.Lock()
	if !c.done && d == c.d {
		c.done = true
		d += c.lag
	}
	c.mu.Unlock()
	return c.Clock.NewTimer(d)
}

// TestLayeredReservationWokenLateKeepsItsKeyApart: the shared bucket (10/s,
// burst 1) and a per-key layer (10/s, burst 1: 100 ms apart, a lateness of
// 25 ms) hand three messages of one key the instants 0, +100 and +200 ms.
// The wake-up of the one due at +100 comes 80 ms late, at +180, while the
// next wakes on time at +200. It used to go out at +180, 20 ms before the
// key's next message: the provider saw the key at five times its rate. A
// wake-up later than the layers' lateness now charges the layers for the
// move (as a push that moves it back does); the key's next message was
// charged for +200, so the move does not fit, and it is decided again,
// after that message: at +300. When it wakes 20 ms late (within the
// lateness), it goes out then, at +120.
func TestLayeredReservationWokenLateKeepsItsKeyApart(t *testing.T) {
	for _, c := range []struct {
		lag  time.Duration
		want []time.Duration
	}{
		{ms(80), []time.Duration{0, ms(200), ms(300)}},
		{ms(20), []time.Duration{0, ms(120), ms(200)}},
	} {
		clk := &lagClock{Clock: clocktest.New(storetest.Base), d: ms(100), lag: c.lag}
		s := newLayeredClocked(t, clk.Clock, 10, 1, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 10, Burst: 1})
		r := &rig{t: t, clk: clk.Clock}
		var err error
		r.b, err = limiter.New(s, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(), ProbeInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			r.waitN(keyReq("a"))
		}
		r.advance(ms(400))
		r.b.Close()
		got := r.grants()
		if !equalDurations(got, c.want) {
			t.Errorf("woken %v late: the key's messages went out at %v, want %v", c.lag, got, c.want)
		}
	}
}

// slowLayered is a layeredClocked whose TakeLayers answers come back late:
// each runs at once and its answer takes the next lag of lags to return,
// on the fake clock.
type slowLayered struct {
	*layeredClocked
	lags answerLags
}

func (s *slowLayered) TakeLayers(ctx context.Context, req limiter.LayerRequest) (limiter.LayerResult, error) {
	res, err := s.layeredClocked.TakeLayers(ctx, req)
	s.lags.wait(s.clk)
	return res, err
}

// TestLayeredGrantArrivingLateKeepsItsKeyApart: with room in the shared
// bucket (100/s, burst 10) and a per-key layer of 5/s, burst 1 (200 ms
// apart, a lateness of 25 ms), a message of key a is granted at 0 but its
// answer takes 190 ms to come back; the key's next message, refused until
// +200, is granted then. The first used to go out when its answer came, at
// +190, 10 ms before the second. A grant that arrives later than the
// layers' lateness now charges the layers for the move, as a reservation
// woken late does, so the second goes out 200 ms after the first.
func TestLayeredGrantArrivingLateKeepsItsKeyApart(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := &slowLayered{
		layeredClocked: newLayeredClocked(t, clk, 100, 10, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 5, Burst: 1}),
		lags:           answerLags{d: []time.Duration{0, ms(190)}},
	}
	r := &rig{t: t, clk: clk}
	var err error
	r.b, err = limiter.New(s, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(), ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer r.b.Close()
	r.waitN(keyReq("x")) // a quick answer: the Bucket learns the store's clock
	r.waitN(keyReq("a")) // granted at 0, answered at +190
	r.waitN(keyReq("a")) // refused until +200
	r.advance(ms(500))
	if got, want := r.grants(), []time.Duration{0, ms(190), ms(390)}; !equalDurations(got, want) {
		t.Errorf("grants at %v, want %v", got, want)
	}
}

// TestLayeredFirstGrantArrivingLateKeepsItsKeyApart is
// TestLayeredGrantArrivingLateKeepsItsKeyApart for a replica's first
// answer: it is the quickest that replica has seen, so the skew estimate
// alone cannot tell it was slow. Replica A's request of key a went out at
// 0 and its grant came back at +190: at worst 190 ms late, the estimate's
// spread. Replica B, whose answers are quick, asked for the key's next
// message at 0 and was refused until +200. A used to go out at +190 and B
// at +200, 10 ms apart; A now charges the layers for the move, and B goes
// out 200 ms after it.
func TestLayeredFirstGrantArrivingLateKeepsItsKeyApart(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	shared := newLayeredClocked(t, clk, 100, 10, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 5, Burst: 1})
	r := &rig{t: t, clk: clk}
	r.b = slowReplica(t, clk, shared, ms(190))
	r.waitN(keyReq("a")) // granted at 0, answered at +190: A's first answer
	r.b = slowReplica(t, clk, shared)
	r.waitN(keyReq("a")) // refused until +200
	r.advance(ms(500))
	if got, want := r.grants(), []time.Duration{ms(190), ms(390)}; !equalDurations(got, want) {
		t.Errorf("the key's messages went out at %v, want %v", got, want)
	}
}

// slowReplica returns a Bucket on s (one replica of several sharing it)
// whose answers come back lags late, in order, closed when the test ends.
func slowReplica(t *testing.T, clk *clocktest.Clock, s *layeredClocked, lags ...time.Duration) *limiter.Bucket {
	t.Helper()
	b, err := limiter.New(&slowLayered{layeredClocked: s, lags: answerLags{d: lags}},
		limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(), ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestLayeredReservationOfSlowReplicaKeepsItsKeyApart: replica A's answers
// all come back 100 ms late, so its skew estimate places the store's clock
// 100 ms late and it wakes every reservation 100 ms after its slot, on
// time by its own estimate. At 10/s (burst 1) with a per-key layer of
// 10/s, A's message of key a is reserved for +200 and replica B's next one
// of the key for +300. A used to go out at +300 beside B's; it now counts
// its wake-up as late by the estimate's spread, finds the key charged
// after it, and is decided again: it goes out at +400.
func TestLayeredReservationOfSlowReplicaKeepsItsKeyApart(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	shared := newLayeredClocked(t, clk, 10, 1, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 10, Burst: 1})
	a, b := slowReplica(t, clk, shared, ms(100), ms(100)), slowReplica(t, clk, shared)
	r := &rig{t: t, clk: clk}
	r.b = a
	r.waitN(keyReq("x")) // granted at 0, answered at +100
	r.b = b
	r.waitN(keyReq("y")) // reserved for +100
	r.advance(ms(100))
	r.b = a
	r.waitN(keyReq("a")) // at +100: reserved for +200, answered at +200
	r.advance(ms(150))
	r.b = b
	r.waitN(keyReq("a")) // at +250: reserved for +300
	r.advance(ms(300))
	if got, want := r.grants(), []time.Duration{ms(100), ms(100), ms(300), ms(400)}; !equalDurations(got, want) {
		t.Errorf("grants at %v, want %v", got, want)
	}
}

// TestPaidSlotAskedOneTripAhead: a per-key delay layer of 5/s, burst 1;
// key k's first message goes out at 0 and its second is refused, with a
// slot booked at +200 ms. A backend hands the second on ahead of its slot
// (100 ms before it) so that the store's answer is not late for it. It
// used to ask the store at once and go out when the answer came, 100 ms
// (70 ms with answers 30 ms slow) closer to the key's first message than
// the layer's 200 ms. It now waits until one recent round trip before the
// slot, asks, and goes out at the slot. (With answers 30 ms slow, the
// first message's grant came 30 ms late and paid its layer for the move:
// the slot is at +230 ms, which the Bucket places at +260.)
func TestPaidSlotAskedOneTripAhead(t *testing.T) {
	for _, lag := range []time.Duration{0, ms(30)} {
		clk := clocktest.New(storetest.Base)
		layer := limiter.Layer{Name: "per-key", Keyed: true, Rate: 5, Burst: 1, OnExceed: limiter.ActionDelay}
		s := &slowLayered{
			layeredClocked: newLayeredClocked(t, clk, 1000, 1000, 1, layer),
			lags:           answerLags{d: []time.Duration{lag, lag, lag}},
		}
		r := &rig{t: t, clk: clk}
		var err error
		r.b, err = limiter.New(s, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(), ProbeInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		r.waitN(keyReq("k")) // out at 0, answered at +lag
		r.advance(lag)
		booked := make(chan error, 1)
		r.open.Add(1)
		go func() {
			defer r.open.Add(-1)
			booked <- r.b.WaitN(context.Background(), keyReq("k"))
		}()
		r.settle()
		r.advance(lag)
		var le *limiter.LimitError
		if err := <-booked; !errors.As(err, &le) || !le.Reserved {
			t.Fatalf("answers %v slow: the key's second message = %v, want a slot booked", lag, err)
		}
		slot := le.Slot()
		due := slot.Due.Sub(storetest.Base) // +200ms, +230 with the first answer late (paid for)
		r.grants()
		r.advance(due - ms(100) - 2*lag)
		req := keyReq("k")
		req.Paid = []limiter.PaidSlot{slot}
		r.waitN(req)
		r.advance(ms(300))
		// At its slot as the Bucket places it: its answers all came lag
		// after the store's instant, which it counts as the clocks'
		// offset (skewMeter).
		if got, want := r.grants(), due+lag; !equalDurations(got, []time.Duration{want}) {
			t.Errorf("answers %v slow, handed on 100ms before its slot at +%v: went out at %v, want %v", lag, due, got, want)
		}
		r.b.Close()
	}
}
