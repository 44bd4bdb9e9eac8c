package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// Bucket is one replica's handle on a shared token bucket, on top of a
// Store. It adds the store-failure policy (fallback.go), heartbeats
// (heartbeat.go), token leasing (lease.go), the re-timing of reservations
// when the bucket changes or a higher class pushes them back (changes.go),
// and the queueing of the callers a lower class's floor holds back
// (floor.go). Each request has a class (see Priority): Wait and Allow
// the Bucket's Options.Priority, WaitN its Request.Priority.
//
// A Bucket is safe for concurrent use. Call Close when done to stop its
// background goroutines and give back leased tokens.
type Bucket struct {
	store Store
	opts  Options
	log   *slog.Logger
	clock backend.Clock

	mode atomic.Pointer[Mode]
	fb   fallbackState // guarded by its own mutex

	backlog   atomic.Pointer[backend.Backlog] // SetBacklog; nil unknown
	lastRate  atomic.Uint64                   // math.Float64bits of the last effective rate
	lastBurst atomic.Int64
	replicas  atomic.Int64
	waiting   atomic.Int64 // Wait calls in this process past the lease
	// waitingBy counts the same calls per class, indexed by Priority.
	waitingBy [NumPriorities]atomic.Int64
	lastDebt  atomic.Uint64 // math.Float64bits of the tokens last seen reserved ahead
	// bookedUntil is the latest instant, on the Bucket's clock (unix
	// nanoseconds), until which the shared bucket was seen booked by
	// reservations. A fallback starts granting only after it.
	bookedUntil atomic.Int64
	// countKnown is set once the replica count is known: at once for a
	// store that does not track replicas, else after the first heartbeat
	// or status. Leasing and the default fallback share wait for it.
	countKnown  atomic.Bool
	recoveredAt atomic.Int64 // unix nanoseconds of the last switch back to ModeShared
	// granted counts the tokens Wait and Allow granted since New.
	granted atomic.Int64
	// retimed counts the reservations given back and asked again because
	// their caller woke too late past their slot (lateFits).
	retimed atomic.Int64
	// heardPauseEnd is the end (store clock, µs) of the last pause of
	// another replica reported to Observer.Paused.
	heardPauseEnd atomic.Int64

	lease leasePool
	// skew measures the store's clock against the Bucket's (skew.go).
	skew skewMeter
	// trips keeps the round trips of the recent layered calls, by which
	// a request on a paid slot asks ahead of it (waitPaid).
	trips tripMeter
	// layered is the local fallback's layer state (bucket_layers.go).
	layered layeredFallback

	// gen is the current generation of the bucket's settings; it ends when
	// the store announces a change.
	gen atomic.Pointer[generation]
	// pushes fans the store's pushes out to the callers sleeping on
	// reservations of each class (changes.go).
	pushes pushHub
	// slotQueues are the lines of the requests that wait for a
	// concurrency slot (slots.go).
	slotQueues slotQueues
	// floor queues the callers of each class that a lower class's
	// MinShare holds back (floor.go).
	floor floorGate

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New returns a Bucket on store. It makes no store call itself; heartbeats
// start in the background. Options out of range give the error of
// Options.Validate.
func New(store Store, opts Options) (*Bucket, error) {
	if store == nil {
		return nil, &ParamError{Param: "store", Msg: "must not be nil"}
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Shadow {
		var err error
		if store, err = shadowStore(store, opts); err != nil {
			return nil, err
		}
		opts.Lease.Disabled = true // nothing is taken from the shared bucket
	}
	opts = opts.withDefaults()
	b := &Bucket{store: store, opts: opts, log: opts.Logger, clock: opts.Clock, done: make(chan struct{})}
	b.fb.probeNow = make(chan struct{}, 1)
	shared := ModeShared
	b.mode.Store(&shared)
	rate, burst := store.Limits()
	b.lastRate.Store(math.Float64bits(rate))
	b.lastBurst.Store(int64(burst))
	b.replicas.Store(1)
	b.lease.init(b)
	b.gen.Store(newGeneration())
	b.pushes.init()
	if n, ok := store.(backend.Notifier); ok {
		ctx, cancel := context.WithCancel(context.Background())
		b.wg.Add(2)
		go func() {
			defer b.wg.Done()
			n.Watch(ctx, b.changed, b.pushed)
		}()
		go func() {
			defer b.wg.Done()
			<-b.done
			cancel()
		}()
	}
	if n, ok := store.(backend.SlotNotifier); ok && b.hasSlots() {
		ctx, cancel := context.WithCancel(context.Background())
		b.wg.Add(2)
		go func() {
			defer b.wg.Done()
			n.WatchSlots(ctx, b.slotQueues.wake, b.slotQueues.wakeAll)
		}()
		go func() {
			defer b.wg.Done()
			<-b.done
			cancel()
		}()
	}
	if rt, ok := store.(backend.ReplicaTracker); ok {
		b.wg.Add(1)
		go b.heartbeat(rt)
	} else {
		b.countKnown.Store(true)
	}
	return b, nil
}

// NewLocal returns a Bucket on a new in-process bucket (NewLocalStore) that
// refills at rate tokens per second up to burst, with layers if any, for a
// single replica or tests. Its leasing is off, since every take is already
// in this process; its other options are the defaults (see Options). For
// other options, pass NewLocalStore's store to New.
func NewLocal(rate float64, burst int, layers ...Layer) (*Bucket, error) {
	s, err := NewLocalStore(rate, burst, layers...)
	if err != nil {
		return nil, err
	}
	return New(s, Options{Lease: LeaseOptions{Disabled: true}})
}

// NewLocalStore returns a full bucket kept in this process that refills at
// rate tokens per second up to burst (0: one second of tokens, at least 1),
// deciding layers, if any, with it in one step as the Redis store does
// (see Layer and Layers.Validate). It computes exactly what the Redis
// store's scripts compute, in the same units. A bad rate, burst or layer
// gives a *ParamError. The store is safe for concurrent use; give it to
// one Bucket.
func NewLocalStore(rate float64, burst int, layers ...Layer) (Store, error) {
	m, err := backend.NewMemory(rate, burst)
	if err != nil {
		return nil, err
	}
	if len(layers) == 0 {
		return m, nil
	}
	lm, err := backend.NewLayeredMemory(m, layers)
	if err != nil {
		return nil, err
	}
	return lm, nil
}

// Mode returns how the Bucket is limiting now.
func (b *Bucket) Mode() Mode { return *b.mode.Load() }

// ReplicaID returns the name this replica uses in heartbeats.
func (b *Bucket) ReplicaID() string { return b.opts.ReplicaID }

// Stats are a Bucket's counters and what it knows of its fleet, for
// metrics and operators' tools. Each field is read atomically; together
// they are not one instant's snapshot.
type Stats struct {
	// Granted is the number of tokens that Wait, WaitN and Allow granted
	// since New: a counter, so that a reader derives the rate from two
	// reads.
	Granted int64
	// Waiting is the number of Wait and WaitN calls that wait for the
	// store now, of every class; WaitingByPriority is the same by class,
	// indexed by Priority.
	Waiting           int
	WaitingByPriority [NumPriorities]int
	// Exceeded counts, by layer name, the WaitN calls each layer refused
	// (Observer.LimitExceeded) since New, and for a shadow layer
	// (Layer.Shadow) the granted ones it would have refused or made wait
	// (ShadowDecision.Exceeded), leaving out the layers that counted
	// none; nil when none did.
	Exceeded map[string]int64
	// PaidRefused is the number of paid slots (Request.Paid) that WaitN
	// refused since New for a missing or wrong signature: forged by a
	// producer, or signed with a secret the store no longer keeps.
	PaidRefused int64
	// PaidForfeit is the number of paid slots (Request.Paid) that WaitN
	// could not honour since New: the message came back later than the
	// slot's lateness (backend PaidLateness) or moved past it with its
	// key's next slot booked too close, the store no longer held the
	// booking (Redis restarted empty, the local fallback), or the local
	// fallback booked it and the store decides now. Its layer then decided
	// as usual, most often booking the message again.
	PaidForfeit int64
	// Retimed is the number of reservations of the shared bucket given
	// back and asked for again since New, because their caller woke too
	// late past their slot to go out without joining the slots after
	// theirs (an answer that came back late, or a delayed wake-up).
	Retimed int64
	// Replicas is the number of live replicas seen in the last heartbeat,
	// or 1 when the store does not track replicas.
	Replicas int
	// Idle is what SetIdle last set.
	Idle bool
}

// Stats returns the Bucket's counters (see Stats). Replicas send them with
// their heartbeats, for 'throttle bucket status' and 'bucket watch'. Safe
// for concurrent use.
func (b *Bucket) Stats() Stats {
	s := Stats{
		Granted:     b.granted.Load(),
		Waiting:     int(b.waiting.Load()),
		Exceeded:    b.exceeded(),
		PaidRefused: b.layered.paid.refused.Load(),
		PaidForfeit: b.layered.paid.forfeit.Load(),
		Retimed:     b.retimed.Load(),
		Replicas:    b.replicaCount(),
		Idle:        b.fb.idle.Load(),
	}
	for p := range s.WaitingByPriority {
		s.WaitingByPriority[p] = int(b.waitingBy[p].Load())
	}
	return s
}

// addWaiting adds n to the calls of class p that wait for the store.
func (b *Bucket) addWaiting(p Priority, n int64) {
	b.waiting.Add(n)
	b.waitingBy[p].Add(n)
}

// replicaCount returns the number of live replicas seen in the last
// heartbeat, or 1 when the store does not track replicas.
func (b *Bucket) replicaCount() int { return int(b.replicas.Load()) }

// Check asks the store once whether it works for this replica: it reads the
// bucket and, for a store that tracks replicas, sends a heartbeat, which
// also teaches the Bucket the replica count. It returns nil when both
// worked; an error matching ErrMisconfigured when the store refused this
// client (a program should stop: waiting will not help; the Bucket is
// closed meanwhile); or another error matching ErrStore for an outage, in
// which case the Bucket applies its store-failure policy at its first
// call, as it would without Check.
func (b *Bucket) Check(ctx context.Context) error {
	st, err := b.store.Status(ctx)
	if err == nil {
		b.observeState(st)
		if rt, ok := b.store.(backend.ReplicaTracker); ok {
			var n int
			if n, err = b.beat(ctx, rt); err == nil && n > 0 {
				b.setReplicas(n)
			}
		}
	}
	if errors.Is(err, ErrMisconfigured) {
		b.storeFailed(err)
	}
	return err
}

// Wait blocks until cost tokens are granted, ctx ends, or the Bucket is
// closed. The store either grants the tokens now, reserves them and says
// when they are due, or says when to ask again; Wait sleeps exactly that
// long. If ctx ends while a reservation is pending, the reserved tokens go
// back to the bucket. A cost above the burst fails at once with
// ErrCostExceedsBurst. After Close it returns ErrClosed and takes nothing.
// If ctx ends while the store-failure policy keeps the Bucket closed
// (ModeClosed), the error matches both ctx's and the store error that
// closed it (ErrStore or ErrMisconfigured).
//
// On a store with layers Wait is WaitN(ctx, Request{Cost: cost}), so no
// layer is skipped: a keyed layer makes it fail with ErrMissingKey, since
// only WaitN can name the message's keys.
//
// The request is of the Bucket's class, Options.Priority.
func (b *Bucket) Wait(ctx context.Context, cost int) error {
	if b.layeredStore() != nil {
		return b.WaitN(ctx, Request{Cost: cost, Priority: b.opts.Priority})
	}
	return b.waitAs(ctx, b.opts.Priority, cost)
}

// Priority returns the class of Wait and Allow, Options.Priority.
func (b *Bucket) Priority() Priority { return b.opts.Priority }

// closed reports whether Close was called.
func (b *Bucket) closed() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// waitAs is Wait for a request of class p on the shared bucket alone.
func (b *Bucket) waitAs(ctx context.Context, p Priority, cost int) error {
	if b.closed() {
		return ErrClosed
	}
	err := b.wait(ctx, p, cost)
	if err == nil {
		b.granted.Add(int64(cost))
	}
	return err
}

func (b *Bucket) wait(ctx context.Context, p Priority, cost int) error {
	if cost < 1 {
		return fmt.Errorf("cost %d: %w", cost, ErrInvalidCost)
	}
	if b.lease.take(p, cost) {
		b.observeWaited(p, 0)
		return nil
	}
	start := b.clock.Now()
	served, lead, err := b.lease.acquire(ctx, b.done, p, cost)
	if err != nil {
		return err
	}
	if served {
		b.observeWaited(p, b.clock.Now().Sub(start))
		return nil
	}
	// lead, while set, is this caller's place at the head of the lease's
	// queue: it asks for a whole batch, hands it to the queue with fill,
	// or hands the lead on with abandon.
	endRefill := func() {
		if lead != nil {
			b.lease.abandon(lead)
			lead = nil
		}
	}
	defer endRefill()
	b.addWaiting(p, 1)
	defer b.addWaiting(p, -1)
	// head is set while this caller is the one of its class that asks
	// while a floor holds the class back (floor.go).
	head := false
	passFloor := func() {
		if head {
			head = false
			b.floor.pass(p)
		}
	}
	defer passFloor()
	// retimed is set once this caller gave back a reservation it woke too
	// late for (lateFits); refitted once it asked again at once after a
	// horizon that the store's answer showed too short (refits).
	retimed, refitted := false, false
	for {
		select {
		case <-b.done:
			return ErrClosed
		default:
		}
		if b.Mode() != ModeShared {
			endRefill()
			passFloor()
			err := b.waitFallback(ctx, p, cost)
			if errors.Is(err, errRetryShared) {
				continue
			}
			if err == nil {
				b.observeWaited(p, b.clock.Now().Sub(start))
			}
			return err
		}
		// The caller leading a refill asks for a whole lease: taken now if
		// the bucket has it, else reserved like any other request, so that
		// a saturated bucket still costs one store call per lease.
		// Its batch is charged as of its grant plus the hold, within which
		// its tokens may go out (LeaseOptions).
		extra, hold := 0, time.Duration(0)
		if lead != nil {
			if extra = b.lease.extra(cost); extra > 0 {
				hold = b.lease.hold()
			}
		}
		if !head { // behind the class's head, if a floor holds it back
			if head, err = b.floor.enter(ctx, b.done, p); err != nil {
				return err
			}
		}
		gen, seen := b.gen.Load(), b.pushes.heard()
		sent := b.clock.Now()
		horizon := b.horizon()
		res, err := b.store.Take(ctx, backend.TakeRequest{Cost: cost + extra, Hold: hold, MaxWait: horizon, Priority: p, MinShare: b.opts.MinShare})
		if err == nil {
			b.skew.observeTrip(sent, b.clock.Now(), res.At)
			if lead != nil {
				b.lease.tripped(b.clock.Now().Sub(sent), !res.Granted || res.Wait > 0, res.Remaining)
			}
		}
		if err != nil {
			endRefill()
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if errors.Is(err, ErrCostExceedsBurst) {
				if extra > 0 && res.Burst > 0 { // the burst shrank: size the lease to it
					b.lastBurst.Store(int64(res.Burst))
					continue
				}
				return err
			}
			b.storeFailed(err)
			continue
		}
		b.observeTake(res)
		if !res.Granted {
			if res.Floor && !head {
				if !b.floor.hold(p) {
					continue // another caller of the class asks: queue behind it
				}
				head = true
			} else if !res.Floor {
				passFloor() // the floor lets the class through: the others ask too
			}
			if !res.Floor && !refitted && b.refits(horizon, res.Wait) {
				refitted = true
				continue
			}
			if err := b.sleep(ctx, gen.changed, res.Wait); err != nil && !errors.Is(err, errChanged) {
				return err
			}
			continue
		}
		passFloor()
		var late time.Duration
		spare := 0.0 // what the grant left in the bucket
		if res.Wait > 0 {
			l, err := b.sleepUntilDue(ctx, gen, &b.pushes, seen, res, math.Float64frombits(b.lastRate.Load()), 0, nil)
			if err != nil {
				b.refundClass(ctx, res.Tokens, res.Class)
				return err
			}
			// Late against the store's clock, at worst: the skew's
			// estimate may place the slot later than it was.
			late = l + b.skew.spread()
		} else {
			// A grant for now whose answer came back late goes out late
			// too, beside the tokens the bucket refilled meanwhile; a
			// lease's tokens as late as its deadline, which the hold
			// keeps at least that far past its grant.
			late, spare = b.answerLate(res.At), res.Remaining
		}
		rate, burst := math.Float64frombits(b.lastRate.Load()), int(b.lastBurst.Load())
		fits, refund := lateFits(late, res.Tokens, spare, rate, burst)
		if !fits && lead != nil {
			// A late batch keeps what the bucket could still have held
			// for a hold more, if that serves its caller, and gives back
			// the rest: asking again would cost a call and a wait.
			if keep := min(res.Tokens, int(float64(refund)-rate*hold.Seconds())); keep >= cost {
				if keep < res.Tokens {
					b.refund(ctx, res.Tokens-keep)
				}
				res.Tokens, fits = keep, true
			}
		}
		if !fits && !retimed {
			// Too late to go out with the slots after its own: give
			// back what the bucket could have held, and ask again,
			// once, so that a machine too slow to wake anyone in time
			// still serves its callers.
			if refund > 0 {
				b.refund(ctx, refund)
			}
			b.retimed.Add(1)
			retimed = true
			continue
		}
		if lead != nil {
			window := spendWindow(late, res.Tokens, spare, rate, burst)
			if !fits {
				// Late again after asking again: it goes out as a late
				// reservation does, and its batch lasts the hold, as if
				// granted now, so that a store too slow to answer within
				// any deadline still leases.
				window = max(window, hold)
			}
			b.lease.fill(lead, res.Tokens, b.clock.Now().Add(window))
			lead = nil
		} else {
			b.lease.put(res.Tokens - cost)
		}
		b.observeWaited(p, b.clock.Now().Sub(start))
		return nil
	}
}

// refits reports whether a request turned away at horizon, to come back
// after wait, would fit the horizon the answer's queue depth now gives
// (observeTake): the replica underestimated the queue (its callers between
// two calls, a debt last seen when the queue was short). Such a caller asks
// again at once, once, and books its place now: waiting outside, it would
// come back behind every request made meanwhile, and a caller of its own
// replica that asked after it would go first.
func (b *Bucket) refits(horizon, wait time.Duration) bool {
	return wait > 0 && b.horizon() >= horizon+wait
}

// horizon returns the reservation horizon: MaxReserve, stretched so that
// every caller waiting on every replica fits in the queue (with a quarter to
// spare), but never beyond 10·MaxReserve. A caller turned away sees the
// queue's depth in the answer and, when the horizon then fits it, asks
// again at once (refits).
func (b *Bucket) horizon() time.Duration {
	rate := math.Float64frombits(b.lastRate.Load())
	if rate <= 0 {
		return b.opts.MaxReserve
	}
	// The queue is at least what the store last showed reserved ahead, and
	// about what this process has waiting times the replicas.
	queued := max(float64(b.waiting.Load()*max(1, b.replicas.Load())), math.Float64frombits(b.lastDebt.Load()))
	fit := time.Duration(min(1.25*queued/rate, 1e6) * float64(time.Second))
	return min(max(b.opts.MaxReserve, fit), 10*b.opts.MaxReserve)
}

// Allow takes cost tokens if they are available now and reports whether it
// did. In ModeClosed it reports false and in ModeOpen true without asking
// the store. The request is of the Bucket's class, Options.Priority: it
// gets tokens only if no reservation of its class or a higher one is
// waiting for them. After Close it returns ErrClosed and takes nothing.
// On a store with layers it takes from every layer too, all or none, and
// fails with ErrMissingKey when a layer is keyed (see WaitN).
func (b *Bucket) Allow(ctx context.Context, cost int) (bool, error) {
	ok, err := b.allow(ctx, cost)
	if ok && err == nil {
		b.granted.Add(int64(cost))
	}
	return ok, err
}

func (b *Bucket) allow(ctx context.Context, cost int) (bool, error) {
	if cost < 1 {
		return false, fmt.Errorf("cost %d: %w", cost, ErrInvalidCost)
	}
	if b.closed() {
		return false, ErrClosed
	}
	if ls := b.layeredStore(); ls != nil {
		return b.allowLayers(ctx, ls, cost)
	}
	p := b.opts.Priority
	if b.lease.take(p, cost) {
		return true, nil
	}
	for {
		switch b.Mode() {
		case ModeOpen:
			return true, nil
		case ModeClosed:
			return false, nil
		case ModeLocal:
			if fb := b.fallbackBucket(); fb != nil {
				_, burst := fb.Limits()
				res, err := fb.Take(ctx, backend.TakeRequest{Cost: min(cost, burst), Priority: p, MinShare: b.opts.MinShare})
				return res.Granted, err
			}
			continue
		}
		sent := b.clock.Now()
		res, err := b.store.Take(ctx, backend.TakeRequest{Cost: cost, Priority: p, MinShare: b.opts.MinShare})
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return false, cerr
			}
			if errors.Is(err, ErrCostExceedsBurst) {
				return false, err
			}
			b.storeFailed(err)
			continue
		}
		b.skew.observeTrip(sent, b.clock.Now(), res.At)
		b.observeTake(res)
		return res.Granted, nil
	}
}

// State reads the bucket. In fallback it describes the local bucket, with
// Mode saying so.
func (b *Bucket) State(ctx context.Context) (State, error) {
	mode := b.Mode()
	if mode == ModeShared {
		st, err := b.store.Status(ctx)
		if err != nil {
			return State{}, err
		}
		st.Mode = mode
		b.observeState(st)
		return st, nil
	}
	rate, burst := b.store.Limits()
	st := State{Mode: mode, ConfiguredRate: rate, ConfiguredBurst: burst, Replicas: b.replicaCount()}
	if fb := b.fallbackBucket(); fb != nil {
		local, _ := fb.Status(ctx)
		st.Tokens, st.Rate, st.Burst, st.PausedFor, st.At = local.Tokens, local.Rate, local.Burst, local.PausedFor, local.At
		st.Reserved, st.Pushed = local.Reserved, local.Pushed
	}
	return st, nil
}

// MaxPause returns the longest pause Pause applies: Options.MaxPause, or
// its default. A sink that reports a provider's delay may cap it here, so
// that the message that got the delay is retried when the pause ends.
func (b *Bucket) MaxPause() time.Duration { return b.opts.MaxPause }

// Pause stops the shared bucket from granting for d, capped at
// Options.MaxPause, for every replica. It is what the PushBack middleware
// calls when a provider answers 429. Tokens leased by this replica are
// dropped. If the store fails, the local fallback bucket is paused instead.
func (b *Bucket) Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	d = min(d, b.opts.MaxPause)
	b.lease.drop()
	if b.Mode() == ModeShared {
		var err error
		if ap, ok := b.store.(backend.AttributedPauser); ok {
			err = ap.PauseBy(ctx, d, b.opts.ReplicaID)
		} else {
			err = b.store.Pause(ctx, d)
		}
		if err == nil {
			b.observePaused(d, b.opts.ReplicaID)
			b.pushedBack(ctx, true) // adaptive.go
		}
		if err == nil || ctx.Err() != nil {
			return err
		}
		b.storeFailed(err)
	}
	if fb := b.fallbackBucket(); fb != nil {
		fb.PauseAt(b.clock.Now(), d)
		b.pushedBack(ctx, false)
	}
	return nil
}

// Close stops the background goroutines, waits (up to a second) for the
// concurrency slots released before it to be sent to the store, gives back
// leased tokens and removes this replica from the heartbeat set. Wait calls
// in progress return ErrClosed. Close is safe to call more than once.
func (b *Bucket) Close() error {
	var err error
	b.closeOnce.Do(func() {
		close(b.done)
		b.fb.mu.Lock()
		if b.fb.unwatch != nil { // the local bucket's watch
			b.fb.unwatch()
		}
		b.fb.mu.Unlock()
		b.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if rw, ok := b.layeredStore().(backend.ReleaseWaiter); ok {
			// Releases the store sends on goroutines of its own.
			err = rw.WaitReleases(ctx)
		}
		if n := b.lease.drain(); n > 0 && b.Mode() == ModeShared {
			err = errors.Join(err, b.refundPast(ctx, n))
		}
		if rt, ok := b.store.(backend.ReplicaTracker); ok && b.Mode() == ModeShared {
			err = errors.Join(err, rt.Leave(ctx, b.opts.ReplicaID))
		}
	})
	return err
}

// refund gives back tokens whose instant has passed, such as unused
// leased tokens or those of a reservation woken too late: with RefundPast
// where the store has it (backend.PastRefunder), else with Refund. It
// logs a failure.
func (b *Bucket) refund(ctx context.Context, tokens int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ProbeInterval)
	defer cancel()
	if err := b.refundPast(ctx, tokens); err != nil {
		b.log.Debug("refunding unused tokens failed", "tokens", tokens, "error", err)
	}
}

// refundPast is refund's call of the store.
func (b *Bucket) refundPast(ctx context.Context, tokens int) error {
	if pr, ok := b.store.(backend.PastRefunder); ok {
		return pr.RefundPast(ctx, tokens)
	}
	return b.store.Refund(ctx, tokens)
}

// refundClass gives back the tokens of a cancelled reservation that the
// store holds in class's queue (TakeResult.Class), so that a store with
// classes forgets them there.
func (b *Bucket) refundClass(ctx context.Context, tokens int, class Priority) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ProbeInterval)
	defer cancel()
	cr, ok := b.store.(backend.ClassRefunder)
	if !ok { // a store without classes: its reservation goes back as any
		if err := b.store.Refund(ctx, tokens); err != nil {
			b.log.Debug("refunding a cancelled reservation failed", "tokens", tokens, "error", err)
		}
		return
	}
	if err := cr.RefundClass(ctx, tokens, class); err != nil {
		b.log.Debug("refunding a cancelled reservation failed", "tokens", tokens, "class", class, "error", err)
	}
}

// observeTake records what a shared bucket's answer says of it. The caller
// records the answer's round trip in b.skew (observeTrip).
func (b *Bucket) observeTake(res backend.TakeResult) {
	debt := max(0, -res.Remaining)
	b.lastDebt.Store(math.Float64bits(debt))
	if res.Rate > 0 { // a paused bucket reports 0: keep the rate to fall back to
		b.lastRate.Store(math.Float64bits(res.Rate))
		b.fb.rateSeen.Store(true) // fallback.go: warmLocal
	}
	b.lastBurst.Store(int64(res.Burst))
	// The bucket is booked at least until this answer's tail: a granted
	// reservation is due at the tail; otherwise the debt takes
	// debt/rate to refill.
	tail := time.Duration(0)
	if res.Granted {
		tail = res.Wait
	}
	if res.Rate > 0 {
		tail = max(tail, time.Duration(min(debt/res.Rate, 1e6)*float64(time.Second)))
	}
	b.booked(b.clock.Now().Add(tail))
	if o := b.opts.Observer; o != nil && o.Took != nil {
		o.Took(res.Remaining, res.Rate, res.Burst)
	}
}

// booked records that the shared bucket is booked until at least t.
func (b *Bucket) booked(t time.Time) {
	n := t.UnixNano()
	for {
		cur := b.bookedUntil.Load()
		if n <= cur || b.bookedUntil.CompareAndSwap(cur, n) {
			return
		}
	}
}

func (b *Bucket) observeState(st State) {
	b.skew.observe(b.clock.Now(), st.At)
	if st.Replicas > 0 {
		b.setReplicas(st.Replicas)
	}
	if o := b.opts.Observer; o != nil && o.Took != nil {
		o.Took(st.Tokens, st.Rate, st.Burst)
	}
}

func (b *Bucket) observePaused(d time.Duration, by string) {
	if o := b.opts.Observer; o != nil && o.Paused != nil {
		o.Paused(d, by)
	}
}

// observeWaited reports a successful wait of class p that blocked for d.
func (b *Bucket) observeWaited(p Priority, d time.Duration) {
	o := b.opts.Observer
	if o == nil {
		return
	}
	if o.Waited != nil {
		o.Waited(d)
	}
	if o.PriorityWaited != nil {
		o.PriorityWaited(p, d)
	}
}

var (
	errChanged = errors.New("bucket changed")
	errPushed  = errors.New("reservations pushed back")
)

// sleep waits for d on the Bucket's clock, or until ctx or the Bucket ends,
// or until changed is closed (errChanged). A nil changed never fires.
func (b *Bucket) sleep(ctx context.Context, changed <-chan struct{}, d time.Duration) error {
	return b.sleepOn(ctx, changed, nil, d)
}

// sleepOn is sleep that also ends when pushed is closed (errPushed). A nil
// pushed never fires.
func (b *Bucket) sleepOn(ctx context.Context, changed, pushed <-chan struct{}, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := b.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		return ErrClosed
	case <-changed:
		return errChanged
	case <-pushed:
		return errPushed
	case <-t.C():
		return nil
	}
}
