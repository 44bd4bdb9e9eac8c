package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// LayeredClockedStore is a layered store driven at explicit instants.
type LayeredClockedStore interface {
	TakeLayersAt(now time.Time, req backend.LayerRequest) (backend.LayerResult, error)
	RefundLayersAt(now time.Time, req backend.LayerRequest, res backend.LayerResult) error
	DelayLayersAt(now time.Time, req backend.LayerRequest, res backend.LayerResult, from time.Time, by time.Duration) (bool, error)
	LayerStatusAt(now time.Time, layer, key string) (backend.LayerState, error)
	StatusAt(now time.Time) (limiter.State, error)
}

// LayeredFactory returns a new store: a full shared bucket with the given
// rate and burst, and the layers with no state.
type LayeredFactory func(t *testing.T, rate float64, burst int, layers []limiter.Layer) LayeredClockedStore

type lop int

const (
	ltake lop = iota
	lrefund
	lstatus // a layer's key
	lshared // the shared bucket
	ldelay  // DelayLayers of the take refundOf, by delay
)

// lstep is one call at Base+at (or at when, if set) and what it must answer.
type lstep struct {
	at   time.Duration
	when time.Time
	op   lop

	cost       int
	extra      int
	keys       map[string]string
	maxWait    time.Duration
	skipShared bool
	refundOf   int           // lrefund, ldelay: the index of the take step
	delay      time.Duration // ldelay
	paid       []limiter.PaidSlot
	// withPaid: ldelay moves the layers the take passed on a paid slot
	// too (the take's request without its Paid slots).
	withPaid bool

	granted  bool
	got      int // granted tokens, when not cost (extra)
	wait     time.Duration
	limiting string
	exceeded limiter.Action // "" when no layer refuses
	// reserved: the refusing delay layer booked the slot, for the key in
	// keys.
	reserved bool
	err      error
	// shadow is what the shadow layers decided (ltake).
	shadow []backend.ShadowDecision
	// shadowShared decides the shared bucket as a shadow
	// (LayerRequest.ShadowShared, with SkipShared).
	shadowShared bool
	// remaining is the shared bucket's tokens (ltake, lshared).
	remaining float64

	layer, key string // lstatus
	tokens     float64
	used       int
	windowEnd  time.Time
	full       bool
}

func k(key string) map[string]string { return map[string]string{"per-key": key} }

// pd is a paid slot of layer for key, due at Base+due, booked then (no
// state in a table is made later than a slot it books).
func pd(layer, key string, due time.Duration) []limiter.PaidSlot {
	return pdBooked(layer, key, due, due)
}

// pdBooked is a paid slot of layer for key, due at Base+due, booked at
// Base+booked.
func pdBooked(layer, key string, due, booked time.Duration) []limiter.PaidSlot {
	return []limiter.PaidSlot{{Layer: layer, Key: key, Due: Base.Add(due), Booked: Base.Add(booked)}}
}

func ny() *time.Location {
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

var layerCases = []struct {
	name   string
	rate   float64
	burst  int
	layers []limiter.Layer
	steps  []lstep
}{
	{"all or nothing: a refusing layer charges no layer", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 2, OnExceed: limiter.ActionDeadLetter}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 4},
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 3},
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, wait: time.Second, limiting: "per-key", exceeded: limiter.ActionDeadLetter, remaining: 3},
			{op: lshared, remaining: 3},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
			{op: lstatus, layer: "per-key", key: "b", tokens: 2, full: true},
			{op: ltake, cost: 1, keys: k("b"), granted: true, remaining: 2},
			{at: 500 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: 0.5},
		}},
	{"all or nothing: a shared bucket that must wait charges no layer", 10, 2,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 3}},
		[]lstep{
			{op: ltake, cost: 2, keys: k("a"), granted: true, remaining: 0},
			{op: ltake, cost: 2, keys: k("b"), wait: 200 * time.Millisecond, remaining: 0},
			{op: lstatus, layer: "per-key", key: "b", tokens: 3, full: true},
			{op: lstatus, layer: "per-key", key: "a", tokens: 1},
		}},
	{"a layer without room when the shared bucket is due: come back when it has room, nothing reserved", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 2, Burst: 1}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, remaining: 4},
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, wait: 500 * time.Millisecond, limiting: "per-key", remaining: 4},
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, wait: 500 * time.Millisecond, limiting: "per-key", remaining: 4},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
			{op: lshared, remaining: 4},
			{op: ltake, cost: 1, keys: k("b"), maxWait: time.Second, granted: true, remaining: 3},
			// Back when the key has room: charged then, on every layer.
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, remaining: 4},
			{at: 500 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: 0},
		}},
	{"the shared bucket's wait charges every layer at the instant it is due", 10, 1,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 2}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, remaining: 0},
			// Due in 100 ms: the key, full then, holds 1 after it; 0.9 now.
			{op: ltake, cost: 1, keys: k("b"), maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1},
			{op: lstatus, layer: "per-key", key: "b", tokens: 0.9},
			// Due in 200 ms: a holds 1 now and 1.2 then; 0.2 after it.
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -2},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
			// a's next has room 1 s after its last went out, not before.
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, wait: time.Second, limiting: "per-key", remaining: -2},
		}},
	{"a key's spacing holds when its earlier message waits on the shared bucket", 5, 1,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("x"), maxWait: 10 * time.Second, granted: true, remaining: 0},
			// h goes out at +200 ms, behind x.
			{op: ltake, cost: 1, keys: k("h"), maxWait: 10 * time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -1},
			// h's next may go out 1 s after that, at +1.2 s, not at +400 ms
			// behind it on the shared bucket, nor at +1 s.
			{op: ltake, cost: 1, keys: k("h"), maxWait: 10 * time.Second, wait: 1200 * time.Millisecond, limiting: "per-key", remaining: -1},
			{at: 1199 * time.Millisecond, op: ltake, cost: 1, keys: k("h"), maxWait: 10 * time.Second, wait: time.Millisecond, limiting: "per-key", remaining: 1},
			{at: 1200 * time.Millisecond, op: ltake, cost: 1, keys: k("h"), maxWait: 10 * time.Second, granted: true, remaining: 0},
		}},
	{"a cancelled wait refunds every layer", 10, 1,
		[]limiter.Layer{
			{Name: "per-key", Keyed: true, Rate: 1, Burst: 1},
			{Name: "daily", Quota: 10, Per: limiter.PerDay},
		},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 0},
			{op: ltake, cost: 1, keys: k("b"), maxWait: 2 * time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1},
			{op: lshared, remaining: -1},
			{op: lstatus, layer: "daily", used: 2, windowEnd: utc("2026-01-03T00:00:00Z")},
			// b was charged for +100 ms: 1 then, 0 after it, -0.1 now.
			{op: lstatus, layer: "per-key", key: "b", tokens: -0.1},
			{at: 10 * time.Millisecond, op: lrefund, cost: 1, keys: k("b"), refundOf: 1},
			{at: 10 * time.Millisecond, op: lshared, remaining: 0.1},
			{at: 10 * time.Millisecond, op: lstatus, layer: "per-key", key: "b", tokens: 0.91},
			{at: 10 * time.Millisecond, op: lstatus, layer: "daily", used: 1, windowEnd: utc("2026-01-03T00:00:00Z")},
		}},
	{"a reservation moved back charges its layers the refill it delays, at most its cost, and what leaves a layer at most burst - cost at the new instant", 10, 1,
		[]limiter.Layer{
			{Name: "per-key", Keyed: true, Rate: 5, Burst: 1},
			{Name: "wide", Keyed: true, Rate: 1000, Burst: 100},
			{Name: "daily", Quota: 10, Per: limiter.PerDay},
		},
		[]lstep{
			{op: ltake, cost: 1, keys: map[string]string{"per-key": "x", "wide": "w"}, granted: true, remaining: 0},
			// Due in 100 ms; the key holds 0 then, -0.5 now.
			{op: ltake, cost: 1, keys: map[string]string{"per-key": "a", "wide": "w"}, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1},
			{op: lstatus, layer: "per-key", key: "a", tokens: -0.5},
			// Moved back by 100 ms: 0.5 more taken from per-key; from
			// wide, which holds 9 at +10 ms and would hold 199 at +200
			// ms but for its cap, what leaves it 99 there (burst - cost,
			// as a take charged for +200 ms would): 100, so that it holds
			// -91 now; the quota is left as charged.
			{at: 10 * time.Millisecond, op: ldelay, refundOf: 1, delay: 100 * time.Millisecond, granted: true},
			{at: 10 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: -0.95},
			{at: 10 * time.Millisecond, op: lstatus, layer: "wide", key: "w", tokens: -91},
			{at: 10 * time.Millisecond, op: lstatus, layer: "daily", used: 2, windowEnd: utc("2026-01-03T00:00:00Z")},
			// a's next message comes back when a has room, +400 ms, and
			// goes out then: the first cannot be moved back past it, so
			// nothing is taken and it must be decided again.
			{at: 20 * time.Millisecond, op: ltake, cost: 1, keys: map[string]string{"per-key": "a", "wide": "w"}, maxWait: time.Second, wait: 380 * time.Millisecond, limiting: "per-key", remaining: -0.8},
			{at: 400 * time.Millisecond, op: ltake, cost: 1, keys: map[string]string{"per-key": "a", "wide": "w"}, maxWait: time.Second, granted: true, remaining: 0},
			{at: 410 * time.Millisecond, op: ldelay, refundOf: 1, delay: 400 * time.Millisecond, granted: false},
			{at: 410 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: 0.05},
		}},
	{"a reservation moved back past the refill its layer's cap would cut leaves the layer empty at the new instant", 10, 1,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 5, Burst: 1}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("x"), granted: true, remaining: 0},
			// Due in 100 ms: the key holds 0 then, -0.5 now.
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1},
			// Moved back by 400 ms, to +500 ms: the key would hold
			// -0.45 + 2.45 = 2 there, capped to 1 when read; 2 are taken,
			// not 1 (the cost), so that it holds 0 there, as after a
			// charge at +500 ms. With 1 taken, a's next message went out
			// at +500 ms beside it.
			{at: 10 * time.Millisecond, op: ldelay, refundOf: 1, delay: 400 * time.Millisecond, granted: true},
			{at: 10 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: -2.45},
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, wait: 200 * time.Millisecond, limiting: "per-key", remaining: 1},
			{at: 700 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, remaining: 0},
		}},
	{"a cost above a layer's burst is refused at once, nothing charged", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 2}},
		[]lstep{
			{op: ltake, cost: 3, keys: k("a"), maxWait: time.Hour, err: limiter.ErrCostExceedsBurst},
			{op: ltake, cost: 3, keys: k("a"), maxWait: time.Hour, err: limiter.ErrLimitExceeded},
			{op: lshared, remaining: 5},
			{op: lstatus, layer: "per-key", key: "a", tokens: 2, full: true},
		}},
	{"a keyed layer needs its key", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 2}},
		[]lstep{
			{op: ltake, cost: 1, keys: nil, err: limiter.ErrMissingKey},
			{op: ltake, cost: 1, keys: k(""), err: limiter.ErrMissingKey},
			{op: lshared, remaining: 5},
		}},
	{"skipping the shared bucket decides the layers alone", 10, 1,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), skipShared: true, granted: true},
			{op: ltake, cost: 1, keys: k("b"), skipShared: true, granted: true},
			{op: lshared, remaining: 1},
			{op: ltake, cost: 1, keys: k("a"), skipShared: true, wait: time.Second, limiting: "per-key"},
		}},
	{"extra shared tokens: only when all is granted now, and never on the layers", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 2}},
		[]lstep{
			{op: ltake, cost: 1, extra: 2, keys: k("a"), granted: true, got: 3, remaining: 2},
			{op: lstatus, layer: "per-key", key: "a", tokens: 1},
			{op: ltake, cost: 1, extra: 5, keys: k("a"), granted: true, got: 2, remaining: 0},
			// A wait (here the key's) grants no extra.
			{op: ltake, cost: 1, extra: 5, keys: k("b"), maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1},
			{op: ltake, cost: 1, extra: 5, keys: k("a"), maxWait: time.Second, wait: time.Second, limiting: "per-key", remaining: -1},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
		}},
	{"delay: says when the layer has room, charges nothing", 10, 5,
		[]limiter.Layer{{Name: "hourly", Quota: 2, Per: limiter.PerHour, OnExceed: limiter.ActionDelay}},
		[]lstep{
			{op: ltake, cost: 2, granted: true, remaining: 3},
			// Base is 03:04:05 UTC: the hour ends at 04:00:00.
			{op: ltake, cost: 1, wait: 55*time.Minute + 55*time.Second, limiting: "hourly", exceeded: limiter.ActionDelay, remaining: 3},
			// A quota books nothing ahead, and a paid marker for it is
			// ignored: it refuses again, until its window ends.
			{op: ltake, cost: 1, paid: pd("hourly", "", 0), wait: 55*time.Minute + 55*time.Second, limiting: "hourly", exceeded: limiter.ActionDelay, remaining: 3},
			{at: 55*time.Minute + 55*time.Second, op: ltake, cost: 1, granted: true, remaining: 4},
		}},
	{"delay: a token-bucket layer books each refused message's slot, first come first served", 100, 10,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 2, Burst: 1, OnExceed: limiter.ActionDelay}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 9},
			// Three refused at the same instant: due at t+1/r, t+2/r, t+3/r.
			{op: ltake, cost: 1, keys: k("a"), wait: 500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("a"), wait: time.Second, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("a"), wait: 1500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			// The slots are booked on the layer; nothing on the shared bucket.
			{op: lstatus, layer: "per-key", key: "a", tokens: -3},
			{op: lshared, remaining: 9},
			// Back at its slot with the marker: the layer lets it pass
			// without taking from it; the shared bucket is charged.
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), paid: pd("per-key", "a", 500*time.Millisecond), granted: true, remaining: 9},
			{at: 500 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: -2},
			// A new message queues behind the slots booked before it.
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), wait: 1500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			// A marker for another key of the layer pays nothing.
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("b"), paid: pd("per-key", "a", 500*time.Millisecond), granted: true, remaining: 8},
			{at: 500 * time.Millisecond, op: lstatus, layer: "per-key", key: "b", tokens: 0},
			// A paid take that is then refunded gives back the shared
			// tokens only: the layer was not charged.
			{at: time.Second, op: ltake, cost: 1, keys: k("a"), paid: pd("per-key", "a", time.Second), granted: true, remaining: 9},
			{at: time.Second, op: lrefund, refundOf: 11},
			{at: time.Second, op: lstatus, layer: "per-key", key: "a", tokens: -2},
			{at: time.Second, op: lshared, remaining: 10},
			// The last slot back a little late (within PaidLateness, 50 ms
			// at 2/s), after the layer refilled: charged the excess over
			// its burst, never made to wait.
			{at: 2025 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: 0.05},
			{at: 2025 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), paid: pd("per-key", "a", 2*time.Second), granted: true, remaining: 9},
			{at: 2025 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: 0},
			// A slot back later than that is forfeit: the layer is decided
			// as usual, and books a new slot.
			{at: 10 * time.Second, op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 9},
			{at: 10 * time.Second, op: ltake, cost: 1, keys: k("a"), wait: 500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{at: 10600 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), paid: pd("per-key", "a", 10500*time.Millisecond), wait: 400 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 10},
			{at: 10600 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: -0.8},
		}},
	{"delay: a paid take moved later, with its paid layers, charges them for the move, unless a slot was booked after it", 100, 10,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 2, Burst: 1, OnExceed: limiter.ActionDelay}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("a"), wait: 500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), paid: pd("per-key", "a", 500*time.Millisecond), granted: true, remaining: 9},
			// Moved 30 ms, within the slot's lateness: the layer passed on
			// the slot is left as it is.
			{at: 505 * time.Millisecond, op: ldelay, refundOf: 2, delay: 30 * time.Millisecond, granted: true},
			{at: 505 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: 0.01},
			// Pushed 200 ms later, past the slot's lateness (50 ms at 2/s):
			// moved with its paid layers, the layer is charged the refill
			// of the move, so the key's next message is booked 500 ms after
			// +700 ms, not after +500 ms. Before, a move never charged a
			// layer passed on a paid slot.
			{at: 510 * time.Millisecond, op: ldelay, refundOf: 2, delay: 200 * time.Millisecond, withPaid: true, granted: true},
			{at: 510 * time.Millisecond, op: lstatus, layer: "per-key", key: "a", tokens: -0.38},
			{at: 510 * time.Millisecond, op: ltake, cost: 1, keys: k("b"), granted: true, remaining: 9},
			{at: 510 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), wait: 690 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			// Key c: a paid take, then a slot booked right behind it. Moved
			// 200 ms later, the paid take would go out 300 ms before that
			// slot against 500: the move is refused, nothing charged.
			{at: 10 * time.Second, op: ltake, cost: 1, keys: k("c"), granted: true, remaining: 9},
			{at: 10 * time.Second, op: ltake, cost: 1, keys: k("c"), wait: 500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{at: 10500 * time.Millisecond, op: ltake, cost: 1, keys: k("c"), paid: pd("per-key", "c", 10500*time.Millisecond), granted: true, remaining: 9},
			{at: 10500 * time.Millisecond, op: ltake, cost: 1, keys: k("c"), wait: 500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{at: 10510 * time.Millisecond, op: ldelay, refundOf: 11, delay: 200 * time.Millisecond, withPaid: true, granted: false},
			{at: 10510 * time.Millisecond, op: lstatus, layer: "per-key", key: "c", tokens: -0.98},
		}},
	{"delay: a slot the layer's state does not hold counts for nothing (a state Redis lost since)", 100, 10,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 2, Burst: 1, OnExceed: limiter.ActionDelay}},
		[]lstep{
			// Key z holds a slot due at +400 ms booked in a state lost
			// since (Redis restarted empty): its fresh state lets another
			// message through at once.
			{op: ltake, cost: 1, keys: k("z"), granted: true, remaining: 9},
			// Back on its slot, the first is decided as any other (100 ms
			// more, booked): before, it passed on the lost slot, 400 ms
			// after the other against the layer's 500.
			{at: 400 * time.Millisecond, op: ltake, cost: 1, keys: k("z"), paid: pd("per-key", "z", 400*time.Millisecond), wait: 100 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 10},
			{at: 400 * time.Millisecond, op: lstatus, layer: "per-key", key: "z", tokens: -0.2},
		}},
	{"delay: a slot booked before the layer's state was made counts for nothing, though the state booked past its due", 100, 10,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 2, Burst: 1, OnExceed: limiter.ActionDelay}},
		[]lstep{
			// The state of key z is made at +0 (Redis restarted empty
			// since a slot due at +500 ms was booked at -1 s) and books
			// +500 ms and +1 s.
			{op: ltake, cost: 1, keys: k("z"), granted: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("z"), wait: 500 * time.Millisecond, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("z"), wait: time.Second, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			// The old slot back at +500 ms is decided as any other: booked
			// at +1.5 s. Before, it passed, since the state's last send
			// (+1 s) is after its due: two messages of z at +500 ms.
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("z"), paid: pdBooked("per-key", "z", 500*time.Millisecond, -time.Second), wait: time.Second, limiting: "per-key", exceeded: limiter.ActionDelay, reserved: true, remaining: 10},
			// The slot this state booked for +500 ms passes.
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("z"), paid: pdBooked("per-key", "z", 500*time.Millisecond, 0), granted: true, remaining: 9},
			{at: 500 * time.Millisecond, op: lstatus, layer: "per-key", key: "z", tokens: -2},
		}},
	{"delay: on a layer without keys, a slot booked before its state was made counts for nothing", 100, 10,
		[]limiter.Layer{{Name: "all", Rate: 2, Burst: 1, OnExceed: limiter.ActionDelay}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("a"), wait: 500 * time.Millisecond, limiting: "all", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("a"), wait: time.Second, limiting: "all", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("b"), paid: pdBooked("all", "", 500*time.Millisecond, -time.Second), wait: time.Second, limiting: "all", exceeded: limiter.ActionDelay, reserved: true, remaining: 10},
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("b"), paid: pdBooked("all", "", 500*time.Millisecond, 0), granted: true, remaining: 9},
			{at: 500 * time.Millisecond, op: lstatus, layer: "all", tokens: -2},
			// A slot without its booking instant (an older version's)
			// passes only a state older than this version's.
			{at: time.Second, op: ltake, cost: 1, keys: k("b"), paid: []limiter.PaidSlot{{Layer: "all", Due: Base.Add(time.Second)}}, wait: time.Second, limiting: "all", exceeded: limiter.ActionDelay, reserved: true, remaining: 10},
		}},
	{"delay: a paid marker for an unknown layer, or a layer that does not delay, is ignored", 100, 10,
		[]limiter.Layer{
			{Name: "per-key", Keyed: true, Rate: 1, Burst: 1},
			{Name: "all", Rate: 1, Burst: 1, OnExceed: limiter.ActionDelay},
		},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 9},
			{op: ltake, cost: 1, keys: k("a"), paid: []limiter.PaidSlot{{Layer: "gone", Key: "a", Due: Base}, {Layer: "per-key", Key: "a", Due: Base}, {Layer: "all", Key: "x", Due: Base}}, wait: time.Second, limiting: "all", exceeded: limiter.ActionDelay, reserved: true, remaining: 9},
			{op: lstatus, layer: "all", tokens: -1},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
			// A layer without keys is paid for with the key "".
			{at: time.Second, op: ltake, cost: 1, keys: k("b"), paid: pd("all", "", time.Second), granted: true, remaining: 9},
			{at: time.Second, op: lstatus, layer: "all", tokens: 0},
		}},
	{"max_wait: a dead_letter layer waits up to it", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 2, OnExceed: limiter.ActionDeadLetter, MaxWait: 1500 * time.Millisecond}},
		[]lstep{
			{op: ltake, cost: 2, keys: k("a"), maxWait: 2 * time.Second, granted: true, remaining: 3},
			{op: ltake, cost: 1, keys: k("a"), maxWait: 2 * time.Second, wait: time.Second, limiting: "per-key", remaining: 3},
			{op: ltake, cost: 2, keys: k("a"), maxWait: 2 * time.Second, wait: 2 * time.Second, limiting: "per-key", exceeded: limiter.ActionDeadLetter, remaining: 3},
			{at: time.Second, op: ltake, cost: 1, keys: k("a"), maxWait: 2 * time.Second, granted: true, remaining: 4},
		}},
	{"dead_letter wins over delay", 10, 5,
		[]limiter.Layer{
			{Name: "slow", Keyed: true, Rate: 0.1, Burst: 1, OnExceed: limiter.ActionDelay},
			{Name: "per-key", Keyed: true, Rate: 1, Burst: 1, OnExceed: limiter.ActionDeadLetter},
		},
		[]lstep{
			{op: ltake, cost: 1, keys: map[string]string{"slow": "x", "per-key": "a"}, granted: true, remaining: 4},
			{op: ltake, cost: 1, keys: map[string]string{"slow": "x", "per-key": "a"}, wait: time.Second, limiting: "per-key", exceeded: limiter.ActionDeadLetter, remaining: 4},
			{op: ltake, cost: 1, keys: map[string]string{"slow": "x", "per-key": "b"}, wait: 10 * time.Second, limiting: "slow", exceeded: limiter.ActionDelay, reserved: true, remaining: 4},
			// The dead_letter refusal booked nothing on slow; the delay one did.
			{op: lstatus, layer: "slow", key: "x", tokens: -1},
		}},
	{"quota: the window resets at its start (UTC day), per key", 100, 100,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Quota: 3, Per: limiter.PerDay}},
		[]lstep{
			{op: ltake, cost: 2, keys: k("a"), maxWait: time.Second, granted: true, remaining: 98},
			// Not reserved ahead: come back at midnight (Base is 03:04:05).
			{op: ltake, cost: 2, keys: k("a"), maxWait: time.Second, wait: 20*time.Hour + 55*time.Minute + 55*time.Second, limiting: "per-key", remaining: 98},
			{op: ltake, cost: 2, keys: k("b"), maxWait: time.Second, granted: true, remaining: 96},
			{op: ltake, cost: 1, keys: k("a"), maxWait: time.Second, granted: true, remaining: 95},
			{op: lstatus, layer: "per-key", key: "a", used: 3, windowEnd: utc("2026-01-03T00:00:00Z")},
			{when: utc("2026-01-02T23:59:59.999999Z"), op: ltake, cost: 1, keys: k("a"), wait: time.Microsecond, limiting: "per-key", remaining: 100},
			{when: utc("2026-01-03T00:00:00Z"), op: ltake, cost: 3, keys: k("a"), granted: true, remaining: 97},
			{when: utc("2026-01-03T00:00:00Z"), op: lstatus, layer: "per-key", key: "a", used: 3, windowEnd: utc("2026-01-04T00:00:00Z")},
		}},
	{"quota: a month window", 100, 100,
		[]limiter.Layer{{Name: "monthly", Quota: 1, Per: limiter.PerMonth}},
		[]lstep{
			{when: utc("2026-02-28T23:00:00Z"), op: ltake, cost: 1, granted: true, remaining: 99},
			{when: utc("2026-02-28T23:00:00Z"), op: ltake, cost: 1, wait: time.Hour, limiting: "monthly", remaining: 99},
			{when: utc("2026-03-01T00:00:00Z"), op: ltake, cost: 1, granted: true, remaining: 99},
		}},
	{"quota: a 23-hour day when New York springs forward", 100, 100,
		[]limiter.Layer{{Name: "daily", Quota: 2, Per: limiter.PerDay, Location: ny()}},
		[]lstep{
			// 2026-03-08 starts at 05:00 UTC (EST) and ends at 04:00 UTC
			// on the 9th (EDT): 23 hours. 24 hours would end at 05:00.
			{when: utc("2026-03-08T15:00:00Z"), op: ltake, cost: 2, granted: true, remaining: 98},
			{when: utc("2026-03-09T03:30:00Z"), op: ltake, cost: 1, wait: 30 * time.Minute, limiting: "daily", remaining: 100},
			{when: utc("2026-03-09T03:30:00Z"), op: lstatus, layer: "daily", used: 2, windowEnd: utc("2026-03-09T04:00:00Z")},
			{when: utc("2026-03-09T04:00:00Z"), op: ltake, cost: 2, granted: true, remaining: 98},
		}},
	{"quota: a 25-hour day and two 1 a.m. hours when New York falls back", 100, 100,
		[]limiter.Layer{
			{Name: "daily", Quota: 3, Per: limiter.PerDay, Location: ny()},
			{Name: "hourly", Quota: 1, Per: limiter.PerHour, Location: ny()},
		},
		[]lstep{
			// 2026-11-01 runs from 04:00 UTC (EDT) to 05:00 UTC on the 2nd (EST).
			{when: utc("2026-11-01T05:30:00Z"), op: ltake, cost: 1, granted: true, remaining: 99}, // 01:30 EDT
			{when: utc("2026-11-01T05:40:00Z"), op: ltake, cost: 1, wait: 20 * time.Minute, limiting: "hourly", remaining: 100},
			{when: utc("2026-11-01T06:10:00Z"), op: ltake, cost: 1, granted: true, remaining: 99}, // 01:10 EST: a new hour
			{when: utc("2026-11-01T06:10:00Z"), op: lstatus, layer: "hourly", used: 1, windowEnd: utc("2026-11-01T07:00:00Z")},
			{when: utc("2026-11-02T04:30:00Z"), op: ltake, cost: 1, granted: true, remaining: 99}, // 23:30 EST on the 1st
			{when: utc("2026-11-02T04:40:00Z"), op: ltake, cost: 1, wait: 20 * time.Minute, limiting: "daily", remaining: 100},
			{when: utc("2026-11-02T04:40:00Z"), op: lstatus, layer: "daily", used: 3, windowEnd: utc("2026-11-02T05:00:00Z")},
			{when: utc("2026-11-02T05:00:00Z"), op: ltake, cost: 1, granted: true, remaining: 99},
		}},
}

// shadow is one shadow decision of layer.
func shadow(layer string, a limiter.Action, wait time.Duration) []backend.ShadowDecision {
	return []backend.ShadowDecision{{Layer: layer, Action: a, Wait: wait}}
}

var shadowCases = []struct {
	name   string
	rate   float64
	burst  int
	layers []limiter.Layer
	steps  []lstep
}{
	{"shadow: never waits, charged only when it would grant, reports the rest", 10, 5,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1, Burst: 1, Shadow: true}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 4, shadow: shadow("per-key", "", 0)},
			{op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 3, shadow: shadow("per-key", limiter.ActionWait, time.Second)},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
			{at: 500 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 4, shadow: shadow("per-key", limiter.ActionWait, 500*time.Millisecond)},
			{at: time.Second, op: ltake, cost: 1, keys: k("a"), granted: true, remaining: 4, shadow: shadow("per-key", "", 0)},
			{at: time.Second, op: lstatus, layer: "per-key", key: "a", tokens: 0},
		}},
	{"shadow: decided for the send instant, refusals by its action", 10, 1,
		[]limiter.Layer{
			{Name: "per-key", Keyed: true, Rate: 5, Burst: 1, OnExceed: limiter.ActionDeadLetter, Shadow: true},
			{Name: "per-key-wait", Keyed: true, Rate: 5, Burst: 1, Shadow: true},
		},
		[]lstep{
			{op: ltake, cost: 1, keys: map[string]string{"per-key": "a", "per-key-wait": "a"}, maxWait: time.Second, granted: true, remaining: 0,
				shadow: []backend.ShadowDecision{{Layer: "per-key"}, {Layer: "per-key-wait"}}},
			// The shared bucket's reservation is due in 100 ms: the
			// shadow layers are decided for then.
			{op: ltake, cost: 1, keys: map[string]string{"per-key": "a", "per-key-wait": "a"}, maxWait: time.Second, granted: true, wait: 100 * time.Millisecond, remaining: -1,
				shadow: []backend.ShadowDecision{{Layer: "per-key", Action: limiter.ActionDeadLetter, Wait: 200 * time.Millisecond}, {Layer: "per-key-wait", Action: limiter.ActionWait, Wait: 200 * time.Millisecond}}},
			{op: ltake, cost: 1, keys: map[string]string{"per-key": "b", "per-key-wait": "a"}, maxWait: time.Second, granted: true, wait: 200 * time.Millisecond, remaining: -2,
				shadow: []backend.ShadowDecision{{Layer: "per-key"}, {Layer: "per-key-wait", Wait: 200 * time.Millisecond}}},
			{op: lstatus, layer: "per-key-wait", key: "a", tokens: -1},
			{op: lstatus, layer: "per-key", key: "a", tokens: 0},
		}},
	{"shadow: a cost it can never grant passes; enforced layers still decide", 100, 100,
		[]limiter.Layer{
			{Name: "daily", Quota: 2, Per: limiter.PerDay, Shadow: true},
			{Name: "per-key", Keyed: true, Rate: 1, Burst: 3, OnExceed: limiter.ActionDeadLetter},
		},
		[]lstep{
			{op: ltake, cost: 3, keys: k("a"), granted: true, remaining: 97, shadow: shadow("daily", limiter.ActionDeadLetter, 0)},
			{op: ltake, cost: 1, keys: k("a"), wait: time.Second, limiting: "per-key", exceeded: limiter.ActionDeadLetter, remaining: 97},
			{op: ltake, cost: 2, keys: k("b"), granted: true, remaining: 95, shadow: shadow("daily", "", 0)},
			{op: ltake, cost: 1, keys: k("c"), granted: true, remaining: 94, shadow: shadow("daily", limiter.ActionWait, utc("2026-01-03T00:00:00Z").Sub(Base))},
			{op: lstatus, layer: "daily", used: 2, windowEnd: utc("2026-01-03T00:00:00Z")},
		}},
}

// sharedShadow is the decision of a shadow shared bucket.
func sharedShadow(a limiter.Action, wait time.Duration) backend.ShadowDecision {
	return backend.ShadowDecision{Layer: backend.SharedShadow, Action: a, Wait: wait}
}

// sharedShadowCases hold the shadow shared bucket (limiter.Options.Shadow)
// to its decisions: a shadow layer with OnExceed wait at the shared rate
// and burst, on state of its own, the enforced layers alone limiting.
var sharedShadowCases = []struct {
	name   string
	rate   float64
	burst  int
	layers []limiter.Layer
	steps  []lstep
}{
	{"shadow shared bucket: never waits, charged only when it would grant, enforced layers decide", 1, 2,
		[]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 10, Burst: 1}},
		[]lstep{
			{op: ltake, cost: 1, keys: k("a"), shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow("", 0)}},
			{op: ltake, cost: 1, keys: k("b"), shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow("", 0)}},
			// Empty: it would have made the message wait 1 s, charges nothing.
			{op: ltake, cost: 1, keys: k("c"), shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow(limiter.ActionWait, time.Second)}},
			// The enforced layer makes "a" wait; nothing is decided.
			{op: ltake, cost: 1, keys: k("a"), shadowShared: true, wait: 100 * time.Millisecond, limiting: "per-key"},
			{at: 100 * time.Millisecond, op: ltake, cost: 1, keys: k("a"), shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow(limiter.ActionWait, 900*time.Millisecond)}},
			{at: time.Second, op: ltake, cost: 1, keys: k("d"), shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow("", 0)}},
			{at: time.Second, op: ltake, cost: 1, keys: k("e"), shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow(limiter.ActionWait, time.Second)}},
			// The real shared bucket was never charged: full.
			{at: time.Second, op: ltake, cost: 1, keys: k("f"), maxWait: time.Second, granted: true, remaining: 1},
		}},
	{"shadow shared bucket: a cost above its burst, before the shadow layers", 1, 2,
		[]limiter.Layer{{Name: "daily", Quota: 4, Per: limiter.PerDay, Shadow: true}},
		[]lstep{
			{op: ltake, cost: 3, shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow(limiter.ActionDeadLetter, 0), {Layer: "daily"}}},
			{op: ltake, cost: 2, shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow("", 0), {Layer: "daily", Action: limiter.ActionWait, Wait: utc("2026-01-03T00:00:00Z").Sub(Base)}}},
			{at: time.Second, op: ltake, cost: 1, shadowShared: true, granted: true, shadow: []backend.ShadowDecision{sharedShadow("", 0), {Layer: "daily"}}},
			{op: lstatus, layer: "daily", used: 4, windowEnd: utc("2026-01-03T00:00:00Z")},
		}},
}

// RunLayers runs every layered step table against stores made by newStore.
func RunLayers(t *testing.T, newStore LayeredFactory) {
	cases := append(layerCases[:len(layerCases):len(layerCases)], shadowCases...)
	for _, c := range append(cases, sharedShadowCases...) {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, c.rate, c.burst, c.layers)
			reqs := make([]backend.LayerRequest, len(c.steps))
			results := make([]backend.LayerResult, len(c.steps))
			for i, st := range c.steps {
				now := Base.Add(st.at)
				if !st.when.IsZero() {
					now = st.when
				}
				req := backend.LayerRequest{Cost: st.cost, Extra: st.extra, Keys: st.keys, MaxWait: st.maxWait, SkipShared: st.skipShared || st.shadowShared, ShadowShared: st.shadowShared, Paid: st.paid}
				switch st.op {
				case ltake:
					res, err := s.TakeLayersAt(now, req)
					reqs[i], results[i] = req, res
					if st.err != nil {
						if !errors.Is(err, st.err) {
							t.Fatalf("step %d: err = %v, want %v", i, err, st.err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					var action limiter.Action
					if res.Exceeded != nil {
						action = res.Exceeded.Action
						if res.Exceeded.Layer != st.limiting || !errors.Is(res.Exceeded, limiter.ErrLimitExceeded) {
							t.Fatalf("step %d: Exceeded = %+v, want layer %q", i, res.Exceeded, st.limiting)
						}
						if action == limiter.ActionDelay && !res.Exceeded.RetryAt.Equal(now.Add(st.wait)) {
							t.Fatalf("step %d: RetryAt = %v, want %v", i, res.Exceeded.RetryAt, now.Add(st.wait))
						}
						if res.Exceeded.Reserved != st.reserved || (st.reserved && res.Exceeded.Key != st.keys[st.limiting]) {
							t.Fatalf("step %d: Reserved %v key %q, want %v key %q", i, res.Exceeded.Reserved,
								res.Exceeded.Key, st.reserved, st.keys[st.limiting])
						}
					}
					wantRemaining := st.remaining
					if res.Granted != st.granted || res.Wait != st.wait || res.Limiting != st.limiting ||
						action != st.exceeded || !near(res.Remaining, wantRemaining) || !res.At.Equal(now) {
						t.Fatalf("step %d: take(cost %d, keys %v, maxWait %v) at %v = granted %v wait %v limiting %q exceeded %q remaining %v at %v\nwant granted %v wait %v limiting %q exceeded %q remaining %v",
							i, st.cost, st.keys, st.maxWait, now, res.Granted, res.Wait, res.Limiting, action, res.Remaining, res.At,
							st.granted, st.wait, st.limiting, st.exceeded, wantRemaining)
					}
					if !slices.Equal(res.Shadow, st.shadow) {
						t.Fatalf("step %d: Shadow = %+v, want %+v", i, res.Shadow, st.shadow)
					}
					if want := max(st.got, st.cost); res.Granted && res.Tokens != want {
						t.Fatalf("step %d: Tokens = %d, want %d", i, res.Tokens, want)
					}
				case lrefund:
					if err := s.RefundLayersAt(now, reqs[st.refundOf], results[st.refundOf]); err != nil {
						t.Fatalf("step %d: refund: %v", i, err)
					}
				case ldelay:
					res, req := results[st.refundOf], reqs[st.refundOf]
					if st.withPaid {
						req.Paid = nil
					}
					moved, err := s.DelayLayersAt(now, req, res, res.At.Add(res.Wait), st.delay)
					if err != nil {
						t.Fatalf("step %d: delay: %v", i, err)
					}
					if moved != st.granted {
						t.Fatalf("step %d: delay by %v: moved %v, want %v", i, st.delay, moved, st.granted)
					}
				case lshared:
					got, err := s.StatusAt(now)
					if err != nil {
						t.Fatalf("step %d: status: %v", i, err)
					}
					if !near(got.Tokens, st.remaining) {
						t.Fatalf("step %d: shared tokens at %v = %v, want %v", i, now, got.Tokens, st.remaining)
					}
				case lstatus:
					got, err := s.LayerStatusAt(now, st.layer, st.key)
					if err != nil {
						t.Fatalf("step %d: layer status: %v", i, err)
					}
					if got.Layer != st.layer || got.Key != st.key || !near(got.Tokens, st.tokens) || got.Used != st.used ||
						!got.WindowEnd.Equal(st.windowEnd) || got.Full != st.full {
						t.Fatalf("step %d: layer status %s/%s at %v = %+v\nwant tokens %v used %d window end %v full %v",
							i, st.layer, st.key, now, got, st.tokens, st.used, st.windowEnd, st.full)
					}
				}
			}
		})
	}
}
