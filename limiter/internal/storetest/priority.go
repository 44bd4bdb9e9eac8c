package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// PriorityStore is a store with priority classes driven at explicit
// instants, whose announced pushes the suite reads.
type PriorityStore interface {
	TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error)
	RefundClassAt(now time.Time, tokens int, class limiter.Priority) error
	DrainAt(now time.Time, debt int) error
	PauseAt(now time.Time, d time.Duration) error
	StatusAt(now time.Time) (limiter.State, error)
	// Pushes returns, in order, the pushes the store announced (through
	// its Watch) since the last call.
	Pushes(t *testing.T) []backend.Push
}

// PriorityFactory returns a new, full bucket with the given rate and
// burst, already watched.
type PriorityFactory func(t *testing.T, rate float64, burst int) PriorityStore

type pop int

const (
	ptake pop = iota
	prefund
	pdrain
	ppause
	pstatus
)

const (
	high   = limiter.PriorityHigh
	normal = limiter.PriorityNormal
	low    = limiter.PriorityLow
)

// pstep is one call at Base+at and what it must answer.
type pstep struct {
	at    time.Duration
	op    pop
	class limiter.Priority // ptake: the request's; prefund: the queue's
	cost  int              // ptake, prefund; pdrain: the debt
	// maxWait is the take's horizon, or ppause's duration; lowShare the
	// take's MinShare of low.
	maxWait  time.Duration
	lowShare float64

	granted   bool
	floor     bool // refused by a lower class's MinShare
	wait      time.Duration
	remaining float64 // ptake, pstatus: the tokens
	in        limiter.Priority
	counter   float64        // in's push counter (TakeResult.Pushed)
	pushes    []backend.Push // the take's announcements; At is the step's instant

	reserved, pushed limiter.Shares // pstatus
}

// push is a Push of class, by tokens, to counter.
func push(class limiter.Priority, tokens, counter float64) backend.Push {
	return backend.Push{Class: class, Tokens: tokens, Counter: counter}
}

// shares returns Shares indexed by Priority.
func shares(h, n, l float64) limiter.Shares {
	var s limiter.Shares
	s[high], s[normal], s[low] = h, n, l
	return s
}

// sameClass is the "reservations queue in order" case in one class: a
// class alone behaves as a bucket without classes, and announces nothing.
func sameClass(c limiter.Priority) []pstep {
	var reserved limiter.Shares
	reserved[c] = 2.5
	return []pstep{
		{op: ptake, class: c, cost: 5, granted: true, remaining: 0, in: c},
		{op: ptake, class: c, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: c},
		{op: ptake, class: c, cost: 1, maxWait: time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -2, in: c},
		{at: 150 * time.Millisecond, op: ptake, class: c, cost: 2, maxWait: time.Second, granted: true, wait: 250 * time.Millisecond, remaining: -2.5, in: c},
		{at: 150 * time.Millisecond, op: ptake, class: c, cost: 5, maxWait: 100 * time.Millisecond, wait: 250 * time.Millisecond, remaining: -2.5, in: c},
		{at: 150 * time.Millisecond, op: pstatus, remaining: -2.5, reserved: reserved},
	}
}

var priorityCases = []struct {
	name  string
	rate  float64
	burst int
	steps []pstep
}{
	{"normal alone is the bucket without classes", 10, 5, sameClass(normal)},
	{"high alone is the bucket without classes", 10, 5, sameClass(high)},
	{"low alone is the bucket without classes", 10, 5, sameClass(low)},
	{"high arrival after low reservations gets the next slot", 10, 2, []pstep{
		{op: ptake, class: low, cost: 2, granted: true, remaining: 0, in: low},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: low},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -2, in: low},
		// Ahead of both low reservations, which move back by one token.
		{op: ptake, class: high, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -3, in: high,
			pushes: []backend.Push{push(low, 1, 1)}},
		{op: pstatus, remaining: -3, reserved: shares(1, 0, 2), pushed: shares(0, 0, 1)},
		// A later low take queues behind, and sees the counter.
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 400 * time.Millisecond, remaining: -4, in: low, counter: 1},
		// The refill repays the high reservation first.
		{at: 100 * time.Millisecond, op: pstatus, remaining: -3, reserved: shares(0, 0, 3), pushed: shares(0, 0, 1)},
		{at: 150 * time.Millisecond, op: pstatus, remaining: -2.5, reserved: shares(0, 0, 2.5), pushed: shares(0, 0, 1)},
	}},
	{"three ranks, and the refill repays the front first", 10, 1, []pstep{
		{op: ptake, class: normal, cost: 1, granted: true, remaining: 0, in: normal},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: low},
		{op: ptake, class: normal, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -2, in: normal,
			pushes: []backend.Push{push(low, 1, 1)}},
		{op: ptake, class: high, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -3, in: high,
			pushes: []backend.Push{push(normal, 1, 1), push(low, 1, 2)}},
		{op: ptake, class: normal, cost: 1, maxWait: time.Second, granted: true, wait: 300 * time.Millisecond, remaining: -4, in: normal, counter: 1,
			pushes: []backend.Push{push(low, 1, 3)}},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 500 * time.Millisecond, remaining: -5, in: low, counter: 3},
		{op: pstatus, remaining: -5, reserved: shares(1, 2, 2), pushed: shares(0, 1, 3)},
		// High due at 100ms, normal at 200 and 300ms, low at 400 and 500ms.
		{at: 100 * time.Millisecond, op: pstatus, remaining: -4, reserved: shares(0, 2, 2), pushed: shares(0, 1, 3)},
		{at: 250 * time.Millisecond, op: pstatus, remaining: -2.5, reserved: shares(0, 0.5, 2), pushed: shares(0, 1, 3)},
		{at: 420 * time.Millisecond, op: pstatus, remaining: -0.8, reserved: shares(0, 0, 0.8), pushed: shares(0, 1, 3)},
		{at: time.Second, op: pstatus, remaining: 1, pushed: shares(0, 1, 3)},
	}},
	{"a high take beyond the horizon changes nothing", 10, 1, []pstep{
		{op: ptake, class: low, cost: 1, granted: true, remaining: 0, in: low},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: low},
		{op: ptake, class: high, cost: 1, wait: 100 * time.Millisecond, remaining: -1, in: high},
		{op: pstatus, remaining: -1, reserved: shares(0, 0, 1)},
	}},
	{"refund of a low reservation", 10, 1, []pstep{
		{op: ptake, class: low, cost: 1, granted: true, remaining: 0, in: low},
		{op: ptake, class: high, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: high},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -2, in: low},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 300 * time.Millisecond, remaining: -3, in: low},
		{op: pstatus, remaining: -3, reserved: shares(1, 0, 2)},
		{op: prefund, class: low, cost: 1},
		{op: pstatus, remaining: -2, reserved: shares(1, 0, 1)},
		// A refund of no class (high's queue) gives back the front.
		{op: prefund, class: high, cost: 1},
		{op: pstatus, remaining: -1, reserved: shares(0, 0, 1)},
		{op: prefund, class: high, cost: 1},
		{op: pstatus, remaining: 0},
		// A low refund beyond the low queue only gives tokens back.
		{op: ptake, class: high, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: high},
		{op: prefund, class: low, cost: 1},
		{op: pstatus, remaining: 0},
	}},
	{"min_share: high jumps 75% of the refill, then waits for it", 10, 4, []pstep{
		{op: ptake, class: low, lowShare: 0.25, cost: 4, granted: true, remaining: 0, in: low},
		{op: ptake, class: low, lowShare: 0.25, cost: 4, maxWait: 10 * time.Second, granted: true, wait: 400 * time.Millisecond, remaining: -4, in: low},
		// A whole burst of allowance: 3 of its 4 tokens are spent.
		{op: ptake, class: high, lowShare: 0.25, cost: 3, maxWait: 10 * time.Second, granted: true, wait: 300 * time.Millisecond, remaining: -7, in: high,
			pushes: []backend.Push{push(low, 3, 3)}},
		// 1 token left, 2 asked: refused until 4/3 tokens more refill.
		{op: ptake, class: high, lowShare: 0.25, cost: 2, maxWait: 10 * time.Second, floor: true, wait: 133334 * time.Microsecond, remaining: -7, in: high},
		{op: pstatus, remaining: -7, reserved: shares(3, 0, 4), pushed: shares(0, 0, 3)},
		// 2 tokens refilled: 1.5 more allowance, 2.5 in all.
		{at: 200 * time.Millisecond, op: ptake, class: high, lowShare: 0.25, cost: 2, maxWait: 10 * time.Second, granted: true, wait: 300 * time.Millisecond, remaining: -7, in: high,
			pushes: []backend.Push{push(low, 2, 5)}},
		{at: 200 * time.Millisecond, op: ptake, class: high, lowShare: 0.25, cost: 1, maxWait: 10 * time.Second, floor: true, wait: 66667 * time.Microsecond, remaining: -7, in: high},
		{at: 200 * time.Millisecond, op: pstatus, remaining: -7, reserved: shares(3, 0, 4), pushed: shares(0, 0, 5)},
		// Low itself, normal without lower reservations and high without a
		// share are not held back.
		{at: 200 * time.Millisecond, op: ptake, class: low, lowShare: 0.25, cost: 1, maxWait: 10 * time.Second, granted: true, wait: 800 * time.Millisecond, remaining: -8, in: low, counter: 5},
		{at: 200 * time.Millisecond, op: ptake, class: high, cost: 1, maxWait: 10 * time.Second, granted: true, wait: 400 * time.Millisecond, remaining: -9, in: high,
			pushes: []backend.Push{push(low, 1, 6)}},
		// A pause adds to the floor's wait.
		{at: 200 * time.Millisecond, op: ppause, maxWait: time.Second},
		{at: 200 * time.Millisecond, op: ptake, class: high, lowShare: 0.25, cost: 1, maxWait: 10 * time.Second, floor: true, wait: 1066667 * time.Microsecond, remaining: -9, in: high},
	}},
	{"a full bucket restores the allowance", 10, 2, []pstep{
		{op: ptake, class: low, lowShare: 0.5, cost: 2, granted: true, remaining: 0, in: low},
		{op: ptake, class: low, lowShare: 0.5, cost: 1, maxWait: 10 * time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: low},
		// A burst of 2 at a share of 0.5: 2 tokens of allowance, all spent.
		{op: ptake, class: high, lowShare: 0.5, cost: 2, maxWait: 10 * time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -3, in: high,
			pushes: []backend.Push{push(low, 2, 2)}},
		{op: ptake, class: high, lowShare: 0.5, cost: 1, maxWait: 10 * time.Second, floor: true, wait: 200 * time.Millisecond, remaining: -3, in: high},
		{at: 10 * time.Second, op: pstatus, remaining: 2, pushed: shares(0, 0, 2)},
		{at: 10 * time.Second, op: ptake, class: low, lowShare: 0.5, cost: 2, granted: true, remaining: 0, in: low, counter: 2},
		{at: 10 * time.Second, op: ptake, class: low, lowShare: 0.5, cost: 1, maxWait: 10 * time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: low, counter: 2},
		{at: 10 * time.Second, op: ptake, class: high, lowShare: 0.5, cost: 2, maxWait: 10 * time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -3, in: high,
			pushes: []backend.Push{push(low, 2, 4)}},
	}},
	{"a drain's debt is at the front of the queue", 10, 1, []pstep{
		{op: ptake, class: low, cost: 1, granted: true, remaining: 0, in: low},
		{op: ptake, class: normal, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1, in: normal},
		{op: ptake, class: low, cost: 1, maxWait: time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -2, in: low},
		{op: pdrain, cost: 4},
		{op: pstatus, remaining: -4, reserved: shares(2, 1, 1)},
		// High queues behind the debt, ahead of normal and low.
		{op: ptake, class: high, cost: 1, maxWait: time.Second, granted: true, wait: 300 * time.Millisecond, remaining: -5, in: high,
			pushes: []backend.Push{push(normal, 1, 1), push(low, 1, 1)}},
		{at: 250 * time.Millisecond, op: pstatus, remaining: -2.5, reserved: shares(0.5, 1, 1), pushed: shares(0, 1, 1)},
	}},
	{"a partly covered take pushes only what it lacks", 10, 2, []pstep{
		{op: ptake, class: low, cost: 1, granted: true, remaining: 1, in: low},
		{at: 50 * time.Millisecond, op: ptake, class: low, cost: 2, maxWait: time.Second, granted: true, wait: 50 * time.Millisecond, remaining: -0.5, in: low},
		{at: 50 * time.Millisecond, op: pstatus, remaining: -0.5, reserved: shares(0, 0, 0.5)},
		{at: 50 * time.Millisecond, op: ptake, class: high, cost: 1, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1.5, in: high,
			pushes: []backend.Push{push(low, 1, 1)}},
		{at: 50 * time.Millisecond, op: pstatus, remaining: -1.5, reserved: shares(1, 0, 0.5), pushed: shares(0, 0, 1)},
	}},
}

// RunPriority runs the priority classes' step tables against stores made
// by newStore: the order of the classes' reservations, pushes and their
// announcements, refunds by class, and the MinShare floor.
func RunPriority(t *testing.T, newStore PriorityFactory) {
	for _, c := range priorityCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, c.rate, c.burst)
			for i, st := range c.steps {
				now := Base.Add(st.at)
				switch st.op {
				case ptake:
					req := backend.TakeRequest{Cost: st.cost, MaxWait: st.maxWait, Priority: st.class, MinShare: shares(0, 0, st.lowShare)}
					res, err := s.TakeAt(now, req)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if res.Granted != st.granted || res.Floor != st.floor || res.Wait != st.wait || !near(res.Remaining, st.remaining) || res.Class != st.in || !near(res.Pushed, st.counter) {
						t.Fatalf("step %d: take(%v, cost %d, maxWait %v, low share %v) at +%v = %+v\nwant granted %v floor %v wait %v remaining %v class %v pushed %v",
							i, st.class, st.cost, st.maxWait, st.lowShare, st.at, res, st.granted, st.floor, st.wait, st.remaining, st.in, st.counter)
					}
					if st.granted && res.Tokens != st.cost {
						t.Fatalf("step %d: %d tokens granted, want %d", i, res.Tokens, st.cost)
					}
					checkPushes(t, i, s.Pushes(t), st.pushes, now)
				case prefund:
					if err := s.RefundClassAt(now, st.cost, st.class); err != nil {
						t.Fatalf("step %d: refund: %v", i, err)
					}
				case ppause:
					if err := s.PauseAt(now, st.maxWait); err != nil {
						t.Fatalf("step %d: pause: %v", i, err)
					}
				case pdrain:
					if err := s.DrainAt(now, st.cost); err != nil {
						t.Fatalf("step %d: drain: %v", i, err)
					}
				case pstatus:
					got, err := s.StatusAt(now)
					if err != nil {
						t.Fatalf("step %d: status: %v", i, err)
					}
					if !near(got.Tokens, st.remaining) || !nearShares(got.Reserved, st.reserved) || !nearShares(got.Pushed, st.pushed) {
						t.Fatalf("step %d: status at +%v = tokens %v reserved %v pushed %v; want %v %v %v",
							i, st.at, got.Tokens, fmtShares(got.Reserved), fmtShares(got.Pushed), st.remaining, fmtShares(st.reserved), fmtShares(st.pushed))
					}
				}
			}
			checkPushes(t, len(c.steps), s.Pushes(t), nil, Base)
		})
	}
}

func checkPushes(t *testing.T, i int, got, want []backend.Push, at time.Time) {
	t.Helper()
	ok := len(got) == len(want)
	for k := 0; ok && k < len(got); k++ {
		g, w := got[k], want[k]
		ok = g.Class == w.Class && near(g.Tokens, w.Tokens) && near(g.Counter, w.Counter) && g.At.Equal(at)
	}
	if !ok {
		t.Fatalf("step %d: pushes announced %+v, want %+v at %v", i, got, want, at)
	}
}

func nearShares(a, b limiter.Shares) bool {
	for p := range a {
		if !near(a[p], b[p]) {
			return false
		}
	}
	return true
}

func fmtShares(s limiter.Shares) string {
	return fmt.Sprintf("{high %g normal %g low %g}", s[high], s[normal], s[low])
}

// PriorityLayeredStore is a layered store with priority classes driven at
// explicit instants.
type PriorityLayeredStore interface {
	LayeredClockedStore
	TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error)
}

// RunPriorityLayers runs a step table of layered takes with classes: the
// shared bucket of a layered take orders the classes as Take does, and
// RefundLayers gives a reservation back in its class's queue.
func RunPriorityLayers(t *testing.T, newStore LayeredFactory) {
	s, ok := newStore(t, 10, 1, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 100, Burst: 10}}).(PriorityLayeredStore)
	if !ok {
		t.Fatal("the layered store does not take without layers at explicit instants")
	}
	lr := func(p limiter.Priority, key string) backend.LayerRequest {
		return backend.LayerRequest{Cost: 1, MaxWait: time.Second, Keys: k(key), Priority: p}
	}
	take := func(i int, req backend.LayerRequest, wait time.Duration, in limiter.Priority, counter float64) backend.LayerResult {
		t.Helper()
		res, err := s.TakeLayersAt(Base, req)
		if err != nil || !res.Granted || res.Wait != wait || res.Class != in || !near(res.Pushed, counter) {
			t.Fatalf("step %d: TakeLayers(%v) = %+v, %v; want granted, wait %v, class %v, pushed %v", i, req.Priority, res, err, wait, in, counter)
		}
		return res
	}
	status := func(i int, reserved, pushed limiter.Shares) {
		t.Helper()
		st, err := s.StatusAt(Base)
		if err != nil || !nearShares(st.Reserved, reserved) || !nearShares(st.Pushed, pushed) {
			t.Fatalf("step %d: status = reserved %v pushed %v, %v; want %v %v", i, fmtShares(st.Reserved), fmtShares(st.Pushed), err, fmtShares(reserved), fmtShares(pushed))
		}
	}
	take(0, lr(low, "a"), 0, low, 0)
	lowRes := take(1, lr(low, "b"), 100*time.Millisecond, low, 0)
	// A plain take of the shared bucket queues behind, in its class.
	if res, err := s.TakeAt(Base, backend.TakeRequest{Cost: 1, MaxWait: time.Second, Priority: low}); err != nil || res.Wait != 200*time.Millisecond || res.Class != low {
		t.Fatalf("step 2: Take(low) = %+v, %v; want wait 200ms in low", res, err)
	}
	status(3, shares(0, 0, 2), shares(0, 0, 0))
	// High jumps both low reservations, on its key's layer too.
	take(4, lr(high, "c"), 100*time.Millisecond, high, 0)
	status(5, shares(1, 0, 2), shares(0, 0, 1))
	// Normal jumps low, behind high.
	take(6, lr(normal, "d"), 200*time.Millisecond, normal, 0)
	status(7, shares(1, 1, 2), shares(0, 0, 2))
	// The low reservation given back leaves the low queue.
	if err := s.RefundLayersAt(Base, lr(low, "b"), lowRes); err != nil {
		t.Fatal(err)
	}
	status(8, shares(1, 1, 1), shares(0, 0, 2))
	take(9, lr(low, "e"), 400*time.Millisecond, low, 2)
	// With low's share at 0.5, a burst of 1 allows one jump of 1 token;
	// the next normal take is refused until 2 tokens more refill.
	share := func(key string) backend.LayerRequest {
		return backend.LayerRequest{Cost: 1, MaxWait: time.Second, Keys: k(key), Priority: normal, MinShare: shares(0, 0, 0.5)}
	}
	take(10, share("f"), 300*time.Millisecond, normal, 0)
	res, err := s.TakeLayersAt(Base, share("g"))
	if err != nil || res.Granted || !res.Floor || res.Wait != 200*time.Millisecond || res.Class != normal || res.Limiting != "" {
		t.Fatalf("step 11: TakeLayers(normal) = %+v, %v; want refused by the floor for 200ms", res, err)
	}
	status(12, shares(1, 2, 2), shares(0, 0, 3))
	if st, err := s.LayerStatusAt(Base, "per-key", "g"); err != nil || !st.Full {
		t.Fatalf("step 13: the refused take's key = %+v, %v; want no charge", st, err)
	}
}
