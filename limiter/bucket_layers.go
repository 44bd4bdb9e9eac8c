package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/topk"
)

// Request is what WaitN waits for: a message's cost, charged on the shared
// bucket and on every layer of a layered store, and the message's key for
// each keyed layer.
type Request struct {
	// Cost is the number of tokens, at least 1.
	Cost int
	// Keys maps each keyed layer's name to the message's key in it, such as
	// the recipient of an SMS. A keyed layer without a key fails the request
	// with ErrMissingKey. Ignored by a store without layers.
	Keys map[string]string
	// Priority is the request's class, used as it is: the zero value is
	// PriorityNormal, whatever the Bucket's Options.Priority (the class of
	// Wait and Allow).
	Priority Priority
	// Price is what the message costs on every budget layer
	// (Layer.Budget), in micro-units of the budget's currency (see
	// Prices). A price above a budget fails the request with a
	// *LimitError matching ErrCostExceedsBurst. Ignored by a store
	// without budget layers.
	Price Amount
	// Paid names the slots this message already paid for: those a delay
	// layer booked when it refused the message (LimitError.Reserved and
	// LimitError.Slot). A layer with such a slot, for this request's key
	// in it, lets the request pass without waiting or taking from it
	// again; the shared bucket and the other layers decide as usual. A
	// slot back more than a little late (10% of the time the layer takes
	// to refill one token, between 25 ms and 1 s) is forfeit and the layer
	// decides as usual, since the message could otherwise go out right
	// next to the one booked after it. Only the slots that carry this
	// Bucket's signature (PaidSlot.Sig) reach the store; the others are
	// dropped (Stats.PaidRefused). Ignored by a store without layers.
	Paid []PaidSlot
	// Tenant names the message's tenant on a store with fair shares (see
	// Fair): "" leaves the request out of them. Ignored by a store without
	// them.
	Tenant string
	// FairWaiting bounds the requests of Tenant that wait for its fair
	// share at once in this Bucket (those not yet granted; a granted
	// request waiting for its reservation holds its share and is not
	// counted): a further request that the tenant's share makes wait
	// returns at once a *LimitError of Layer FairLayer, with ActionDelay
	// and the wait, so that a consumer sets the message aside rather than
	// hold a handler (see consumer.LimitOptions.TenantWaiting). The
	// tenant's requests waiting for its share ask the store in turn, the
	// first at the room the store announced, the others after it; while
	// FairWaiting of them wait, a further request is refused without a
	// store call. 0: no bound, every request waits (and asks at its own
	// room).
	FairWaiting int
}

// WaitN blocks until req.Cost tokens are granted on the shared bucket and on
// every layer of the store (see Layer), ctx ends, or the Bucket is
// closed. All layers are decided together, for the instant the message
// goes out: they all grant, or none is charged. When the shared bucket
// must wait, its reservation is the message's slot, and every layer is
// charged for that instant; when a layer has no room by then, nothing is
// charged and WaitN asks again the moment that layer has room. So the
// sends keep the shared bucket's rate and burst and every layer's spacing
// as the sink sees them, not only as the store decided them. A pending
// reservation moves with the shared bucket's queue (a push of a higher
// class, a rate change, a pause), never before every layer had room; moved
// back, it charges its layers for the move (a slot it paid for on a delay
// layer moves with it once the move takes it past the slot's lateness),
// and is decided again if a layer cannot keep it apart from its key's next
// message. The move is paid before the message goes out, including the
// time the payment itself takes. If ctx ends
// while it is pending, the shared bucket gets its tokens back; the layers
// keep theirs, since a token refunded on a key charged again after this
// one would go out next to that later message.
//
// A layer whose OnExceed is dead_letter or delay and that cannot grant
// within its MaxWait makes WaitN return a *LimitError (matching
// ErrLimitExceeded) at once, without charging any layer, except that a
// delay token bucket books the message's slot on itself (see
// LimitError.Reserved and Request.Paid). A cost above a
// layer's burst or quota returns a *LimitError that also matches
// ErrCostExceedsBurst.
//
// On a store without layers WaitN is Wait(ctx, req.Cost); on a layered
// store, Wait and Allow decide the shared bucket alone. With layers,
// every call asks the store, in one round trip, since the keyed layers must
// be decided there. Leasing (Options.Lease) keeps working for the shared
// bucket: one call at a time asks for a batch of extra shared tokens with
// its message, and while this replica holds leased tokens the store call
// decides the layers alone, which is cheaper for the store.
//
// While the store fails, under ModeLocal, the layers are decided in this
// process at this replica's share, like the shared bucket: each keyed
// layer's rate and burst and each quota divided by the live replicas, with
// fresh state (full buckets, unused quotas) from the moment the fallback
// starts. What this can over-grant, summed over the replicas: a keyed
// bucket's burst once per key, and a quota's whole allowance once in the
// window the outage starts in, since the tokens used in Redis before it are
// not known locally. A key whose messages all go to one replica gets only
// that replica's share of its rate (under-granting). When the store is
// back, the Bucket charges its layers with what it sent locally on each
// key (backend.LayerCharger) before it decides there again, so that a
// key's spacing holds across the return and a quota or budget counts what
// was used locally in its current window.
//
// On a store with a concurrency layer WaitN fails with ErrNeedsAcquire:
// use Acquire, whose Held gives the slots back.
func (b *Bucket) WaitN(ctx context.Context, req Request) error {
	if b.hasSlots() {
		return ErrNeedsAcquire
	}
	return b.waitN(ctx, req, nil, "", nil)
}

// Grant says how a granted WaitGrant waited.
type Grant struct {
	// Waited is how long the call blocked, by the Bucket's clock.
	Waited time.Duration
	// Layer names the layer (Layer.Name) whose wait was the longest of
	// the call's, or "" when the shared bucket's was, when nothing
	// waited, and under the store-failure fallback.
	Layer string
}

// WaitGrant is WaitN that also says, for a granted request, how long it
// waited and which layer set the wait, for a trace or a log of that one
// message (Observer.LayerWaited reports the same for metrics). Its errors
// are WaitN's, with a zero Grant.
func (b *Bucket) WaitGrant(ctx context.Context, req Request) (Grant, error) {
	if b.hasSlots() {
		return Grant{}, ErrNeedsAcquire
	}
	var g Grant
	start := b.clock.Now()
	err := b.waitN(ctx, req, &g, "", nil)
	if err != nil {
		return Grant{}, err
	}
	g.Waited = b.clock.Now().Sub(start)
	return g, nil
}

// waitN is WaitN, naming the layer that set the wait in g when g is not
// nil. With a holder, the request holds the slots of the concurrency
// layers under that name once granted, and granted is set to the store
// that granted them (the shared one or the local fallback's); a wait that
// fails after its grant gives them back.
func (b *Bucket) waitN(ctx context.Context, req Request, g *Grant, holder string, granted *backend.SlotStore) error {
	if b.closed() {
		return ErrClosed
	}
	if req.Priority >= NumPriorities {
		return &ParamError{Param: "Priority", Msg: "must be high, normal or low", Value: req.Priority.String()}
	}
	ls := b.layeredStore()
	if ls == nil {
		return b.waitAs(ctx, req.Priority, req.Cost)
	}
	if req.Cost < 1 {
		return fmt.Errorf("cost %d: %w", req.Cost, ErrInvalidCost)
	}
	paid, local := b.verifyPaid(ctx, req.Paid) // paidsig.go
	req.Paid = paid
	if len(local) > 0 { // for the local fallback, which booked them
		req.Paid = append(slices.Clip(paid), local...)
	}
	if err := b.waitPaid(ctx, req.Paid); err != nil {
		return err
	}
	var (
		sw     *slotWaiter
		sks    []slotKey
		layers = b.layered.layers
	)
	if holder != "" {
		// In line behind the requests of its key that came before
		// (slots.go), from before its first ask, so that no release
		// goes unheard.
		sw, sks = &slotWaiter{wake: make(chan struct{}, 1)}, slotKeys(layers, req.Keys)
		head := b.slotQueues.join(sw, sks)
		defer b.slotQueues.leave(sw, sks)
		if !head {
			if err := b.awaitTurn(ctx, sw); err != nil {
				return err
			}
		}
	}
	// release gives back the slots of a request granted by store whose
	// wait then failed.
	release := func(store backend.SlotStore, lr backend.LayerRequest) {
		if holder == "" || store == nil {
			return
		}
		keys, err := backend.LayerKeys(layers, lr)
		if err != nil {
			return
		}
		h := &Held{b: b, store: store, slots: backend.Slots(layers, keys, holder)}
		h.Release()
	}
	slotLayer := func(name string) bool {
		for _, l := range layers {
			if l.Name == name {
				return l.IsConcurrency()
			}
		}
		return false
	}
	start := b.clock.Now()
	b.addWaiting(req.Priority, 1)
	defer b.addWaiting(req.Priority, -1)
	// admitted: no longer refused for its tenant's FairWaiting (counted
	// among them once, or granted); me: its place among them while it
	// waits for the share, nil once granted (fairCount).
	admitted := false
	var me *fairWaiter
	fairCount := func(in bool) {
		switch {
		case in && me == nil:
			me = b.layered.fairWaitAdd(req.Tenant)
		case !in && me != nil:
			b.layered.fairLeave(req.Tenant, me)
			me = nil
		}
	}
	defer fairCount(false)
	if req.Tenant != "" && b.layered.fair != nil {
		b.layered.tenantEnter(req.Tenant)
		defer b.layered.tenantLeave(req.Tenant)
	}
	limiting := "" // the layer that set the longest of this call's waits
	var longest time.Duration
	// head is set while this caller is the one of its class that asks
	// while a floor holds the class back (floor.go).
	head := false
	passFloor := func() {
		if head {
			head = false
			b.floor.pass(req.Priority)
		}
	}
	defer passFloor()
	// refitted is set once this caller asked again at once after a
	// horizon that the store's answer showed too short (refits).
	refitted := false
	for {
		select {
		case <-b.done:
			return ErrClosed
		default:
		}
		if b.Mode() != ModeShared {
			passFloor()
			err := b.waitLayersFallback(ctx, ls, req, holder, granted)
			if errors.Is(err, errRetryShared) {
				continue
			}
			b.observeLayered(start, req, limiting, err)
			return err
		}
		if len(local) > 0 {
			// The store never held the slots the local fallback
			// booked: their layers decide again.
			b.paidForfeit(local, "")
			req.Paid, local = paid, nil
		}
		lr := backend.LayerRequest{Cost: req.Cost, Price: req.Price, Keys: req.Keys, MaxWait: b.horizon(), Priority: req.Priority, MinShare: b.opts.MinShare, Paid: req.Paid, Tenant: req.Tenant, Holder: holder}
		fair := req.Tenant != "" && b.layered.fair != nil // fair shares are decided in the store: no lease
		// lead, when set, is this caller's place at the head of the
		// lease's queue: its message asks for a batch of shared tokens
		// too, handed down the queue (fill) or the lead passed on
		// (abandon) once the store answers. The callers behind it wait
		// for that batch, first come first served, instead of asking for
		// the shared bucket themselves: on a Cluster that would cost them
		// a second step, on the shared bucket's master.
		var lead *leaseWaiter
		leased := false
		if !b.opts.Shadow && !fair {
			if leased = b.lease.take(req.Priority, req.Cost); !leased {
				served, w, err := b.lease.acquire(ctx, b.done, req.Priority, req.Cost)
				if err != nil {
					return err
				}
				leased, lead = served, w
			}
		}
		if b.opts.Shadow {
			// Decided as a shadow: nothing to lease, no class to queue in.
			lr.SkipShared, lr.ShadowShared = true, true
		} else if leased {
			lr.SkipShared = true
			if b.layered.windowsOnly {
				now := b.clock.Now()
				if skew, ok := b.skew.recent(now); ok && windowsOpen(b.layered.layers, req.Keys, req.Priority, now, now.Add(-skew)) {
					// Paid by the lease, and well inside every
					// window on the store's clock: nothing to ask it.
					b.observeLayered(start, req, limiting, nil)
					return nil
				}
			}
		} else {
			if !head { // behind the class's head, if a floor holds it back
				var err error
				if head, err = b.floor.enter(ctx, b.done, req.Priority); err != nil {
					if lead != nil {
						b.lease.abandon(lead)
					}
					return err
				}
			}
			if lead != nil {
				lr.Extra = b.lease.extra(req.Cost)
			}
		}
		if fair && req.FairWaiting > 0 && !admitted {
			// FairWaiting of its tenant's requests wait for the
			// share ahead of it: refused without asking. Fewer: it
			// queues behind them without asking either, since the
			// first of them asks at the tenant's next room.
			le, w := b.layered.fairHeldBack(req.Tenant, req.FairWaiting, b.clock.Now(), b.replicaCount())
			if le != nil {
				b.observeLayered(start, req, FairLayer, le)
				return le
			}
			if w != nil {
				me, admitted = w, true
				limiting = FairLayer
				passFloor()
				if err := b.fairTurn(ctx, b.gen.Load().changed, req.Tenant, me); err != nil && !errors.Is(err, errChanged) {
					return err
				}
				continue
			}
		}
		gen, seen := b.gen.Load(), b.pushes.heard()
		sent := b.clock.Now()
		res, err := ls.TakeLayers(ctx, lr)
		if err == nil {
			// Every answer places the store's clock, a leased one's too
			// (it ran the layers at the store's instant): answerLate and
			// the reservation's wake-up judge lateness by it.
			now := b.clock.Now()
			b.skew.observeTrip(sent, now, res.At)
			b.trips.observe(now.Sub(sent))
		}
		if lr.SkipShared && !lr.ShadowShared && (err != nil || !res.Granted) {
			b.lease.put(req.Cost) // not used: back to the lease
		}
		switch {
		case lead != nil && err == nil && res.Granted:
			b.lease.fill(lead, res.Tokens, time.Time{}) // charged at the grant: no deadline (LeaseOptions)
		case lead != nil:
			b.lease.abandon(lead)
		case err == nil && res.Granted && res.Tokens > req.Cost:
			b.lease.put(res.Tokens - req.Cost)
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if errors.Is(err, ErrCostExceedsBurst) || errors.Is(err, ErrMissingKey) || errors.Is(err, ErrInvalidCost) || errors.Is(err, ErrLimitExceeded) {
				// A request that can never pass (a window's key that is
				// not a telephone number included), not a store failure.
				b.observeLayered(start, req, limiting, err)
				return err
			}
			b.storeFailed(err)
			continue
		}
		if !lr.SkipShared {
			b.observeTake(res.TakeResult)
		}
		if res.Exceeded != nil {
			b.paidForfeit(req.Paid, res.Exceeded.Layer)
			b.signPaid(ctx, res.Exceeded, false) // paidsig.go
			b.observeLayered(start, req, limiting, res.Exceeded)
			return res.Exceeded
		}
		if fair {
			b.layered.fairActive.Store(int64(res.FairActive))
		}
		switch {
		case res.Granted:
			// A granted request holds its share in the queue: it no
			// longer counts among those waiting for it, so that the
			// tenant's next ones may wait while this one waits for its
			// reservation. Granted in its turn, it took the tenant's
			// room: the next one waits for the room after it without
			// asking the store now (fairGranted).
			if me != nil {
				b.layered.fairGranted(req.Tenant, b.clock.Now(), b.layered.fair.Horizon, b.replicaCount())
			}
			admitted = true
			fairCount(false)
		case res.Limiting == FairLayer && req.FairWaiting > 0 && admitted:
			b.layered.fairNote(req.Tenant, b.clock.Now(), res.Wait, res.FairSpacing)
			fairCount(true)
		}
		if !res.Granted && res.Limiting == FairLayer && req.FairWaiting > 0 && !admitted {
			if me = b.layered.fairEnter(req.Tenant, req.FairWaiting, b.clock.Now(), res.Wait, res.FairSpacing); me == nil {
				// Each replica sets aside about its share of the
				// tenant's messages: spaced by the pace times the live
				// replicas, together they come back at the pace.
				le := backend.FairError(res.At, res.Wait, res.FairSpacing*time.Duration(max(1, b.replicaCount())))
				b.observeLayered(start, req, FairLayer, le)
				return le
			}
			admitted = true
		}
		if res.Wait >= longest && res.Wait > 0 {
			longest, limiting = res.Wait, res.Limiting
		}
		if res.Granted {
			b.observeShadow(req, res.Shadow)
		}
		if !res.Granted {
			if res.Floor && !head {
				if !b.floor.hold(req.Priority) {
					continue // another caller of the class asks: queue behind it
				}
				head = true
			} else if !res.Floor {
				passFloor() // the floor lets the class through: the others ask too
			}
			if sw != nil && slotLayer(res.Limiting) {
				// Every slot held: until one is released, or the
				// earliest lease ends.
				if err := b.sleepSlot(ctx, sw, gen.changed, res.Wait); err != nil && !errors.Is(err, errChanged) {
					return err
				}
				continue
			}
			if me != nil && res.Limiting == FairLayer {
				// Its tenant's requests waiting for the share ask one
				// at a time, in order: one store call per room, not
				// one per waiting request.
				if err := b.fairTurn(ctx, gen.changed, req.Tenant, me); err != nil && !errors.Is(err, errChanged) {
					return err
				}
				continue
			}
			if !res.Floor && res.Limiting == "" && !lr.SkipShared && !refitted && b.refits(lr.MaxWait, res.Wait) {
				refitted = true // turned away by the shared bucket's horizon, which the answer stretched
				continue
			}
			if err := b.sleep(ctx, gen.changed, res.Wait); err != nil && !errors.Is(err, errChanged) {
				return err
			}
			continue
		}
		passFloor()
		var slots backend.SlotStore
		if holder != "" {
			slots, _ = ls.(backend.SlotStore)
		}
		if res.Wait > 0 {
			// A granted wait is the shared bucket's reservation: every
			// layer was charged for the instant it is due. It moves with
			// the shared bucket's queue, as a plain reservation does: a
			// push of its class moves it back, and a change (a rate set
			// or cleared, a pause) to where the change puts it, since
			// kept at its old instant it would go out next to the slots
			// the changed bucket hands out meanwhile. It never moves
			// before every layer had room (LayersDue). Moved back by
			// more than a fraction of the closest layer's spacing
			// (layersLateness), it charges its layers for the move
			// (LayeredStore.DelayLayers): the key's next message was
			// charged for an instant after this one's first.
			//
			// A cancelled reservation refunds the shared bucket only. Its
			// layers keep the charge: a token bucket charged again after
			// this one would hand the refunded token out next to that
			// later message, so the slot is forfeit rather than sent
			// twice.
			var pushes *pushHub
			var changes *generation
			if !lr.SkipShared {
				pushes, changes = &b.pushes, gen
			}
			// Nor before a slot it paid for: the key's message before it
			// went out a spacing ahead of that slot.
			notBefore := res.LayersDue
			if due := latestDue(lr.Paid); !due.IsZero() {
				notBefore = max(notBefore, due.Sub(res.At))
			}
			if err := b.sleepReserved(ctx, changes, pushes, seen, res.TakeResult, math.Float64frombits(b.lastRate.Load()), notBefore, b.layersMove(ctx, ls, lr, res)); err != nil {
				if errors.Is(err, errMovedLate) {
					// Decided again, after the message its key was
					// charged for meanwhile. Nothing is refunded: a
					// token refunded before a later reservation would go
					// out next to it. A paid slot is forfeit.
					b.paidForfeit(req.Paid, "")
					req.Paid = nil
					continue
				}
				if !lr.SkipShared {
					b.refundClass(ctx, req.Cost, res.Class)
				}
				release(slots, lr)
				return err
			}
		} else if early := b.paidAhead(lr.Paid, res.At); early > 0 {
			// Granted ahead of a slot it paid for (waitPaid asked a round
			// trip early): it goes out at the slot, not before, since its
			// key's message before it went out a spacing ahead of it.
			if err := b.sleep(ctx, nil, early); err != nil {
				if !lr.SkipShared {
					b.refundClass(ctx, req.Cost, res.Class)
				}
				release(slots, lr)
				return err
			}
		} else if by := b.answerLate(res.At); by > b.layered.lateness && b.layered.lateness > 0 || by > 0 && len(lr.Paid) > 0 {
			// A grant for now whose answer came back late goes out
			// late, perhaps next to its key's next message, charged
			// for an instant after this one's: as a reservation woken
			// late, it charges its layers for the move, or is decided
			// again. An answer on time builds nothing.
			out := func() time.Time { return res.At.Add(b.answerLate(res.At)) }
			if late := b.layersMove(ctx, ls, lr, res); late != nil && !late.keeps(b.clock, res.At, out) {
				b.paidForfeit(req.Paid, "")
				req.Paid = nil
				continue
			}
		}
		if g != nil {
			g.Layer = limiting
		}
		if granted != nil {
			*granted = slots
		}
		b.observeLayered(start, req, limiting, nil)
		return nil
	}
}

// answerLate returns how much later than the quickest answers one the
// store ran at its instant at arrives, by the skew estimate (skewMeter),
// at worst: plus the estimate's spread, since the quickest answers seen
// may have been slow too (the first answer of a Bucket is its own
// quickest, however slow it was). It is 0 when that is unknown.
func (b *Bucket) answerLate(at time.Time) time.Duration {
	skew, spread, ok := b.skew.estimate()
	if !ok || at.IsZero() {
		return 0
	}
	return b.clock.Now().Sub(at.Add(skew)) + spread
}

// layersMove returns how a layered grant res of the store ls for lr pays
// its layers when it goes out later than charged (see sleepReserved), or
// nil when no layer cares.
func (b *Bucket) layersMove(ctx context.Context, ls backend.LayeredStore, lr backend.LayerRequest, res backend.LayerResult) *lateness {
	if b.layered.lateness <= 0 {
		return nil
	}
	late := &lateness{after: b.layered.lateness, pay: func(from time.Time, by time.Duration, withPaid bool) (bool, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ProbeInterval)
		defer cancel()
		req := lr
		if withPaid {
			req.Paid = nil // moves the layers passed on a paid slot too
		}
		moved, err := ls.DelayLayers(dctx, req, res, from, by)
		if err != nil {
			b.log.Debug("charging the layers for a reservation moved back failed", "by", by, "error", err)
		}
		return moved, err
	}}
	// A slot paid for on a delay layer takes the slot's lateness as its
	// own; moved later than that, it moves with the message, charged for
	// the move, unless the key's next slot is booked too close behind
	// it: then the message is decided again (see Request.Paid).
	if len(lr.Paid) > 0 {
		late.paidUntil = paidUntil(b.layered.layers, lr)
		late.paidFrom = res.At.Add(res.Wait)
	}
	return late
}

// paidUntil returns the earliest instant, on the store's clock, past which
// a slot of lr.Paid is late, as the stores judge it (backend.PaidUntil: its
// Due plus backend.PaidLateness, on a delay layer of the request's key), or
// the zero time when none counts.
func paidUntil(layers []Layer, lr backend.LayerRequest) time.Time {
	keys, err := backend.LayerKeys(layers, lr)
	if err != nil {
		return time.Time{}
	}
	var until time.Time
	for _, u := range backend.PaidUntil(layers, keys, lr.Paid) {
		if !u.IsZero() && (until.IsZero() || u.Before(until)) {
			until = u
		}
	}
	return until
}

// layersLateness returns how much later than first due a layered
// reservation may go out: the least of the token-bucket layers' slot
// lateness (10% of its spacing, between 25 ms and 1 s; see
// backend.PaidLateness), or 0 (no bound) without such a layer.
func layersLateness(layers []Layer) time.Duration {
	var d time.Duration
	for _, l := range layers {
		if !l.IsBucket() {
			continue
		}
		if p := backend.PaidLateness(l); d == 0 || p < d {
			d = p
		}
	}
	return d
}

// allowLayers is Allow on a layered store: the shared bucket and every
// layer grant now, or nothing is taken.
func (b *Bucket) allowLayers(ctx context.Context, ls backend.LayeredStore, cost int) (bool, error) {
	layers := ls.Layers()
	if _, err := backend.LayerKeys(layers, backend.LayerRequest{}); err != nil {
		return false, err
	}
	if b.hasSlots() {
		return false, ErrNeedsAcquire
	}
	lr := backend.LayerRequest{Cost: cost, Priority: b.opts.Priority, MinShare: b.opts.MinShare, SkipShared: b.opts.Shadow, ShadowShared: b.opts.Shadow}
	for {
		switch b.Mode() {
		case ModeOpen:
			return true, nil
		case ModeClosed:
			return false, nil
		case ModeLocal:
			local := b.fallbackBucket()
			if local == nil {
				continue
			}
			lm, err := b.localLayers(local, layers)
			if err != nil {
				return false, err
			}
			res, err := lm.TakeLayersAt(b.clock.Now(), lr)
			if err == nil && res.Granted {
				b.observeShadow(Request{Cost: cost}, res.Shadow)
				b.layered.sends.record(b.clock.Now(), b.layered.layers, nil, cost, 0)
			}
			return err == nil && res.Granted, err
		}
		sent := b.clock.Now()
		res, err := ls.TakeLayers(ctx, lr)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return false, cerr
			}
			if errors.Is(err, ErrCostExceedsBurst) || errors.Is(err, ErrInvalidCost) {
				return false, err
			}
			b.storeFailed(err)
			continue
		}
		b.skew.observeTrip(sent, b.clock.Now(), res.At)
		if !lr.SkipShared {
			b.observeTake(res.TakeResult)
		}
		if res.Granted {
			b.observeShadow(Request{Cost: cost}, res.Shadow)
		}
		return res.Granted, nil
	}
}

// observeLayered reports the end of a WaitN: its wait and the layer that
// set it, or a layer's refusal.
func (b *Bucket) observeLayered(start time.Time, req Request, limiting string, err error) {
	o := b.opts.Observer
	var le *LimitError
	switch {
	case err == nil:
		b.granted.Add(int64(req.Cost))
		if req.Tenant != "" && b.layered.fair != nil {
			b.layered.tenantTokens.Add(b.clock.Now(), topk.Clip(req.Tenant), int64(req.Cost))
		}
		d := b.clock.Now().Sub(start)
		b.observeWaited(req.Priority, d)
		if o != nil && o.LayerWaited != nil {
			o.LayerWaited(limiting, d)
		}
	case errors.As(err, &le):
		b.layered.countExceeded(le.Layer)
		key := req.Keys[le.Layer]
		if le.Layer == FairLayer {
			key = req.Tenant
		}
		b.layered.countRefusedKey(b.clock.Now(), le.Layer, key)
		if o != nil && o.LimitExceeded != nil {
			o.LimitExceeded(le.Layer, le.Action)
		}
	}
}

// observeShadow reports the decisions of the shadow layers on a granted
// request, and counts those that would not have granted in Stats.Exceeded
// (and the request's key in them among the keys refused).
func (b *Bucket) observeShadow(req Request, ds []ShadowDecision) {
	if len(ds) == 0 {
		return
	}
	o := b.opts.Observer
	for _, d := range ds {
		if d.Exceeded() {
			b.layered.countExceeded(d.Layer)
			b.layered.countRefusedKey(b.clock.Now(), d.Layer, req.Keys[d.Layer])
		}
		if o != nil && o.ShadowDecided != nil {
			o.ShadowDecided(d)
		}
	}
}

// exceeded returns, by layer name, how many WaitN calls each layer refused
// since the Bucket started (Stats.Exceeded).
func (b *Bucket) exceeded() map[string]int64 {
	var out map[string]int64
	b.layered.exceeded.Range(func(k, v any) bool {
		if out == nil {
			out = map[string]int64{}
		}
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// countRefusedKey counts a refusal of key (none for "") by layer, for the
// keys each layer refused most (topRefused).
func (lf *layeredFallback) countRefusedKey(now time.Time, layer, key string) {
	if key == "" {
		return
	}
	w, ok := lf.refusedKeys.Load(layer)
	if !ok {
		w, _ = lf.refusedKeys.LoadOrStore(layer, topk.NewWindow(reportWindow, reportSlots, reportCapacity))
	}
	w.(*topk.Window).Add(now, topk.Clip(key), 1)
}

// topRefused returns, by layer, the keys it refused most over the last
// reportWindow (at most reportTop a layer); nil when none.
func (lf *layeredFallback) topRefused(now time.Time) map[string][]topk.Entry {
	var out map[string][]topk.Entry
	lf.refusedKeys.Range(func(k, v any) bool {
		if top, _ := v.(*topk.Window).Top(now, reportTop); len(top) > 0 {
			if out == nil {
				out = map[string][]topk.Entry{}
			}
			out[k.(string)] = top
		}
		return true
	})
	return out
}

// tenantEnter counts a WaitN of tenant in progress (tenantsWaiting), and
// tenantLeave its end.
func (lf *layeredFallback) tenantEnter(tenant string) {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	if lf.tenantWait == nil {
		lf.tenantWait = map[string]int{}
	}
	lf.tenantWait[tenant]++
}

func (lf *layeredFallback) tenantLeave(tenant string) {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	if lf.tenantWait[tenant]--; lf.tenantWait[tenant] <= 0 {
		delete(lf.tenantWait, tenant)
	}
}

// tenantsWaiting returns the reportTop tenants with the most WaitN calls
// in progress: waiting on a reservation, or for their share.
func (lf *layeredFallback) tenantsWaiting() []topk.Entry {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	top := topk.Of(lf.tenantWait, reportTop)
	for i := range top {
		top[i].Key = topk.Clip(top[i].Key)
	}
	return top
}

// The heartbeats carry, for operators' tools, the keys each layer refused
// most and the tenants granted the most tokens over the last reportWindow,
// counted in reportSlots slots of reportCapacity keys each (package topk),
// reportTop of each.
const (
	reportWindow   = time.Minute
	reportSlots    = 6
	reportCapacity = 32
	reportTop      = 10
)

// countExceeded counts a refusal by layer.
func (lf *layeredFallback) countExceeded(layer string) {
	n, ok := lf.exceeded.Load(layer)
	if !ok {
		n, _ = lf.exceeded.LoadOrStore(layer, new(atomic.Int64))
	}
	n.(*atomic.Int64).Add(1)
}

// layeredFallback is a Bucket's layer state: the local fallback's layers,
// which belong to one local *Memory (a new fallback starts afresh), and
// whether a WaitN is leasing shared tokens.
type layeredFallback struct {
	mu     sync.Mutex
	shared *backend.Memory
	local  *backend.LayeredMemory
	// exceeded counts the refusals by layer: name → *atomic.Int64.
	exceeded sync.Map
	// paid signs and verifies the paid slots (paidsig.go).
	paid paidSigner
	// store is the Bucket's store when it has layers, found once, with
	// its layers and their layersLateness.
	once     sync.Once
	store    backend.LayeredStore
	layers   []Layer
	lateness time.Duration
	// windowsOnly: every layer is a send window, none a shadow
	// (windowsOpen may decide a leased request).
	windowsOnly bool
	// fair is the store's fair shares, nil for none; fairActive the
	// tenants its last answer counted in a request's class.
	fair       *Fair
	fairActive atomic.Int64
	fairMu     sync.Mutex
	// fairWaiting holds, for each tenant with requests waiting for
	// their share, those requests in order and the room the store last
	// announced (see fairHeldBack and fairTurn).
	fairWaiting map[string]*fairQueue
	tenantWait  map[string]int // WaitN calls in progress, by tenant
	// refusedKeys counts the keys each layer refused (a shadow layer:
	// would have) over the last reportWindow: name → *topk.Window.
	// tenantTokens counts the tokens granted to each tenant.
	refusedKeys  sync.Map
	tenantTokens *topk.Window
	// sends holds what the local fallback granted on the layers' keys,
	// charged to the store when it is back (chargeLocalSends).
	sends localSends
}

// fairQueue is a tenant's requests waiting for its share in a Bucket, in
// the order they came, and when its share has room by the store's last
// answer that made one of them wait (by the Bucket's clock), with how far
// apart its reservations came due then. The first of them asks the store
// when the room comes; the others wait for their turn (fairTurn).
type fairQueue struct {
	waiting []*fairWaiter
	room    time.Time
	spacing time.Duration
	// learned is when the store's answer gave room and spacing; room
	// may since have been moved on by grants (fairGranted).
	learned time.Time
}

// fairWaiter is one request in a fairQueue: turn is closed when it is the
// first.
type fairWaiter struct {
	turn chan struct{}
}

// fairQueueLocked returns tenant's queue, made if need be. lf.fairMu is
// held.
func (lf *layeredFallback) fairQueueLocked(tenant string) *fairQueue {
	q := lf.fairWaiting[tenant]
	if q == nil {
		if lf.fairWaiting == nil {
			lf.fairWaiting = map[string]*fairQueue{}
		}
		q = &fairQueue{}
		lf.fairWaiting[tenant] = q
	}
	return q
}

// add queues a new waiter last and returns it.
func (q *fairQueue) add() *fairWaiter {
	w := &fairWaiter{turn: make(chan struct{})}
	if len(q.waiting) == 0 {
		close(w.turn)
	}
	q.waiting = append(q.waiting, w)
	return w
}

// fairEnter records that tenant's share has room wait after now, its
// reservations coming due spacing apart (the store's answer to a request
// that must wait for it), and queues the request among those waiting for
// the share, unless bound are already: then it returns nil.
func (lf *layeredFallback) fairEnter(tenant string, bound int, now time.Time, wait, spacing time.Duration) *fairWaiter {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	q := lf.fairQueueLocked(tenant)
	q.room, q.spacing, q.learned = now.Add(wait), spacing, now
	if len(q.waiting) >= bound {
		return nil
	}
	return q.add()
}

// fairNote records that tenant's share has room wait after now, its
// reservations coming due spacing apart, for a request already admitted.
func (lf *layeredFallback) fairNote(tenant string, now time.Time, wait, spacing time.Duration) {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	q := lf.fairQueueLocked(tenant)
	q.room, q.spacing, q.learned = now.Add(wait), spacing, now
}

// fairGranted records that a request of tenant that waited for its share
// was granted at now, taking the room: the tenant's next room is one of
// its spacings later, times replicas (the live replicas take the rooms in
// turn), and the next waiting request sleeps until then instead of asking
// the store at once only to learn it. Asked early (the share shrank, or
// another replica took that room), the store refuses with the exact room.
// The estimate holds while the store's last answer is at most horizon
// old; after that the next request asks at once, so that a share grown
// meanwhile (a tenant gone idle) is seen within horizon.
func (lf *layeredFallback) fairGranted(tenant string, now time.Time, horizon time.Duration, replicas int) {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	q := lf.fairWaiting[tenant]
	if q == nil || q.spacing <= 0 || now.Sub(q.learned) > horizon {
		return
	}
	q.room = now.Add(q.spacing * time.Duration(max(1, replicas)))
}

// fairWaitAdd queues again, beyond the bound, a request of tenant already
// admitted that waits for its share once more (its reservation moved
// late and was decided again).
func (lf *layeredFallback) fairWaitAdd(tenant string) *fairWaiter {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	return lf.fairQueueLocked(tenant).add()
}

// fairLeave takes w out of tenant's queue; when it was the first, the
// next one's turn comes.
func (lf *layeredFallback) fairLeave(tenant string, w *fairWaiter) {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	q := lf.fairWaiting[tenant]
	if q == nil {
		return
	}
	for i, x := range q.waiting {
		if x != w {
			continue
		}
		q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
		if i == 0 && len(q.waiting) > 0 {
			close(q.waiting[0].turn)
		}
		break
	}
	if len(q.waiting) == 0 {
		delete(lf.fairWaiting, tenant)
	}
}

// fairTurn waits until w is the first of tenant's requests waiting for
// the share, then until the room the store last announced for the tenant
// (at once when it has come). It returns errChanged when the shared
// bucket changed meanwhile, ctx's error or ErrClosed.
func (b *Bucket) fairTurn(ctx context.Context, changed <-chan struct{}, tenant string, w *fairWaiter) error {
	select {
	case <-w.turn:
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		return ErrClosed
	case <-changed:
		return errChanged
	}
	lf := &b.layered
	lf.fairMu.Lock()
	var room time.Time
	if q := lf.fairWaiting[tenant]; q != nil {
		room = q.room
	}
	lf.fairMu.Unlock()
	return b.sleep(ctx, changed, room.Sub(b.clock.Now()))
}

// fairHeldBack decides a request of tenant at now without asking the
// store while some of the tenant's requests already wait for its share:
// they take its next rooms first, one each, so the store could only make
// this one wait too. With bound of them waiting it returns the request's
// refusal, and the consumer sets it aside at once (no store call for a
// backlog's messages beyond them): its wait is until the room the store
// last announced for the tenant and bound of its spacings after it (the
// waiting ones' turns); its spacing is the tenant's, times replicas, as in
// a refusal from the store's answer. With fewer, it queues the request
// last among them and returns its place: it asks the store in its turn
// (fairTurn), not now. It returns nil, nil when the store must decide.
func (lf *layeredFallback) fairHeldBack(tenant string, bound int, now time.Time, replicas int) (*LimitError, *fairWaiter) {
	lf.fairMu.Lock()
	defer lf.fairMu.Unlock()
	q := lf.fairWaiting[tenant]
	if q == nil || len(q.waiting) == 0 {
		return nil, nil
	}
	if len(q.waiting) < bound {
		return nil, q.add()
	}
	wait := max(q.room.Sub(now), 0) + time.Duration(bound)*q.spacing
	return backend.FairError(now, max(wait, time.Microsecond), q.spacing*time.Duration(max(1, replicas))), nil
}

// layeredStore returns the Bucket's store if it is a LayeredStore with at
// least one layer, else nil.
// Layers returns the layers of the Bucket's store, with their defaults
// filled in, or nil for a store without layers.
func (b *Bucket) Layers() []Layer {
	if ls := b.layeredStore(); ls != nil {
		return ls.Layers()
	}
	return nil
}

func (b *Bucket) layeredStore() backend.LayeredStore {
	b.layered.once.Do(func() {
		if ls, ok := b.store.(backend.LayeredStore); ok && (len(ls.Layers()) > 0 || backend.FairOf(ls) != nil || b.opts.Shadow) {
			b.layered.store, b.layered.layers = ls, ls.Layers()
			b.layered.lateness = layersLateness(b.layered.layers)
			b.layered.windowsOnly = windowsOnly(b.layered.layers)
			b.layered.fair = backend.FairOf(ls)
			if b.layered.fair != nil {
				b.layered.tenantTokens = topk.NewWindow(reportWindow, reportSlots, reportCapacity)
			}
		}
	})
	return b.layered.store
}

func (b *Bucket) layeredState() *layeredFallback { return &b.layered }

// Fair returns the fair shares of the Bucket's store (see Fair), or nil
// for a store without them.
func (b *Bucket) Fair() *Fair {
	b.layeredStore()
	return b.layered.fair
}

// FairActive returns the number of tenants that the store's last answer to
// a request with a tenant counted in that request's class: those holding
// reservations not yet due (0 before any, and without fair shares).
func (b *Bucket) FairActive() int {
	return int(b.layered.fairActive.Load())
}

// localLayers returns the in-process layers that go with the fallback
// bucket local, at this replica's share of each layer.
func (b *Bucket) localLayers(local *backend.Memory, layers []Layer) (*backend.LayeredMemory, error) {
	lf := b.layeredState()
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.shared == local && lf.local != nil {
		return lf.local, nil
	}
	replicas := float64(b.shareReplicas()) // those that consume, as the shared bucket's share
	if full := math.Float64frombits(b.lastRate.Load()); b.opts.FallbackRate > 0 && full > 0 {
		replicas = max(1, full/b.opts.FallbackRate)
	}
	lm, err := backend.NewLayeredMemory(local, shareLayers(layers, replicas))
	if err != nil {
		return nil, err
	}
	if lf.fair != nil {
		if err := lm.SetFair(*lf.fair); err != nil {
			return nil, err
		}
	}
	lf.shared, lf.local = local, lm
	return lm, nil
}

// shareLayers returns layers at one replica's share of n: rates divided by
// n, bursts and quotas divided by n and rounded up (at least 1).
func shareLayers(layers []Layer, n float64) []Layer {
	out := append([]Layer(nil), layers...)
	if n <= 1 {
		return out
	}
	for i := range out {
		l := &out[i]
		switch {
		case l.IsConcurrency():
			l.Concurrency = max(1, int(math.Ceil(float64(l.Concurrency)/n)))
			continue
		case l.IsWindow():
			continue
		case l.IsBudget():
			l.Budget = max(1, backend.Amount(math.Ceil(float64(l.Budget)/n)))
			continue
		case l.IsQuota():
			l.Quota = max(1, int(math.Ceil(float64(l.Quota)/n)))
			continue
		}
		l.Rate /= n
		if l.Burst > 0 {
			l.Burst = max(1, int(math.Ceil(float64(l.Burst)/n)))
		}
	}
	return out
}

// waitLayersFallback is WaitN under the store-failure policy. It returns
// errRetryShared when the store came back before tokens were granted.
func (b *Bucket) waitLayersFallback(ctx context.Context, ls backend.LayeredStore, req Request, holder string, granted *backend.SlotStore) error {
	local, recovered, settled, err := b.fallbackGate(ctx)
	if settled {
		return err
	}
	lm, err := b.localLayers(local, ls.Layers())
	if err != nil {
		return err
	}
	// A cost above a local share's burst or quota is charged as much as
	// the share holds, so that a message the shared limits allow is not
	// refused for the split.
	localRate, localBurst := local.Limits()
	cost, price := min(req.Cost, localBurst), req.Price
	for _, l := range lm.Layers() {
		switch {
		case l.IsConcurrency():
		case l.IsWindow():
		case l.IsBudget():
			price = min(price, l.Budget)
		case l.IsQuota():
			cost = min(cost, l.Quota)
		default:
			cost = min(cost, l.Burst)
		}
	}
	lr := backend.LayerRequest{Cost: cost, Price: price, Keys: req.Keys, MaxWait: b.opts.MaxReserve, Priority: req.Priority, MinShare: b.opts.MinShare, Paid: req.Paid, Tenant: req.Tenant, Holder: holder, SkipShared: b.opts.Shadow, ShadowShared: b.opts.Shadow}
	pushes := b.fallbackPushes(local)
	for {
		gen := b.gen.Load()
		var heard [NumPriorities]uint64
		if pushes != nil {
			heard = pushes.heard()
		}
		res, err := lm.TakeLayersAt(b.clock.Now(), lr)
		if err != nil {
			return err
		}
		if res.Exceeded != nil {
			b.paidForfeit(req.Paid, res.Exceeded.Layer)
			b.signPaid(ctx, res.Exceeded, true) // paidsig.go: booked locally
			return res.Exceeded
		}
		if !res.Granted {
			if err := b.sleep(ctx, gen.changed, res.Wait); err != nil && !errors.Is(err, errChanged) {
				return err
			}
			select {
			case <-recovered:
				return errRetryShared
			default:
			}
			continue
		}
		b.observeShadow(req, res.Shadow)
		// As in the shared bucket, a push of its class moves the
		// reservation back, and a move back charges the layers for it
		// (see WaitN).
		var late *lateness
		if after := layersLateness(lm.Layers()); after > 0 {
			late = &lateness{after: after, pay: func(from time.Time, by time.Duration, _ bool) (bool, error) {
				return lm.DelayLayersAt(b.clock.Now(), lr, res, from, by)
			}}
		}
		if err := b.sleepReserved(ctx, nil, pushes, heard, res.TakeResult, localRate, 0, late); err != nil {
			if errors.Is(err, errMovedLate) {
				continue // decided again, nothing refunded (see WaitN)
			}
			if !lr.SkipShared {
				local.RefundClassAt(b.clock.Now(), lr.Cost, res.Class) // the layers keep theirs (see WaitN)
			}
			if holder != "" {
				if keys, kerr := backend.LayerKeys(lm.Layers(), lr); kerr == nil {
					slots := backend.Slots(lm.Layers(), keys, holder)
					_ = lm.ReleaseSlots(ctx, slots)
					for _, s := range slots {
						b.slotQueues.wake(s.Layer, s.Key)
					}
				}
			}
			return err
		}
		b.layered.sends.record(b.clock.Now(), b.layered.layers, req.Keys, req.Cost, req.Price)
		if granted != nil {
			*granted = lm
		}
		return nil
	}
}

// windowLocalMargin is how far inside an open interval of every send
// window, on the store's clock as the Bucket estimates it, a leased
// request must be for windowsOpen to grant it without the store: nearer a
// boundary the store decides, on its own clock.
const windowLocalMargin = time.Minute

// windowsOnly reports whether layers are send windows only, none a shadow.
func windowsOnly(layers []Layer) bool {
	for _, l := range layers {
		if !l.IsWindow() || l.Shadow {
			return false
		}
	}
	return len(layers) > 0
}

// windowsOpen reports whether a request of class p with keys passes every
// window of layers (windowsOnly) at store, the store's clock as the Bucket
// estimates it (skewMeter), with windowLocalMargin to spare on both sides
// of the open interval; local is the Bucket's clock, around which the
// intervals are computed, as for the store. False means the store decides:
// a window closed or near a boundary, an estimate that may be off, a key
// missing or not a number (the store's error tells why).
func windowsOpen(layers []Layer, keys map[string]string, p Priority, local, store time.Time) bool {
	at := store.UnixMicro()
	margin := windowLocalMargin.Microseconds()
	for _, l := range layers {
		key := ""
		if l.Keyed {
			if key = keys[l.Name]; key == "" {
				return false
			}
		}
		spans, err := backend.WindowSpans(l, key, p, local)
		if err != nil {
			return false
		}
		if spans == nil { // an exempt class
			continue
		}
		open := false
		for i := 0; i+1 < len(spans); i += 2 {
			if spans[i]+margin <= at && at+margin < spans[i+1] {
				open = true
				break
			}
		}
		if !open {
			return false
		}
	}
	return true
}

// shadowStore returns the store a Bucket with Options.Shadow decides on:
// store itself when it decides layers, an in-process bucket without layers
// wrapped in a layered one, else a *ParamError; and a *ParamError for a
// store with fair shares.
func shadowStore(store Store, opts Options) (Store, error) {
	if m, ok := store.(*backend.Memory); ok {
		lm, err := backend.NewLayeredMemory(m, nil)
		if err != nil {
			return nil, err
		}
		return lm, nil
	}
	ls, ok := store.(backend.LayeredStore)
	if !ok {
		return nil, &ParamError{Param: "Shadow", Msg: "needs a store that decides layers: the Redis store's WithLayers (nil for none) or NewLocalStore"}
	}
	if err := opts.ValidateFair(backend.FairOf(ls)); err != nil {
		return nil, err
	}
	return store, nil
}
