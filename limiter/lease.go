package limiter

import (
	"context"
	"math"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// LeaseOptions configure token leasing. At high rates a Bucket takes a batch
// of tokens in one store call and spends them locally, so that one bucket
// can grant far more tokens per second than the store can answer calls.
//
// A batch follows this replica's demand, as measured here (the tokens its
// callers of the lease's class asked for in the last second): it covers
// the demand of Fraction of a second, or of replicas ÷ Calls seconds when
// that is longer, so that the whole fleet's refills stay near Calls per
// second however many replicas share the bucket. A replica whose lease
// runs dry soon after a refill, with none of its tokens given back unspent
// since, is short of tokens, not of demand: its next batch doubles, up to
// twice its fair share of the period or its share (÷ replicas) of what
// the bucket held after its last refill, whichever is more, so that the
// fleet's reservations queued ahead of a caller stay short once the bucket
// runs dry, and covers at least its fair share (rate ÷ replicas) over
// the last refill's round trip, so that slow answers do not hold it to a
// batch per round trip. Where the store reserved its last refill (the
// bucket is saturated), a batch is at most twice the fair share of the
// period, whatever the demand (a larger one lengthens the queue of
// reservations ahead of every caller of the fleet, and a replica asking
// less than its share waits that queue for each token), and, where
// callers besides its leader queued for that refill, at least the fair
// share at once: what a starved replica measures as its demand is what it
// got. It is capped at MaxBatch and the burst less what the bucket
// refills within Hold. Before the first second of demand is measured a
// replica assumes its fair share, rate ÷ replicas. All replicas together
// thus hold at most the tokens the fleet spends in max(Fraction s,
// replicas ÷ Calls s). Leasing is off while the batch would be below
// MinBatch, unless the fleet's demand (this replica's times the replicas)
// exceeds Calls, where even a batch of 2 halves the calls (below, Redis
// answers call by call without strain, and calls keep the bucket exact
// and fair across replicas); it also waits for the first heartbeat, so
// that a batch is never sized for one replica when there are many.
//
// A batch's tokens go out from its grant until a deadline that the store's
// answer fixes, and never after it: the store charges the batch as of its
// grant plus Hold (TakeRequest.Hold), and the batch may go out as late as
// the bucket could have held it without refilling past its burst, at
// least Hold after the grant (Hold past the instant the tokens were due,
// for a reserved batch). Tokens spent anywhere in between are as if taken
// at that instant, so that every window the sink sees holds at most
// rate·W + burst, the leased tokens included. What the deadline finds
// unspent goes back to the bucket, and a caller after it leads a new
// refill. Tokens past their instant go back only while no reservation
// queues in the bucket (backend.PastRefunder): those queued keep their
// instants, and tokens put back among them would go out beside them, past
// the burst; a bucket in debt loses them, so a lease follows its demand
// and does not grow while its tokens go back unspent. A refill whose
// answer comes back past its deadline keeps what the bucket could still
// have held for another Hold, when that covers its
// caller, and gives back the rest, else it is given back as a late
// reservation is (its caller asks again, once). The price
// is the refill the bucket loses to its burst within Hold: a lease taken
// from a full bucket lowers its burst by rate·Hold, once. Tokens that
// sit unused for Idle go back too, and all on Close; a Pause drops them.
// A store with layers (LayeredStore) charges its lease at the grant: its
// tokens go back only after Idle without use.
//
// The callers of one replica are served first come, first served: a
// caller that finds the lease short queues, and the tokens of each refill
// go to the queue in order before any later caller may spend them. One
// caller at a time, the head of the queue, refills the lease, asking for
// its cost plus the batch: taken at once when the bucket has it, else
// reserved and waited for like any request, so a saturated bucket costs
// one store call per batch.
//
// A lease is taken for the Bucket's class (Options.Priority) and serves
// only requests of that class: a request of another class asks the store,
// where it takes its place among the classes, and never leads a refill.
type LeaseOptions struct {
	// Disabled turns leasing off.
	Disabled bool
	// Fraction of a second of this replica's demand that a batch covers
	// at least. Default 0.01.
	Fraction float64
	// Calls is the refills per second the whole fleet aims at: a batch
	// covers at least replicas ÷ Calls seconds of demand. Fewer calls
	// mean fewer store scripts and longer waits behind the fleet's
	// batches at a saturated bucket; a replica that asks little saves
	// scripts only where Hold (at most a quarter of burst ÷ rate) lets
	// it spend a larger batch. Default 4000.
	Calls float64
	// MinBatch is the smallest batch worth leasing. Default 8. Where the
	// fleet would call the store more than Calls times a second without
	// leasing, a batch of 2 is leased too.
	MinBatch int
	// MaxBatch caps a batch. Default 10000.
	MaxBatch int
	// Idle is how long leased tokens may sit unused before they go back.
	// Default 100ms.
	Idle time.Duration
	// Hold is how long after its grant a batch may go out at least (see
	// above). Default: the lease period, max(Fraction, replicas ÷ Calls)
	// seconds, plus the last refill's round trip, at most a quarter of
	// burst ÷ rate.
	Hold time.Duration
}

func (o *LeaseOptions) validate() error {
	if o.Fraction < 0 || o.Fraction > 1 || math.IsNaN(o.Fraction) {
		return &ParamError{Param: "Lease.Fraction", Msg: "must be between 0 and 1", Value: o.Fraction}
	}
	if o.Calls < 0 || math.IsNaN(o.Calls) || math.IsInf(o.Calls, 0) {
		return &ParamError{Param: "Lease.Calls", Msg: "must be >= 0 (0 for the default)", Value: o.Calls}
	}
	if o.MinBatch < 0 {
		return &ParamError{Param: "Lease.MinBatch", Msg: "must be >= 0 (0 for the default)", Value: o.MinBatch}
	}
	if o.MaxBatch < 0 {
		return &ParamError{Param: "Lease.MaxBatch", Msg: "must be >= 0 (0 for the default)", Value: o.MaxBatch}
	}
	if o.Hold < 0 {
		return &ParamError{Param: "Lease.Hold", Msg: "must be >= 0 (0 for the default)", Value: o.Hold}
	}
	if o.Fraction == 0 {
		o.Fraction = 0.01
	}
	if o.Calls == 0 {
		o.Calls = 4000
	}
	if o.MinBatch <= 0 {
		o.MinBatch = 8
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 10000
	}
	if o.MaxBatch < o.MinBatch {
		return &ParamError{Param: "Lease.MaxBatch", Msg: "must be >= Lease.MinBatch", Value: o.MaxBatch}
	}
	if o.Idle <= 0 {
		o.Idle = 100 * time.Millisecond
	}
	return nil
}

// leasePool holds the tokens this replica leased and has not spent yet,
// and the callers queued for them.
type leasePool struct {
	b      *Bucket
	opts   LeaseOptions
	mu     fifoMutex
	tokens int
	// maxCost is the largest cost asked of the pool (fifoMutex.bargeOK).
	maxCost int
	// batches holds the tokens by refill, oldest first (their n add up
	// to tokens), each with its deadline; lapsed counts the tokens whose
	// deadline passed, which the due timer gives back.
	batches []leaseBatch
	lapsed  int
	used    bool          // spent from or refilled since the idle timer last fired
	idle    backend.Timer // gives unused tokens back; nil until the first lease
	// due fires at dueAt, the earliest deadline (or at once, for lapsed
	// tokens); nil while none is armed.
	due   backend.Timer
	dueAt time.Time
	// queue holds the callers waiting for tokens, in arrival order. While
	// it is not empty its head leads a refill (refilling).
	queue     []*leaseWaiter
	refilling bool
	// demand measures the tokens asked for by the lease's class.
	demand demandMeter
	// lastFill is when the last refill came, with lastBatch tokens.
	lastFill  time.Time
	lastBatch int
	// lastTrip is how long the last refill's answer took to come back.
	lastTrip time.Duration
	// wasted is set when leased tokens went back unspent (their deadline
	// passed, or they sat unused for Idle) since the last refill: the
	// lease is not short of tokens, whenever it runs out.
	wasted bool
	// lastSpare is what the bucket held after the last refill's grant: 0
	// when the refill was reserved (the bucket had no tokens for it, and
	// every replica's refills queue behind each other's).
	lastSpare float64
	// lastReserved is set when the store reserved the last refill: the
	// bucket is saturated. lastQueued is set when callers besides its
	// leader were queued for the last refill when it came.
	lastReserved, lastQueued bool
}

// leaseBatch is one refill's tokens still leased, and the instant on the
// Bucket's clock from which they must not go out (zero: none).
type leaseBatch struct {
	n     int
	until time.Time
}

// leaseWaiter is a caller queued in the pool.
type leaseWaiter struct {
	cost int
	// until is the earliest deadline of the tokens it was served.
	until time.Time
	// state is set under leasePool.mu; signal has room for one send.
	state  leaseState
	signal chan struct{}
}

type leaseState uint8

const (
	waiterQueued   leaseState = iota
	waiterServed              // its tokens were handed over
	waiterLeading             // it is the head and must refill
	waiterReleased            // leasing went off: it asks the store itself
)

func (p *leasePool) init(b *Bucket) {
	p.b, p.opts = b, b.opts.Lease
	// The lock goes in order only where the order decides who waits for
	// the next refill: while no caller is queued for one and the lease
	// holds the largest cost asked for every caller waiting for the lock
	// and one more, a running caller may take it first (fifoMutex).
	p.mu.bargeOK = func(waiting int) bool {
		return len(p.queue) == 0 && p.tokens >= (waiting+1)*p.maxCost
	}
}

// serves reports whether the pool serves requests of class c: those of
// the Bucket's class, while leasing is on.
func (p *leasePool) serves(c Priority) bool {
	return !p.opts.Disabled && c == p.b.opts.Priority
}

// take spends cost leased tokens if the pool has them, serves class c and
// no caller queued before this one.
func (p *leasePool) take(c Priority, cost int) bool {
	if !p.serves(c) {
		return false
	}
	now := p.b.clock.Now()
	p.mu.Lock()
	p.demand.add(now, cost)
	p.maxCost = max(p.maxCost, cost)
	ok := false
	if len(p.queue) == 0 {
		_, ok = p.spendLocked(now, cost)
	}
	p.mu.Unlock()
	return ok
}

// spendLocked spends cost tokens if the pool has them at now, the oldest
// batches' first, and returns the earliest deadline among them; p.mu is
// held.
func (p *leasePool) spendLocked(now time.Time, cost int) (until time.Time, ok bool) {
	p.pruneLocked(now)
	if p.tokens < cost {
		return time.Time{}, false
	}
	p.tokens -= cost
	p.used = true
	for cost > 0 {
		b := &p.batches[0]
		k := min(b.n, cost)
		b.n -= k
		cost -= k
		if !b.until.IsZero() && (until.IsZero() || b.until.Before(until)) {
			until = b.until
		}
		if b.n == 0 {
			p.batches = append(p.batches[:0], p.batches[1:]...)
		}
	}
	return until, true
}

// pruneLocked moves the tokens whose deadline is at or before now out of
// the pool, to be given back by the due timer; p.mu is held.
func (p *leasePool) pruneLocked(now time.Time) {
	kept := p.batches[:0]
	for _, b := range p.batches {
		if !b.until.IsZero() && !now.Before(b.until) {
			p.tokens -= b.n
			p.lapsed += b.n
			p.wasted = p.wasted || b.n > 0
			continue
		}
		kept = append(kept, b)
	}
	clear(p.batches[len(kept):])
	p.batches = kept
	if p.lapsed > 0 {
		p.armDueLocked(now)
	}
}

// addLocked adds n tokens that must not go out from until (zero: no
// deadline); p.mu is held.
func (p *leasePool) addLocked(n int, until time.Time) {
	if n <= 0 {
		return
	}
	p.tokens += n
	p.batches = append(p.batches, leaseBatch{n: n, until: until})
	if !until.IsZero() {
		p.armDueLocked(p.b.clock.Now())
	}
}

// armDueLocked arms the due timer for the earliest deadline in the pool,
// or at once when tokens lapsed, unless it is armed for that already or
// sooner; p.mu is held.
func (p *leasePool) armDueLocked(now time.Time) {
	at := time.Time{}
	if p.lapsed > 0 {
		at = now
	}
	for _, b := range p.batches {
		if !b.until.IsZero() && (at.IsZero() || b.until.Before(at)) {
			at = b.until
		}
	}
	if at.IsZero() || (!p.dueAt.IsZero() && !at.Before(p.dueAt)) {
		return
	}
	p.dueAt = at
	if p.due == nil {
		p.due = p.b.clock.AfterFunc(at.Sub(now), p.lapse)
		return
	}
	p.due.Reset(at.Sub(now))
}

// lapse runs at the earliest deadline: it gives back the tokens whose
// deadline passed, and arms itself for the next one.
func (p *leasePool) lapse() {
	p.mu.Lock()
	now := p.b.clock.Now()
	p.dueAt = time.Time{}
	p.pruneLocked(now)
	n := p.lapsed
	p.lapsed = 0
	p.armDueLocked(now)
	p.mu.Unlock()
	p.giveBack(n)
}

// giveBack returns n unused tokens to the store, unless the Bucket is
// closed (Close gives back what the pool holds) or not on the store.
func (p *leasePool) giveBack(n int) {
	if n <= 0 {
		return
	}
	select {
	case <-p.b.done:
		return
	default:
	}
	if p.b.Mode() == ModeShared {
		p.b.refund(context.Background(), n)
	}
}

// acquire is called when take failed for a request of class c. While
// leasing is on for c, the caller queues; the head of the queue asks the
// store for a batch, the others wait for it and are served in order. It
// reports whether the caller was served from the pool, or must ask the
// store itself: leading a refill (w not nil: end it with fill or abandon),
// or on its own.
func (p *leasePool) acquire(ctx context.Context, done <-chan struct{}, c Priority, cost int) (served bool, w *leaseWaiter, err error) {
	if !p.serves(c) || p.extra(cost) == 0 {
		return false, nil, nil
	}
	p.mu.Lock()
	if len(p.queue) == 0 {
		if _, ok := p.spendLocked(p.b.clock.Now(), cost); ok {
			p.mu.Unlock()
			return true, nil, nil
		}
	}
	w = &leaseWaiter{cost: cost, signal: make(chan struct{}, 1)}
	p.queue = append(p.queue, w)
	if !p.refilling {
		p.refilling = true
		w.state = waiterLeading
		p.mu.Unlock()
		return false, w, nil
	}
	p.mu.Unlock()
	var cerr error
	select {
	case <-w.signal:
	case <-ctx.Done():
		cerr = ctx.Err()
	case <-done:
		cerr = ErrClosed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch w.state {
	case waiterServed:
		if cerr != nil { // served as it gave up: the tokens stay leased
			p.addLocked(cost, w.until)
			p.serveLocked()
			return false, nil, cerr
		}
		return true, nil, nil
	case waiterLeading:
		if cerr != nil {
			p.abandonLocked(w)
			return false, nil, cerr
		}
		return false, w, nil
	case waiterReleased:
		return false, nil, cerr
	}
	p.removeLocked(w) // still queued: it gave up
	return false, nil, cerr
}

// fill ends the refill that w led: the tokens the store granted, w's cost
// among them, go to the queue in order, w first, and the rest stay leased
// until their deadline (zero: none).
func (p *leasePool) fill(w *leaseWaiter, tokens int, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(w)
	p.lastQueued = len(p.queue) > 0
	p.refilling = false
	p.wasted = false
	p.addLocked(tokens-w.cost, until)
	p.used = true
	p.lastFill, p.lastBatch = p.b.clock.Now(), tokens
	p.armIdleLocked()
	p.serveLocked()
}

// tripped records how long a refill's answer took to come back from the
// store, whether the store reserved it (waited: the bucket had no tokens
// for it) and, granted at once, what the bucket held after it (spare).
func (p *leasePool) tripped(d time.Duration, waited bool, spare float64) {
	if waited {
		spare = 0
	}
	p.mu.Lock()
	p.lastTrip, p.lastSpare, p.lastReserved = d, max(spare, 0), waited
	p.mu.Unlock()
}

// abandon ends the refill that w led without tokens: its caller gave up
// or asks elsewhere. The next in line leads the next refill.
func (p *leasePool) abandon(w *leaseWaiter) {
	p.mu.Lock()
	p.abandonLocked(w)
	p.mu.Unlock()
}

func (p *leasePool) abandonLocked(w *leaseWaiter) {
	p.removeLocked(w)
	p.refilling = false
	p.serveLocked()
}

// serveLocked hands the leased tokens to the queue in order, as far as
// they go, and makes the new head lead the next refill. When leasing went
// off meanwhile, it releases the whole queue to ask the store itself.
func (p *leasePool) serveLocked() {
	now := p.b.clock.Now()
	for len(p.queue) > 0 {
		until, ok := p.spendLocked(now, p.queue[0].cost)
		if !ok {
			break
		}
		p.queue[0].until = until
		p.wake(p.queue[0], waiterServed)
		p.queue[0] = nil
		p.queue = p.queue[1:]
	}
	if len(p.queue) == 0 || p.refilling {
		if len(p.queue) == 0 {
			p.queue = p.queue[:0:0]
		}
		return
	}
	if p.extraLocked(p.queue[0].cost) == 0 {
		for _, w := range p.queue {
			p.wake(w, waiterReleased)
		}
		p.queue = p.queue[:0:0]
		return
	}
	p.refilling = true
	p.wake(p.queue[0], waiterLeading)
}

func (p *leasePool) wake(w *leaseWaiter, s leaseState) {
	w.state = s
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// removeLocked takes w out of the queue if it is there.
func (p *leasePool) removeLocked(w *leaseWaiter) {
	for i, q := range p.queue {
		if q == w {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			return
		}
	}
}

// queued returns how many callers wait in the queue, the refill's leader
// included.
func (p *leasePool) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// extra returns how many tokens beyond cost to ask the store for: the
// batch for this replica's demand, or 0 when leasing is off at it.
func (p *leasePool) extra(cost int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.extraLocked(cost)
}

// extraLocked is extra with p.mu held. The batch covers the replica's
// demand over the lease period, max(Fraction s, replicas ÷ Calls s). A
// replica whose lease ran dry less than half a period after the last
// refill is short of tokens, not of demand (its demand is measured by
// what it could spend), unless tokens went back unspent since that
// refill (at their deadline, or idle): its batch doubles, up to twice its
// fair share of a period or its share of what the bucket held after the
// last refill (spare ÷ replicas), whichever is more, and covers at least
// its fair share (rate ÷ replicas) over the last refill's round trip,
// since a replica that waits a round trip for each batch gets at most a
// batch per round trip, and, where the store reserved the last refill
// and callers besides its leader queued for it, its fair share of a
// period; all up to the cap, rate × period, MaxBatch and the burst less
// what the bucket refills within the hold, and, where the store reserved
// the last refill, twice the fair share of a period (or the fair share
// over the round trip, if more).
func (p *leasePool) extraLocked(cost int) int {
	if p.opts.Disabled || !p.b.countKnown.Load() {
		return 0
	}
	now := p.b.clock.Now()
	rate := math.Float64frombits(p.b.lastRate.Load())
	replicas := float64(max(1, p.b.replicas.Load()))
	period := max(p.opts.Fraction, replicas/p.opts.Calls)
	// share is the fair share of a period; trip the fair share over the
	// last refill's round trip.
	fair := rate / replicas
	share, trip := fair*period, fair*p.lastTrip.Seconds()
	demand, ok := p.demand.rate(now)
	if !ok {
		demand = fair // not measured yet
	}
	batch := min(demand, rate) * period
	if p.lastBatch > 0 && !p.wasted && now.Sub(p.lastFill).Seconds() < period/2 {
		// A saturated bucket reserves every replica's refill behind the
		// others': a batch past twice the fair share of a period would
		// make every caller of the fleet wait for the others' large
		// batches (the reservations ahead of its own). A bucket that
		// still grants at once may lend more, as far as what it held
		// after the last refill, shared among the replicas: batches that
		// doubled past it while a full bucket drained would all be
		// reserved once it is empty (a start-up: every caller of a
		// fleet of 100 waited 75 to 123 ms behind batches of 1,000 and
		// 2,000 tokens, against a fair share of 250).
		grown := min(2*float64(p.lastBatch), max(2*share, p.lastSpare/replicas))
		if p.lastReserved && p.lastQueued {
			// Callers queued for a refill that a saturated bucket
			// reserved: at least the fair share at once. Doubling up
			// from a batch that a low measured demand left small (what
			// a starved replica measures as its demand is what it got)
			// took a reservation per step, each a wait behind the
			// fleet's batches, its callers served a few tokens a
			// reservation meanwhile.
			grown = max(grown, share)
		}
		batch = max(batch, grown, trip)
	}
	if p.lastReserved {
		// A saturated bucket reserves every refill behind the others':
		// a batch past twice the fair share of a period, whatever the
		// demand measured here, lengthens the queue ahead of every
		// caller of the fleet, and a replica that asks for less than its
		// share waits that queue for each of its tokens.
		batch = min(batch, max(2*share, trip))
	}
	floor := float64(p.opts.MinBatch)
	if min(demand, rate)*replicas >= p.opts.Calls {
		floor = min(floor, 2) // unleased, the fleet would call more than Calls/s
	}
	if batch < floor {
		return 0
	}
	// A full bucket holds the batch with what it refills within the hold
	// (LeaseOptions.Hold): a larger batch would be reserved.
	room := float64(p.b.lastBurst.Load()) - math.Floor(rate*p.holdLocked().Seconds())
	batch = min(batch, rate*period, float64(p.opts.MaxBatch), max(room, 1))
	return max(0, int(batch)-cost)
}

// hold returns how long after its grant a batch may go out at least
// (LeaseOptions.Hold): the option, else the lease period plus the last
// refill's round trip, at most a quarter of burst ÷ rate.
func (p *leasePool) hold() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holdLocked()
}

// holdLocked is hold with p.mu held.
func (p *leasePool) holdLocked() time.Duration {
	if p.opts.Hold > 0 {
		return p.opts.Hold
	}
	rate := math.Float64frombits(p.b.lastRate.Load())
	replicas := float64(max(1, p.b.replicas.Load()))
	h := time.Duration(max(p.opts.Fraction, replicas/p.opts.Calls)*float64(time.Second)) + p.lastTrip
	if burst := p.b.lastBurst.Load(); rate > 0 && burst > 0 {
		h = min(h, time.Duration(float64(burst)/rate/4*float64(time.Second)))
	}
	return max(h, time.Microsecond)
}

// demandMeter counts the tokens asked for in the current and the last
// window of demandWindow. Its methods are called with leasePool.mu held,
// which guards it: a leased take costs one lock, not two.
type demandMeter struct {
	start time.Time // of the current window; zero before the first count
	cur   float64   // tokens asked in the current window
	last  float64   // tokens/s in the last whole window; <0 before one ended
}

const demandWindow = time.Second

func (m *demandMeter) add(now time.Time, n int) {
	m.rollLocked(now)
	m.cur += float64(n)
}

func (m *demandMeter) rollLocked(now time.Time) {
	if m.start.IsZero() {
		m.start, m.last = now, -1
		return
	}
	if el := now.Sub(m.start); el >= demandWindow {
		m.last = m.cur / el.Seconds()
		if el >= 2*demandWindow { // a whole window without demand
			m.last = 0
		}
		m.start, m.cur = now, 0
	}
}

// rate returns the demand in tokens/s: the greater of the last whole
// window's and the current one's so far (once a tenth of a window has
// passed), so that a rise shows at once and a fall after a window. It
// reports false while nothing has been measured.
func (m *demandMeter) rate(now time.Time) (float64, bool) {
	m.rollLocked(now)
	r, ok := m.last, m.last >= 0
	if el := now.Sub(m.start); el >= demandWindow/10 {
		r, ok = max(r, m.cur/el.Seconds()), true
	}
	return r, ok
}

// put adds n leased tokens without a deadline, serving the queue first,
// and arms the idle timer that gives them back if they sit unused.
func (p *leasePool) put(n int) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addLocked(n, time.Time{})
	p.used = true
	p.armIdleLocked()
	p.serveLocked()
}

func (p *leasePool) armIdleLocked() {
	if p.idle == nil && p.tokens > 0 {
		p.idle = p.b.clock.AfterFunc(p.opts.Idle, p.expire)
	}
}

// expire runs every Idle while the pool holds tokens: if nothing was spent
// or leased since the last run, it gives the tokens back to the store.
func (p *leasePool) expire() {
	p.mu.Lock()
	if p.idle == nil { // drained and stopped while this run was starting
		p.mu.Unlock()
		return
	}
	if p.used {
		p.used = false
		p.idle.Reset(p.opts.Idle)
		p.mu.Unlock()
		return
	}
	n := p.tokens + p.lapsed
	p.wasted = p.wasted || n > 0
	p.tokens, p.lapsed = 0, 0
	clear(p.batches)
	p.batches = p.batches[:0]
	p.idle = nil
	p.mu.Unlock()
	p.giveBack(n)
}

// drop forgets the leased tokens, as when the bucket is paused.
func (p *leasePool) drop() { p.drain() }

// drain empties the pool and returns what it held.
func (p *leasePool) drain() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.tokens + p.lapsed
	p.tokens, p.lapsed = 0, 0
	clear(p.batches)
	p.batches = p.batches[:0]
	if p.idle != nil {
		p.idle.Stop()
		p.idle = nil
	}
	if p.due != nil {
		p.due.Stop()
		p.due, p.dueAt = nil, time.Time{}
	}
	return n
}
