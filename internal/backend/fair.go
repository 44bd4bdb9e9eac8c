package backend

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// FairLayer is the name a fair-share wait goes by: LayerResult.Limiting,
// LimitError.Layer and the layer label of metrics. A layer may not take it.
const FairLayer = "fair"

// DefaultFairHorizon is Fair.Horizon's default.
const DefaultFairHorizon = 500 * time.Millisecond

// FairGrain is the granularity, in µs, at which a store forgets the
// weight of a tenant whose reservations have all come due: 10 ms.
const FairGrain = 10_000

// Fair shares a saturated shared bucket among tenants by weight (weighted
// max-min). A request names its tenant (LayerRequest.Tenant). While the
// shared bucket has tokens, nothing changes: every request is granted at
// once. When a request would queue (its reservation is in the future), its
// tenant may hold at most its share of the horizon in the queue: Rate ·
// Horizon · weight / W tokens reserved and not yet due, where W sums the
// weights of the tenants of the request's class that hold reservations
// not yet due (this one included). A tenant that holds none may always
// book one request. A request over its tenant's share books nothing and is
// told exactly when its tenant's reservations will have come due far
// enough (LayerResult.Limiting is FairLayer). Since the queue drains in
// order, each tenant's throughput is proportional to what it holds in it
// (Little's law): the shares follow the weights while every tenant has
// more waiting than its share, a tenant that needs less leaves the rest to
// the others, an idle tenant holds nothing and counts in no share, and a
// newcomer waits at most behind the others' shares of the horizon.
//
// A tenant's reservations are assumed to come due evenly until its last
// one: the store keeps three numbers per active tenant (tokens held, when
// counted, the due instant of its last reservation), which expire with
// that last reservation.
type Fair struct {
	// Weights gives the weight of named tenants; each must be > 0.
	Weights map[string]float64
	// DefaultWeight is the weight of a tenant not in Weights. Default 1.
	DefaultWeight float64
	// Horizon is how far ahead, in time of the shared rate, all tenants
	// together may hold reservations before their shares apply. Longer
	// keeps the shares closer to the weights; shorter lets a newcomer
	// through sooner. Default DefaultFairHorizon (500ms); at most 1 minute.
	Horizon time.Duration
}

// Validate checks f and fills in its defaults. Errors are *ParamError
// whose Param is the field ("Weights[acme]", "DefaultWeight",
// "Horizon"), joined with errors.Join.
func (f *Fair) Validate() error {
	var errs []error
	if f.DefaultWeight == 0 {
		f.DefaultWeight = 1
	}
	if !(f.DefaultWeight > 0) || f.DefaultWeight > 1e6 {
		errs = append(errs, &ParamError{Param: "DefaultWeight", Msg: "must be > 0 and <= 1e6", Value: f.DefaultWeight})
	}
	names := make([]string, 0, len(f.Weights))
	for k := range f.Weights {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if w := f.Weights[k]; !(w > 0) || w > 1e6 {
			errs = append(errs, &ParamError{Param: "Weights[" + k + "]", Msg: "must be > 0 and <= 1e6", Value: w})
		}
		if k == "" {
			errs = append(errs, &ParamError{Param: "Weights", Msg: "a tenant's name must not be empty"})
		}
	}
	if f.Horizon == 0 {
		f.Horizon = DefaultFairHorizon
	}
	if f.Horizon < time.Millisecond || f.Horizon > time.Minute {
		errs = append(errs, &ParamError{Param: "Horizon", Msg: "must be between 1ms and 1m", Value: f.Horizon})
	}
	return errors.Join(errs...)
}

// Weight returns tenant's weight: Weights[tenant], else DefaultWeight
// (1 when unset).
func (f *Fair) Weight(tenant string) float64 {
	if w, ok := f.Weights[tenant]; ok {
		return w
	}
	if f.DefaultWeight > 0 {
		return f.DefaultWeight
	}
	return 1
}

// FairStore is a LayeredStore with fair shares among tenants.
type FairStore interface {
	// Fair returns the store's fair shares, nil for none.
	Fair() *Fair
}

// FairOf returns s's fair shares, nil when it has none.
func FairOf(s any) *Fair {
	if fs, ok := s.(FairStore); ok {
		return fs.Fair()
	}
	return nil
}

// FairError returns the *LimitError for a request that its tenant's fair
// share makes wait, refused instead (limiter.Request.FairWaiting): an
// ActionDelay refusal by FairLayer, with room after wait, the tenant's
// reservations coming due spacing apart.
func FairError(at time.Time, wait, spacing time.Duration) *LimitError {
	return &LimitError{
		Layer: FairLayer, Action: ActionDelay, Wait: wait, RetryAt: at.Add(wait), Spacing: spacing,
		Reason: fmt.Sprintf("tenant over its fair share; room in %v", wait.Round(time.Millisecond)),
	}
}

// fairBinEnd returns the end of the FairGrain bin that holds d (µs): a
// tenant whose last reservation is due at d counts in its class's weight
// while fairBinEnd(d) > now.
func fairBinEnd(d int64) int64 {
	return (d + FairGrain - 1) / FairGrain * FairGrain
}

// fairHeld returns what a tenant that held held tokens at ts, its last
// reservation due at last, still holds at now: its reservations come due
// evenly until last.
func fairHeld(held float64, ts, last, now int64) float64 {
	if held <= 0 || last <= now {
		return 0
	}
	if now <= ts || last <= ts {
		return held
	}
	return held * float64(last-now) / float64(last-ts)
}

// fairWait returns how long (µs) a tenant that holds h tokens now, its
// last reservation due at last, must wait before it may book cost more
// with a share of capTokens: 0 when it may now (it holds nothing, or
// h+cost fits).
func fairWait(h, capTokens, cost float64, last, now int64) int64 {
	if h <= 0 || h+cost <= capTokens {
		return 0
	}
	span := float64(last - now)
	x := span
	if room := capTokens - cost; room > 0 {
		x = span * (1 - room/h)
	}
	return max(int64(math.Ceil(x)), 1)
}

// fairSpacing returns how far apart (µs) cost tokens of a tenant that
// holds h tokens now, its last reservation due at last, come due: its
// pace while it keeps its share.
func fairSpacing(h, cost float64, last, now int64) int64 {
	if h <= 0 || last <= now {
		return 0
	}
	return int64(math.Ceil(cost * float64(last-now) / h))
}

// fairCap returns a tenant's share, in tokens, of a horizon of horizonUS at
// rate, for weight among the class's weights w.
func fairCap(rate float64, horizonUS int64, weight, w float64) float64 {
	return rate * float64(horizonUS) / 1e6 * weight / w
}

// FairTenant is one tenant as a store reports it: what it holds in the
// shared queue now, in its class.
type FairTenant struct {
	Tenant   string
	Priority Priority
	// Held is the tokens it holds reserved and not yet due.
	Held float64
	// Last is when its last reservation is due.
	Last time.Time
}

// FairStatus is what a store reports of its fair shares.
type FairStatus struct {
	// Active counts the tenants that hold reservations not yet due, by
	// class rank (high, normal, low); Weight sums their weights.
	Active [NumPriorities]int
	Weight [NumPriorities]float64
	// Top lists up to the n tenants asked for that hold the most, most
	// first; Scanned counts the tenants read to find them (a store may
	// read only so many).
	Top     []FairTenant
	Scanned int
	At      time.Time
}

// TopFair sorts ts by Held, most first (then by tenant), and keeps n.
func TopFair(ts []FairTenant, n int) []FairTenant {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Held != ts[j].Held {
			return ts[i].Held > ts[j].Held
		}
		return ts[i].Tenant < ts[j].Tenant
	})
	if len(ts) > n {
		ts = ts[:n]
	}
	return ts
}

// memFairClass is one class's tenants in a LayeredMemory.
type memFairClass struct {
	tenants map[string]*memFairTenant
	w       float64 // the weights of the tenants counted
	n       int     // the tenants counted
	// bins holds, by bin end (µs), the weight and count of the tenants
	// whose last reservation is due in the bin.
	bins map[int64]*memFairBin
}

type memFairTenant struct {
	held     float64
	ts, last int64
}

type memFairBin struct {
	w float64
	n int
}

// memFairTurn is one request's view of its tenant, between the decision
// and the grant.
type memFairTurn struct {
	tenant  string
	weight  float64
	st      memFairTenant
	h       float64 // held now
	counted bool    // the tenant counts in its class's weight
	w       float64 // the class's weight with the tenant in it
}

// SetFair gives m fair shares among tenants (see Fair), validated and
// copied. Call it before m is used.
func (m *LayeredMemory) SetFair(f Fair) error {
	if err := f.Validate(); err != nil {
		return err
	}
	ws := make(map[string]float64, len(f.Weights))
	for k, v := range f.Weights {
		ws[k] = v
	}
	f.Weights = ws
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fair = &f
	return nil
}

// Fair implements FairStore.
func (m *LayeredMemory) Fair() *Fair { return m.fair }

// fairDrain forgets, in every class, the tenants whose last reservation's
// bin ended at or before now, in the order of the bins. m.mu is held.
func (m *LayeredMemory) fairDrain(now int64) {
	for r := range m.fc {
		fc := &m.fc[r]
		var ends []int64
		for e := range fc.bins {
			if e <= now {
				ends = append(ends, e)
			}
		}
		sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
		for _, e := range ends {
			b := fc.bins[e]
			fc.w -= b.w
			fc.n -= b.n
			if fc.n <= 0 {
				fc.w, fc.n = 0, 0
			}
			delete(fc.bins, e)
		}
	}
}

// fairTurn reads tenant in class rank c at now. m.mu is held.
func (m *LayeredMemory) fairTurn(now int64, c int, tenant string) *memFairTurn {
	m.fairDrain(now)
	fc := &m.fc[c]
	t := &memFairTurn{tenant: tenant, weight: m.fair.Weight(tenant)}
	if s := fc.tenants[tenant]; s != nil {
		t.st = *s
	}
	t.h = fairHeld(t.st.held, t.st.ts, t.st.last, now)
	t.counted = t.st.last > 0 && fairBinEnd(t.st.last) > now
	t.w = fc.w
	if !t.counted {
		t.w += t.weight
	}
	return t
}

// wait returns how long (µs) t's tenant must wait before it may book cost
// at rate: 0 when it may now.
func (t *memFairTurn) wait(f *Fair, rate, cost float64, now int64) int64 {
	return fairWait(t.h, fairCap(rate, f.Horizon.Microseconds(), t.weight, t.w), cost, t.st.last, now)
}

// fairGrant books cost for t's tenant, its reservation due at send. m.mu
// is held.
func (m *LayeredMemory) fairGrant(c int, t *memFairTurn, cost float64, now, send int64) {
	fc := &m.fc[c]
	if fc.tenants == nil {
		fc.tenants, fc.bins = map[string]*memFairTenant{}, map[int64]*memFairBin{}
	}
	last := max(t.st.last, send)
	nb := fairBinEnd(last)
	if t.counted {
		if ob := fairBinEnd(t.st.last); ob != nb {
			b := fc.bins[ob]
			if b != nil {
				b.w -= t.weight
				b.n--
				if b.n <= 0 {
					delete(fc.bins, ob)
				}
			}
			m.fairBinAdd(fc, nb, t.weight)
		}
	} else {
		fc.w += t.weight
		fc.n++
		m.fairBinAdd(fc, nb, t.weight)
	}
	fc.tenants[t.tenant] = &memFairTenant{held: t.h + cost, ts: now, last: last}
}

func (m *LayeredMemory) fairBinAdd(fc *memFairClass, end int64, w float64) {
	b := fc.bins[end]
	if b == nil {
		b = &memFairBin{}
		fc.bins[end] = b
	}
	b.w += w
	b.n++
}

// fairSweep drops the tenants that a missing state means anyway. m.mu is
// held.
func (m *LayeredMemory) fairSweep(now int64) {
	for r := range m.fc {
		for k, s := range m.fc[r].tenants {
			if fairBinEnd(s.last) <= now {
				delete(m.fc[r].tenants, k)
			}
		}
	}
}

// FairStatus returns the tenants counted in each class and the n that hold
// the most.
func (m *LayeredMemory) FairStatus(n int) FairStatus {
	return m.FairStatusAt(m.now(), n)
}

// FairStatusAt is FairStatus at an explicit instant.
func (m *LayeredMemory) FairStatusAt(t time.Time, n int) FairStatus {
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	st := FairStatus{At: time.UnixMicro(now)}
	if m.fair == nil {
		return st
	}
	m.fairDrain(now)
	var all []FairTenant
	for r := range m.fc {
		st.Active[r], st.Weight[r] = m.fc[r].n, m.fc[r].w
		for k, s := range m.fc[r].tenants {
			if fairBinEnd(s.last) <= now {
				continue
			}
			st.Scanned++
			all = append(all, FairTenant{Tenant: k, Priority: PriorityOfRank(r), Held: fairHeld(s.held, s.ts, s.last, now), Last: time.UnixMicro(s.last)})
		}
	}
	st.Top = TopFair(all, n)
	return st
}
