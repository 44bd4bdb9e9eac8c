package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// SlotClockedStore is a layered store with concurrency layers driven at
// explicit instants.
type SlotClockedStore interface {
	LayeredClockedStore
	ReleaseSlotsAt(now time.Time, slots []backend.SlotRelease) error
}

// SlotFactory returns a new store as LayeredFactory does.
type SlotFactory func(t *testing.T, rate float64, burst int, layers []limiter.Layer) SlotClockedStore

type cop int

const (
	ctake    cop = iota
	crelease     // the slot of holder for keys
	crefund      // RefundLayers of the take step refundOf
	cstatus      // layer's key: used
)

// cstep is one call at Base+at and what it must answer.
type cstep struct {
	at       time.Duration
	op       cop
	holder   string
	keys     map[string]string
	refundOf int

	granted  bool
	wait     time.Duration
	limiting string
	exceeded limiter.Action
	retry    time.Duration // a delay refusal's LimitError.Wait

	layer, key string // cstatus
	used       int
}

func ck(key string) map[string]string {
	return map[string]string{"conc": key, "per-key": key}
}

var concurrencyCases = []struct {
	name   string
	layers []limiter.Layer
	steps  []cstep
}{
	{"two slots per key, released or their lease ends",
		[]limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 2, Lease: 10 * time.Second}},
		[]cstep{
			{op: ctake, holder: "h1", keys: ck("a"), granted: true},
			{op: ctake, holder: "h2", keys: ck("a"), granted: true},
			{op: ctake, holder: "h3", keys: ck("a"), wait: 10 * time.Second, limiting: "conc"},
			{op: ctake, holder: "h3", keys: ck("b"), granted: true},
			// A holder decided again keeps its slot: no second one.
			{op: ctake, holder: "h1", keys: ck("a"), granted: true},
			{op: cstatus, layer: "conc", key: "a", used: 2},
			{at: time.Second, op: crelease, holder: "h1", keys: ck("a")},
			{at: time.Second, op: cstatus, layer: "conc", key: "a", used: 1},
			{at: time.Second, op: ctake, holder: "h3", keys: ck("a"), granted: true},
			// The earliest lease, h2's, ends at 10 s.
			{at: 2 * time.Second, op: ctake, holder: "h4", keys: ck("a"), wait: 8 * time.Second, limiting: "conc"},
			{at: 10 * time.Second, op: ctake, holder: "h4", keys: ck("a"), granted: true},
			{at: 10 * time.Second, op: cstatus, layer: "conc", key: "a", used: 2},
			{at: 10 * time.Second, op: crefund, refundOf: 10},
			{at: 10 * time.Second, op: cstatus, layer: "conc", key: "a", used: 1},
			// Releasing a slot not held does nothing.
			{at: 10 * time.Second, op: crelease, holder: "h9", keys: ck("a")},
			{at: 10 * time.Second, op: cstatus, layer: "conc", key: "a", used: 1},
			{at: 11 * time.Second, op: cstatus, layer: "conc", key: "a", used: 0},
		}},
	{"dead_letter refuses at once",
		[]limiter.Layer{{Name: "conc", Concurrency: 1, Lease: 5 * time.Second, OnExceed: limiter.ActionDeadLetter}},
		[]cstep{
			{op: ctake, holder: "h1", granted: true},
			{op: ctake, holder: "h2", wait: 5 * time.Second, limiting: "conc", exceeded: limiter.ActionDeadLetter},
			{at: time.Second, op: crelease, holder: "h1"},
			{at: time.Second, op: ctake, holder: "h2", granted: true},
		}},
	{"delay asks to come back within a second",
		[]limiter.Layer{{Name: "conc", Concurrency: 1, Lease: 5 * time.Second, OnExceed: limiter.ActionDelay}},
		[]cstep{
			{op: ctake, holder: "h1", granted: true},
			{op: ctake, holder: "h2", wait: 5 * time.Second, limiting: "conc", exceeded: limiter.ActionDelay, retry: time.Second},
			{at: 4500 * time.Millisecond, op: ctake, holder: "h2", wait: 500 * time.Millisecond, limiting: "conc", exceeded: limiter.ActionDelay, retry: 500 * time.Millisecond},
		}},
	{"all layers or none: a slot is not taken while a rate layer waits",
		[]limiter.Layer{
			{Name: "conc", Keyed: true, Concurrency: 1, Lease: 5 * time.Second},
			{Name: "per-key", Keyed: true, Rate: 1, Burst: 1},
		},
		[]cstep{
			{op: ctake, holder: "h1", keys: ck("a"), granted: true},
			{at: 100 * time.Millisecond, op: crelease, holder: "h1", keys: ck("a")},
			{at: 500 * time.Millisecond, op: ctake, holder: "h2", keys: ck("a"), wait: 500 * time.Millisecond, limiting: "per-key"},
			{at: 500 * time.Millisecond, op: cstatus, layer: "conc", key: "a", used: 0},
			{at: time.Second, op: ctake, holder: "h2", keys: ck("a"), granted: true},
			{at: time.Second, op: cstatus, layer: "conc", key: "a", used: 1},
		}},
}

// RunConcurrency runs the concurrency layers' step tables against stores
// made by newStore.
func RunConcurrency(t *testing.T, newStore SlotFactory) {
	for _, skip := range []bool{false, true} {
		for _, c := range concurrencyCases {
			name := c.name
			if skip {
				name += " (leased: without the shared bucket)"
			}
			t.Run(name, func(t *testing.T) { runConcurrency(t, newStore, c.layers, c.steps, skip) })
		}
	}
}

func runConcurrency(t *testing.T, newStore SlotFactory, layers []limiter.Layer, steps []cstep, skipShared bool) {
	c := struct {
		layers []limiter.Layer
		steps  []cstep
	}{layers, steps}
	{
		{
			s := newStore(t, 1000, 1000, c.layers)
			reqs := make([]backend.LayerRequest, len(c.steps))
			results := make([]backend.LayerResult, len(c.steps))
			for i, st := range c.steps {
				now := Base.Add(st.at)
				req := backend.LayerRequest{Cost: 1, Keys: st.keys, Holder: st.holder, SkipShared: skipShared}
				switch st.op {
				case ctake:
					res, err := s.TakeLayersAt(now, req)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					reqs[i], results[i] = req, res
					var action limiter.Action
					if le := res.Exceeded; le != nil {
						action = le.Action
						if le.Layer != st.limiting || !errors.Is(le, limiter.ErrLimitExceeded) || le.Reserved {
							t.Fatalf("step %d: Exceeded = %+v, want layer %q, nothing booked", i, le, st.limiting)
						}
						if action == limiter.ActionDelay && (le.Wait != st.retry || !le.RetryAt.Equal(now.Add(st.retry))) {
							t.Fatalf("step %d: delay refusal Wait %v RetryAt %v, want %v", i, le.Wait, le.RetryAt, st.retry)
						}
					}
					if res.Granted != st.granted || res.Wait != st.wait || res.Limiting != st.limiting || action != st.exceeded {
						t.Fatalf("step %d: take(%s, %v) at +%v = granted %v wait %v limiting %q exceeded %q; want %v %v %q %q",
							i, st.holder, st.keys, st.at, res.Granted, res.Wait, res.Limiting, action, st.granted, st.wait, st.limiting, st.exceeded)
					}
				case crelease:
					keys, err := backend.LayerKeys(c.layers, req)
					if err != nil {
						t.Fatal(err)
					}
					if err := s.ReleaseSlotsAt(now, backend.Slots(c.layers, keys, st.holder)); err != nil {
						t.Fatalf("step %d: release: %v", i, err)
					}
				case crefund:
					if err := s.RefundLayersAt(now, reqs[st.refundOf], results[st.refundOf]); err != nil {
						t.Fatalf("step %d: refund: %v", i, err)
					}
				case cstatus:
					got, err := s.LayerStatusAt(now, st.layer, st.key)
					if err != nil {
						t.Fatalf("step %d: status: %v", i, err)
					}
					if got.Used != st.used || got.Full != (st.used == 0) {
						t.Fatalf("step %d: %s/%s at +%v: used %d full %v, want used %d", i, st.layer, st.key, st.at, got.Used, got.Full, st.used)
					}
				}
			}
		}
	}
}
