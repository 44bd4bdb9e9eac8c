package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// A policy step: a take of a message (cost, price, class, keys) or a
// status, at an instant, and what it must answer.
type pstepP struct {
	when     time.Time
	status   bool // a layer status of layer/key
	refundOf int  // > 0: refund the take of step refundOf-1

	cost  int
	price limiter.Amount
	prio  limiter.Priority
	keys  map[string]string

	granted  bool
	wait     time.Duration
	limiting string
	exceeded limiter.Action
	err      error

	layer, key string
	spent      limiter.Amount
	used       int
	open       [2]time.Time
	full       bool
}

func hm(h, m int) time.Duration { return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute }

func days(s string) limiter.Weekdays {
	w, err := limiter.ParseWeekdays(s)
	if err != nil {
		panic(err)
	}
	return w
}

func to(n string) map[string]string { return map[string]string{"quiet": n} }

const (
	nyc   = "+12125550100" // America/New_York
	sf    = "+14155550100" // America/Los_Angeles
	idaho = "+12085550100" // America/Boise and America/Los_Angeles
	paris = "+33612345678" // FR, Europe/Paris
)

// quiet is the window of the examples: 08:00 to 21:00 every day in the
// recipient's zone, France 08:00 to 20:00 Monday to Saturday, high
// priority exempt.
func quiet() limiter.Layer {
	return limiter.Layer{Name: "quiet", Keyed: true, Window: &limiter.Window{
		Calendar:  limiter.Calendar{From: hm(8, 0), To: hm(21, 0)},
		ByNumber:  true,
		Countries: map[string]limiter.Calendar{"FR": {From: hm(8, 0), To: hm(20, 0), Days: days("mon-sat")}},
		Exempt:    []limiter.Priority{limiter.PriorityHigh},
	}}
}

var policyCases = []struct {
	name   string
	rate   float64
	burst  int
	layers []limiter.Layer
	steps  []pstepP
}{
	{"window: New York by number across the spring-forward day; Los Angeles not held up", 100, 100,
		[]limiter.Layer{quiet()},
		[]pstepP{
			// Sat 2026-03-07, EST (UTC-5): 08:00 is 13:00Z.
			{when: utc("2026-03-07T12:30:00Z"), cost: 1, keys: to(nyc), wait: 30 * time.Minute, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-03-07T13:00:00Z"), cost: 1, keys: to(nyc), granted: true},
			// Sun 2026-03-08 springs forward at 07:00Z; 08:00 EDT is 12:00Z.
			{when: utc("2026-03-08T11:59:00Z"), cost: 1, keys: to(nyc), wait: time.Minute, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-03-08T12:00:00Z"), cost: 1, keys: to(nyc), granted: true},
			// 21:00 EDT is 01:00Z on the 9th; to is exclusive.
			{when: utc("2026-03-09T00:59:59Z"), cost: 1, keys: to(nyc), granted: true},
			{when: utc("2026-03-09T01:00:00Z"), cost: 1, keys: to(nyc), wait: 11 * time.Hour, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-03-09T01:00:00Z"), status: true, layer: "quiet", key: nyc, open: [2]time.Time{utc("2026-03-09T12:00:00Z"), utc("2026-03-10T01:00:00Z")}},
			// 18:00 PDT in San Francisco at the same instant.
			{when: utc("2026-03-09T01:00:00Z"), cost: 1, keys: to(sf), granted: true},
			{when: utc("2026-03-09T01:00:00Z"), status: true, layer: "quiet", key: sf, full: true, open: [2]time.Time{utc("2026-03-08T15:00:00Z"), utc("2026-03-09T04:00:00Z")}},
		}},
	{"window: a prefix with two zones is open while both are (Idaho: Boise and Los Angeles)", 100, 100,
		[]limiter.Layer{quiet()},
		[]pstepP{
			// Mon 2026-01-05: 08:30 MST, 07:30 PST.
			{when: utc("2026-01-05T15:30:00Z"), cost: 1, keys: to(idaho), wait: 30 * time.Minute, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-01-06T03:30:00Z"), cost: 1, keys: to(idaho), granted: true},
			// 21:00 MST, 20:00 PST: closed in Boise.
			{when: utc("2026-01-06T04:00:00Z"), cost: 1, keys: to(idaho), wait: 12 * time.Hour, limiting: "quiet", exceeded: limiter.ActionDelay},
		}},
	{"window: France 08:00 to 20:00, not on Sundays; high priority exempt", 100, 100,
		[]limiter.Layer{quiet()},
		[]pstepP{
			// Sat 2026-01-03 20:30 in Paris (UTC+1): closed until Monday 08:00 (07:00Z).
			{when: utc("2026-01-03T19:30:00Z"), cost: 1, keys: to(paris), wait: 35*time.Hour + 30*time.Minute, limiting: "quiet", exceeded: limiter.ActionDelay},
			// Sun 2026-01-04 11:00 in Paris: closed; 05:00 in New York: 3 hours.
			{when: utc("2026-01-04T10:00:00Z"), cost: 1, keys: to(paris), wait: 21 * time.Hour, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-01-04T10:00:00Z"), cost: 1, keys: to(nyc), wait: 3 * time.Hour, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-01-04T10:00:00Z"), cost: 1, keys: to(paris), prio: limiter.PriorityHigh, granted: true},
			{when: utc("2026-01-05T07:00:00Z"), cost: 1, keys: to(paris), granted: true},
			// A number in any format is one key; a key that is not a number is refused for good.
			{when: utc("2026-01-05T07:00:00Z"), cost: 1, keys: to("+33 6 12 34 56 78"), granted: true},
			{when: utc("2026-01-05T07:00:00Z"), cost: 1, keys: to("not a number"), err: limiter.ErrLimitExceeded},
		}},
	{"window: 22:00 to 06:00 opening on Fridays, in a fixed zone (midnight span, days)", 100, 100,
		[]limiter.Layer{{Name: "night", Window: &limiter.Window{Calendar: limiter.Calendar{From: hm(22, 0), To: hm(6, 0), Days: days("fri")}, Location: time.UTC}, OnExceed: limiter.ActionWait}},
		[]pstepP{
			// Fri 2026-01-02.
			{when: utc("2026-01-02T21:00:00Z"), cost: 1, wait: time.Hour, limiting: "night"},
			{when: utc("2026-01-02T22:00:00Z"), cost: 1, granted: true},
			{when: utc("2026-01-03T05:59:59Z"), cost: 1, granted: true},
			{when: utc("2026-01-03T06:00:00Z"), cost: 1, wait: 6*24*time.Hour + 16*time.Hour, limiting: "night"},
			{when: utc("2026-01-03T22:00:00Z"), cost: 1, wait: 6 * 24 * time.Hour, limiting: "night"},
		}},
	{"budget: 1.00 a day at 0.04 a message, to the micro-unit; refund; next day", 1000, 1000,
		[]limiter.Layer{{Name: "spend", Budget: 1_000_000, Per: limiter.PerDay}},
		append(append(budgetSteps(utc("2026-01-05T10:00:00Z"), 25, 40_000),
			pstepP{when: utc("2026-01-05T10:00:01Z"), cost: 1, price: 40_000, wait: 14*time.Hour - time.Second, limiting: "spend"},
			pstepP{when: utc("2026-01-05T10:00:01Z"), cost: 1, price: 0, granted: true},
			pstepP{when: utc("2026-01-05T10:00:01Z"), status: true, layer: "spend", spent: 1_000_000, open: [2]time.Time{}},
			pstepP{when: utc("2026-01-05T10:00:02Z"), refundOf: 25},
			pstepP{when: utc("2026-01-05T10:00:02Z"), status: true, layer: "spend", spent: 960_000},
			pstepP{when: utc("2026-01-05T10:00:03Z"), cost: 2, price: 40_001, wait: 14*time.Hour - 3*time.Second, limiting: "spend"},
			pstepP{when: utc("2026-01-05T10:00:03Z"), cost: 1, price: 40_000, granted: true},
			pstepP{when: utc("2026-01-05T10:00:03Z"), cost: 1, price: 1_000_001, err: limiter.ErrCostExceedsBurst},
			pstepP{when: utc("2026-01-06T00:00:00Z"), cost: 3, price: 1_000_000, granted: true},
		), pstepP{when: utc("2026-01-06T00:00:00Z"), status: true, layer: "spend", spent: 1_000_000})},
	{"budget: per tenant, a month in New York, dead_letter past it", 1000, 1000,
		[]limiter.Layer{{Name: "tenant", Keyed: true, Budget: 500_000_000, Per: limiter.PerMonth, Location: ny(), OnExceed: limiter.ActionDeadLetter}},
		[]pstepP{
			{when: utc("2026-01-31T12:00:00Z"), cost: 1, price: 499_990_000, keys: map[string]string{"tenant": "a"}, granted: true},
			{when: utc("2026-01-31T12:00:00Z"), cost: 1, price: 10_001, keys: map[string]string{"tenant": "a"}, wait: 17 * time.Hour, limiting: "tenant", exceeded: limiter.ActionDeadLetter},
			{when: utc("2026-01-31T12:00:00Z"), cost: 1, price: 10_000, keys: map[string]string{"tenant": "a"}, granted: true},
			{when: utc("2026-01-31T12:00:00Z"), cost: 1, price: 10_000, keys: map[string]string{"tenant": "b"}, granted: true},
			// February starts at 05:00Z in New York.
			{when: utc("2026-02-01T04:59:59Z"), status: true, layer: "tenant", key: "a", spent: 500_000_000},
			{when: utc("2026-02-01T05:00:00Z"), status: true, layer: "tenant", key: "a", full: true},
		}},
	{"budget and window decided together: a closed window charges no budget", 1000, 1000,
		[]limiter.Layer{quiet(), {Name: "spend", Budget: 100_000, Per: limiter.PerDay}},
		[]pstepP{
			{when: utc("2026-01-05T10:00:00Z"), cost: 1, price: 100_000, keys: to(nyc), wait: 3 * time.Hour, limiting: "quiet", exceeded: limiter.ActionDelay},
			{when: utc("2026-01-05T10:00:00Z"), status: true, layer: "spend", full: true},
			{when: utc("2026-01-05T10:00:00Z"), cost: 1, price: 100_000, keys: to(paris), granted: true},
			{when: utc("2026-01-05T13:00:00Z"), cost: 1, price: 1, keys: to(nyc), wait: 11 * time.Hour, limiting: "spend"},
		}},
}

// budgetSteps returns n grants of price at when.
func budgetSteps(when time.Time, n int, price limiter.Amount) []pstepP {
	out := make([]pstepP, n)
	for i := range out {
		out[i] = pstepP{when: when, cost: 1, price: price, granted: true}
	}
	return out
}

// RunPolicyLayers runs the step tables of send windows and budgets against
// stores made by newStore.
func RunPolicyLayers(t *testing.T, newStore LayeredFactory) {
	for _, c := range policyCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, c.rate, c.burst, c.layers)
			reqs := make([]backend.LayerRequest, len(c.steps))
			results := make([]backend.LayerResult, len(c.steps))
			for i, st := range c.steps {
				now := st.when
				if st.refundOf > 0 {
					if err := s.RefundLayersAt(now, reqs[st.refundOf-1], results[st.refundOf-1]); err != nil {
						t.Fatalf("step %d: refund: %v", i, err)
					}
					continue
				}
				if st.status {
					got, err := s.LayerStatusAt(now, st.layer, st.key)
					if err != nil {
						t.Fatalf("step %d: status: %v", i, err)
					}
					if got.Spent != st.spent || got.Used != st.used || got.Full != st.full || (!st.open[0].IsZero() && (!got.Open[0].Equal(st.open[0]) || !got.Open[1].Equal(st.open[1]))) {
						t.Fatalf("step %d: status %s/%s at %v = %+v\nwant spent %v used %d full %v open %v", i, st.layer, st.key, now, got, st.spent, st.used, st.full, st.open)
					}
					continue
				}
				req := backend.LayerRequest{Cost: st.cost, Price: st.price, Priority: st.prio, Keys: st.keys, MaxWait: time.Second}
				res, err := s.TakeLayersAt(now, req)
				reqs[i], results[i] = req, res
				if st.err != nil {
					if !errors.Is(err, st.err) {
						t.Fatalf("step %d: err = %v, want %v", i, err, st.err)
					}
					var le *limiter.LimitError
					if !errors.As(err, &le) || le.Action != limiter.ActionDeadLetter {
						t.Fatalf("step %d: err = %#v, want a dead_letter *LimitError", i, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				var action limiter.Action
				if res.Exceeded != nil {
					action = res.Exceeded.Action
					if action == limiter.ActionDelay && !res.Exceeded.RetryAt.Equal(now.Add(st.wait)) {
						t.Fatalf("step %d: RetryAt = %v, want %v", i, res.Exceeded.RetryAt, now.Add(st.wait))
					}
					if res.Exceeded.Reserved {
						t.Fatalf("step %d: a %s layer booked a slot: %+v", i, st.limiting, res.Exceeded)
					}
				}
				if res.Granted != st.granted || res.Wait != st.wait || res.Limiting != st.limiting || action != st.exceeded || !res.At.Equal(now) {
					t.Fatalf("step %d: take(cost %d, price %v, %v, keys %v) at %v = granted %v wait %v limiting %q exceeded %q at %v\nwant granted %v wait %v limiting %q exceeded %q",
						i, st.cost, st.price, st.prio, st.keys, now, res.Granted, res.Wait, res.Limiting, action, res.At,
						st.granted, st.wait, st.limiting, st.exceeded)
				}
			}
		})
	}
}
