package limiter

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// LeaseOptions configure token leasing. At high rates a Bucket takes a batch
// of tokens in one store call and spends them locally, so that one bucket
// can grant far more tokens per second than the store can answer calls. One
// caller per replica at a time refills the lease, asking for the whole batch:
// taken at once when the bucket has it, else reserved and waited for like
// any request, so a saturated bucket costs one store call per batch; the
// other callers of the replica wait for that refill instead of asking too.
//
// The batch is Fraction·rate/replicas, capped at MaxBatch and the burst, so
// that all replicas together never hold more than Fraction of one second's
// tokens: with the default 1% the over-grant in any one-second window stays
// within 1% of the rate. Below MinBatch leasing switches itself off, which
// keeps low rates exact and fair; it also waits for the first heartbeat, so
// that a batch is never sized for one replica when there are many. Unused
// tokens go back to the bucket after Idle without use, and on Close; a
// Pause drops them.
//
// A lease is taken for the Bucket's class (Options.Priority) and serves
// only requests of that class: a request of another class asks the store,
// where it takes its place among the classes, and never leads a refill.
type LeaseOptions struct {
	// Disabled turns leasing off.
	Disabled bool
	// Fraction of the rate that all replicas together may hold. Default 0.01.
	Fraction float64
	// MinBatch is the smallest batch worth leasing. Default 8.
	MinBatch int
	// MaxBatch caps a batch. Default 10000.
	MaxBatch int
	// Idle is how long leased tokens may sit unused before they go back.
	// Default 100ms.
	Idle time.Duration
}

func (o *LeaseOptions) validate() error {
	if o.Fraction < 0 || o.Fraction > 1 || math.IsNaN(o.Fraction) {
		return &ParamError{Param: "Lease.Fraction", Msg: "must be between 0 and 1", Value: o.Fraction}
	}
	if o.MinBatch < 0 {
		return &ParamError{Param: "Lease.MinBatch", Msg: "must be >= 0 (0 for the default)", Value: o.MinBatch}
	}
	if o.MaxBatch < 0 {
		return &ParamError{Param: "Lease.MaxBatch", Msg: "must be >= 0 (0 for the default)", Value: o.MaxBatch}
	}
	if o.Fraction == 0 {
		o.Fraction = 0.01
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

// leasePool holds the tokens this replica leased and has not spent yet.
type leasePool struct {
	b      *Bucket
	opts   LeaseOptions
	mu     sync.Mutex
	tokens int
	used   bool          // spent from or refilled since the idle timer last fired
	idle   backend.Timer // gives unused tokens back; nil until the first lease
	// refilling is closed when the caller refilling the pool has its answer.
	refilling chan struct{}
}

func (p *leasePool) init(b *Bucket) {
	p.b, p.opts = b, b.opts.Lease
}

// serves reports whether the pool serves requests of class c: those of
// the Bucket's class, while leasing is on.
func (p *leasePool) serves(c Priority) bool {
	return !p.opts.Disabled && c == p.b.opts.Priority
}

// take spends cost leased tokens if the pool has them and serves class c.
func (p *leasePool) take(c Priority, cost int) bool {
	if !p.serves(c) {
		return false
	}
	p.mu.Lock()
	ok := p.spendLocked(cost)
	p.mu.Unlock()
	return ok
}

// spendLocked spends cost tokens if the pool has them; p.mu is held.
func (p *leasePool) spendLocked(cost int) bool {
	if p.tokens < cost {
		return false
	}
	p.tokens -= cost
	p.used = true
	return true
}

// beginRefill is called when the pool lacks cost tokens for a request of
// class c. While leasing is on for c, one caller at a time asks the store
// for a batch; the others wait for its answer and try the pool again,
// instead of all asking the store at once. It reports whether the caller
// was served from the pool, or must ask the store itself, leading a refill
// that it ends with endRefill.
func (p *leasePool) beginRefill(ctx context.Context, c Priority, cost int) (served, leading bool, err error) {
	if !p.serves(c) || p.extra(cost) == 0 {
		return false, false, nil
	}
	for {
		p.mu.Lock()
		if p.spendLocked(cost) {
			p.mu.Unlock()
			return true, false, nil
		}
		if p.refilling == nil {
			p.refilling = make(chan struct{})
			p.mu.Unlock()
			return false, true, nil
		}
		ch := p.refilling
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
	}
}

// endRefill lets the callers waiting in beginRefill try the pool again.
func (p *leasePool) endRefill() {
	p.mu.Lock()
	close(p.refilling)
	p.refilling = nil
	p.mu.Unlock()
}

// extra returns how many tokens beyond cost to ask the store for: the batch
// for the current rate and replica count, or 0 when leasing is off at this
// rate.
func (p *leasePool) extra(cost int) int {
	if p.opts.Disabled || !p.b.countKnown.Load() {
		return 0
	}
	rate := math.Float64frombits(p.b.lastRate.Load())
	batch := p.opts.Fraction * rate / float64(max(1, p.b.replicas.Load()))
	if batch < float64(p.opts.MinBatch) {
		return 0
	}
	return max(0, min(int(batch), p.opts.MaxBatch, int(p.b.lastBurst.Load()))-cost)
}

// put adds n leased tokens and arms the idle timer that gives them back if
// they sit unused.
func (p *leasePool) put(n int) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tokens += n
	p.used = true
	if p.idle == nil {
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
	n := p.tokens
	p.tokens = 0
	p.idle = nil
	p.mu.Unlock()
	if n == 0 {
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

// drop forgets the leased tokens, as when the bucket is paused.
func (p *leasePool) drop() { p.drain() }

// drain empties the pool and returns what it held.
func (p *leasePool) drain() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.tokens
	p.tokens = 0
	if p.idle != nil {
		p.idle.Stop()
		p.idle = nil
	}
	return n
}
