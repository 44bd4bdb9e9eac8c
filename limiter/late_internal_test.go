package limiter

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter/internal/clocktest"
)

// TestLatenessPaysForItsOwnTime: a reservation charged for +0 wakes up
// 100 ms late against a lateness of 25 ms, so keeps pays its layers for the
// move (lateness.pay). The payment is a store call, and the message goes
// out only when it is answered: a payment answered 300 ms later leaves
// that much unpaid, so keeps pays again for it, plus as long as the last
// call took. Before, it paid once for the 100 ms and let the message go
// out 400 ms after +0, next to its key's next message charged for +100 ms
// plus the spacing.
func TestLatenessPaysForItsOwnTime(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	errDown := errors.New("store down")
	for _, tc := range []struct {
		name  string
		calls []time.Duration // how long each payment takes
		moved []bool          // the store's answers (true past the list)
		err   error
		keeps bool
		paid  []time.Duration // the moves paid for, in order
	}{
		{name: "a quick payment", calls: []time.Duration{ms(5)}, keeps: true, paid: []time.Duration{ms(100)}},
		{name: "a slow payment is paid for", calls: []time.Duration{ms(300), ms(10)}, keeps: true, paid: []time.Duration{ms(100), ms(600)}},
		{name: "two slow payments", calls: []time.Duration{ms(300), ms(400), ms(5)}, keeps: true, paid: []time.Duration{ms(100), ms(600), ms(500)}},
		{name: "always slower", calls: []time.Duration{ms(100), ms(300), ms(900), ms(2700)}, keeps: false, paid: []time.Duration{ms(100), ms(200), ms(500), ms(1500)}},
		{name: "a later message of the key", calls: []time.Duration{ms(5)}, moved: []bool{false}, keeps: false, paid: []time.Duration{ms(100)}},
		{name: "refused after a slow payment", calls: []time.Duration{ms(300)}, moved: []bool{true, false}, keeps: false, paid: []time.Duration{ms(100), ms(600)}},
		{name: "the store failing", calls: []time.Duration{ms(300)}, err: errDown, keeps: true, paid: []time.Duration{ms(100)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := time.Unix(1_700_000_000, 0)
			clk := clocktest.New(base)
			var paid []time.Duration
			from := base
			l := &lateness{after: ms(25), pay: func(f time.Time, by time.Duration, _ bool) (bool, error) {
				if !f.Equal(from) {
					t.Errorf("payment %d from +%v, want +%v (where the last one left it)", len(paid)+1, f.Sub(base), from.Sub(base))
				}
				from = f.Add(by)
				i := len(paid)
				paid = append(paid, by)
				clk.Advance(tc.calls[min(i, len(tc.calls)-1)])
				if tc.err != nil {
					return false, tc.err
				}
				return i >= len(tc.moved) || tc.moved[i], nil
			}}
			clk.Advance(ms(100)) // woke up 100 ms late
			got := l.keeps(clk, base, clk.Now)
			if got != tc.keeps {
				t.Errorf("keeps = %v, want %v", got, tc.keeps)
			}
			if !slices.Equal(paid, tc.paid) {
				t.Errorf("paid %v, want %v", paid, tc.paid)
			}
			if got && tc.err == nil {
				if unpaid := clk.Now().Sub(from); unpaid > l.after {
					t.Errorf("goes out at +%v, charged for +%v: %v unpaid, want at most %v", clk.Now().Sub(base), from.Sub(base), unpaid, l.after)
				}
			}
		})
	}
}

// TestLatenessMovesAPaidSlotPastItsLateness: a reservation passed a delay
// layer on a paid slot due at +0 and charged for +0, with a lateness of
// 100 ms there, and a wait layer whose lateness is 25 ms. A move past
// 25 ms pays the wait layer only; one past +100 ms moves the paid layer
// too, from +0, and every payment after that moves it along.
func TestLatenessMovesAPaidSlotPastItsLateness(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	type payment struct {
		from, by time.Duration
		withPaid bool
	}
	for _, tc := range []struct {
		name  string
		moves []time.Duration // successive instants it goes out at, from +0
		paid  []payment
	}{
		{name: "within both", moves: []time.Duration{ms(20)}},
		{name: "past the wait layer's only", moves: []time.Duration{ms(60)}, paid: []payment{{0, ms(60), false}}},
		{name: "past the slot's", moves: []time.Duration{ms(150)}, paid: []payment{{0, ms(150), true}}},
		{name: "past the wait layer's, then the slot's", moves: []time.Duration{ms(60), ms(120), ms(180)},
			paid: []payment{{0, ms(60), false}, {0, ms(120), true}, {ms(120), ms(60), true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := time.Unix(1_700_000_000, 0)
			var paid []payment
			l := &lateness{after: ms(25), paidUntil: base.Add(ms(100)), paidFrom: base, pay: func(f time.Time, by time.Duration, withPaid bool) (bool, error) {
				paid = append(paid, payment{f.Sub(base), by, withPaid})
				return true, nil
			}}
			charged := base
			for _, m := range tc.moves {
				to := base.Add(m)
				if !l.owes(charged, to) {
					continue
				}
				if moved, err := l.payTo(charged, to); !moved || err != nil {
					t.Fatalf("payTo +%v: %v, %v", m, moved, err)
				}
				charged = to
			}
			if !slices.Equal(paid, tc.paid) {
				t.Errorf("paid %v, want %v", paid, tc.paid)
			}
		})
	}
}
