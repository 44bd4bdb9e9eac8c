package storetest

import (
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// FairFactory returns a new store with fair shares: a full shared bucket
// of rate and burst, no layers, and no tenant state.
type FairFactory func(t *testing.T, rate float64, burst int, fair limiter.Fair) LayeredClockedStore

// fstep is one take of tenant's at Base+at and what it must answer.
type fstep struct {
	at     time.Duration
	tenant string
	class  limiter.Priority

	granted bool
	wait    time.Duration
	fair    bool          // the wait is the tenant's fair share's (Limiting FairLayer)
	spacing time.Duration // with fair: FairSpacing
	active  int           // FairActive
}

const ms = time.Millisecond

var fairCases = []struct {
	name    string
	rate    float64
	burst   int
	fair    limiter.Fair
	maxWait time.Duration
	steps   []fstep
}{
	{
		// 10/s, a horizon of 1 s: a tenant alone may hold 10 tokens
		// ahead; with a second one, 5 each.
		name: "two tenants", rate: 10, burst: 1, maxWait: 5 * time.Second,
		fair: limiter.Fair{Horizon: time.Second},
		steps: []fstep{
			{at: 0, tenant: "a", granted: true, active: 0}, // a full bucket: no queue, no share
			{at: 0, tenant: "a", granted: true, wait: 100 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 200 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 300 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 400 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 500 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 600 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 700 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 800 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 900 * ms, active: 1},
			{at: 0, tenant: "a", granted: true, wait: 1000 * ms, active: 1},
			// a holds its 10: it may book again once one came due.
			{at: 0, tenant: "a", wait: 100 * ms, fair: true, spacing: 100 * ms, active: 1},
			// b holds nothing: it books at once, behind a's 10.
			{at: 0, tenant: "b", granted: true, wait: 1100 * ms, active: 2},
			// Now 5 each: a waits until it holds 4 (at 600 ms), b books.
			{at: 0, tenant: "a", wait: 600 * ms, fair: true, spacing: 100 * ms, active: 2},
			{at: 0, tenant: "b", granted: true, wait: 1200 * ms, active: 2},
			{at: 599 * ms, tenant: "a", wait: 1 * ms, fair: true, active: 2},
			{at: 600 * ms, tenant: "a", granted: true, wait: 700 * ms, active: 2},
			// b's last reservation is due at 1.2 s, a's at 1.3 s: b no
			// longer counts once the bin that ends at 1.21 s has passed,
			// and comes back as a newcomer, behind a's.
			{at: 1250 * ms, tenant: "b", granted: true, wait: 150 * ms, active: 2},
			// Everything due: nobody counts.
			{at: 1500 * ms, tenant: "c", granted: true, active: 0},
		},
	},
	{
		// Weights 3:1 at 20/s, a horizon of 1 s: acme may hold 15 of
		// 20, b 5.
		name: "weights", rate: 20, burst: 1, maxWait: 5 * time.Second,
		fair: limiter.Fair{Horizon: time.Second, Weights: map[string]float64{"acme": 3}},
		steps: []fstep{
			{at: 0, tenant: "b", granted: true},
			{at: 0, tenant: "b", granted: true, wait: 50 * ms, active: 1},
			{at: 0, tenant: "acme", granted: true, wait: 100 * ms, active: 2},
			{at: 0, tenant: "acme", granted: true, wait: 150 * ms, active: 2},
			{at: 0, tenant: "b", granted: true, wait: 200 * ms, active: 2},
			{at: 0, tenant: "b", granted: true, wait: 250 * ms, active: 2},
			{at: 0, tenant: "b", granted: true, wait: 300 * ms, active: 2},
			{at: 0, tenant: "b", granted: true, wait: 350 * ms, active: 2},
			// b holds 5 = 20 · 1/4: it waits until one came due (its
			// reservations come due evenly until 350 ms: 70 ms).
			{at: 0, tenant: "b", wait: 70 * ms, fair: true, spacing: 70 * ms, active: 2},
		},
	},
	{
		// Classes share within themselves: a high tenant is alone in
		// its class.
		name: "classes", rate: 10, burst: 1, maxWait: 5 * time.Second,
		fair: limiter.Fair{Horizon: time.Second},
		steps: []fstep{
			{at: 0, tenant: "a", granted: true},
			{at: 0, tenant: "a", granted: true, wait: 100 * ms, active: 1},
			{at: 0, tenant: "b", granted: true, wait: 200 * ms, active: 2},
			{at: 0, tenant: "h", class: limiter.PriorityHigh, granted: true, wait: 100 * ms, active: 1},
		},
	},
}

// RunFair runs the fair-share step tables against stores made by newStore.
func RunFair(t *testing.T, newStore FairFactory) {
	for _, c := range fairCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, c.rate, c.burst, c.fair)
			for i, st := range c.steps {
				now := Base.Add(st.at)
				req := backend.LayerRequest{Cost: 1, MaxWait: c.maxWait, Tenant: st.tenant, Priority: st.class}
				res, err := s.TakeLayersAt(now, req)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				limiting := ""
				if st.fair {
					limiting = limiter.FairLayer
				}
				if res.Granted != st.granted || res.Wait != st.wait || res.Limiting != limiting || res.FairActive != st.active || !res.At.Equal(now) ||
					(st.spacing > 0 && res.FairSpacing != st.spacing) {
					t.Fatalf("step %d: take(%q) at +%v = granted %v wait %v limiting %q active %d spacing %v\nwant granted %v wait %v limiting %q active %d spacing %v",
						i, st.tenant, st.at, res.Granted, res.Wait, res.Limiting, res.FairActive, res.FairSpacing, st.granted, st.wait, limiting, st.active, st.spacing)
				}
			}
		})
	}
}
