package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// The store-failure state machine.
//
//	shared ──store error──► local | closed | open   (Options.OnStoreError)
//	shared ──ErrMisconfigured──► closed              (whatever the policy)
//	local | open ──probe: ErrMisconfigured──► closed
//	any ──probe: the store answers, Drain succeeds──► shared
//
// Going to local: the local bucket starts empty, and grants nothing before
// the reservations already made in the shared bucket are served: until the
// tail this replica saw booked, or the failure plus the queue it last saw
// (other replicas kept booking since), whichever is later. Its share is
// Options.FallbackRate, or the last effective rate divided by the live
// replicas that consume (not idle, see Bucket.SetIdle); a replica that
// never learnt the count is closed instead.
//
// Coming back: the shared bucket may have refilled while nobody took from
// it, or restarted full and empty of state, or (after a Sentinel failover)
// lag behind what was spent. So the Bucket drains it and charges it with the
// tokens its local bucket has booked ahead, times the live replicas (the
// others booked about as much, and may come back later), before it takes
// from it again. Before that it charges the store's layers with what its
// fallback sent on each key (localsends.go).
//
// With a warm-up (a store that is a WarmupStore), the local bucket ramps
// as the shared one would, at this replica's share, and never above the
// local rate it would have without the warm-up (see warmLocal).
// The drain is announced, and every replica still in fallback probes at
// once when it hears an announcement.

// fallbackState is the part of a Bucket that changes with the mode.
type fallbackState struct {
	mu sync.Mutex // guards every field and the mode transitions
	// local is the in-process bucket of ModeLocal, or nil.
	local *backend.Memory
	// pushes fans the local bucket's pushes out to the callers sleeping on
	// its reservations, as Bucket.pushes does the store's; unwatch ends
	// the watch of local that feeds it.
	pushes  *pushHub
	unwatch context.CancelFunc
	// recovered is closed when the Bucket returns to ModeShared; nil in
	// ModeShared.
	recovered chan struct{}
	// cause is the store error that made the Bucket leave ModeShared.
	cause error
	// probing is set while the probe goroutine runs.
	probing bool
	// probeNow asks the probe to ask the store at once: the store has
	// announced something, so it is back at least for someone.
	probeNow chan struct{}
	// replicas is how many replicas the local share assumed: the live
	// count, or the rate over Options.FallbackRate.
	replicas float64
	// rateSeen is set once a take's answer gave the shared bucket's
	// effective rate (observeTake): lastRate is then the store's, not
	// Store.Limits'. Atomic, not guarded by mu.
	rateSeen atomic.Bool
	// idle is what Bucket.SetIdle last set, and idleReplicas the other
	// live replicas that reported themselves idle in the last heartbeat
	// (ConsumerTracker), left out of the local share. Atomic, not guarded
	// by mu.
	idle         atomic.Bool
	idleReplicas atomic.Int64
}

var errRetryShared = errors.New("store recovered")

// errUnknownShare is the cause logged when a replica closes because it
// never learnt how many replicas share the bucket.
var errUnknownShare = errors.New("the number of live replicas is unknown (none was ever counted) and Options.FallbackRate is not set")

// fallbackBucket returns the local bucket of ModeLocal, or nil.
func (b *Bucket) fallbackBucket() *backend.Memory {
	b.fb.mu.Lock()
	defer b.fb.mu.Unlock()
	return b.fb.local
}

// fallbackPushes returns the pushes of the local bucket local, or nil when
// local is no longer the Bucket's.
func (b *Bucket) fallbackPushes(local *backend.Memory) *pushHub {
	b.fb.mu.Lock()
	defer b.fb.mu.Unlock()
	if b.fb.local != local {
		return nil
	}
	return b.fb.pushes
}

// setLocalLocked makes local the local bucket, or none when nil, and
// watches its pushes for the callers sleeping on its reservations: a
// request of a higher class moves those of the lower classes back, as in
// the shared bucket. b.fb.mu is held.
func (b *Bucket) setLocalLocked(local *backend.Memory) {
	if b.fb.unwatch != nil {
		b.fb.unwatch()
	}
	b.fb.local, b.fb.pushes, b.fb.unwatch = local, nil, nil
	if local == nil {
		return
	}
	hub := new(pushHub)
	hub.init()
	ctx, cancel := context.WithCancel(context.Background())
	b.fb.pushes, b.fb.unwatch = hub, cancel
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		local.Watch(ctx, func() {}, hub.add)
	}()
}

// fallbackGate settles a wait under the store-failure policy in the modes
// that need no local bucket: ModeOpen grants at once (settled, nil error),
// ModeClosed blocks until ctx ends, the Bucket closes or the store comes
// back, and a store already back gives errRetryShared. In ModeLocal it
// returns the local bucket and the channel closed on recovery, unsettled.
func (b *Bucket) fallbackGate(ctx context.Context) (local *backend.Memory, recovered <-chan struct{}, settled bool, err error) {
	b.fb.mu.Lock()
	mode, local, rec, cause := b.Mode(), b.fb.local, b.fb.recovered, b.fb.cause
	b.fb.mu.Unlock()
	if rec == nil {
		return nil, nil, true, errRetryShared
	}
	switch mode {
	case ModeOpen:
		return nil, nil, true, nil
	case ModeClosed:
		select {
		case <-ctx.Done():
			return nil, nil, true, closedError(ctx.Err(), cause)
		case <-b.done:
			return nil, nil, true, ErrClosed
		case <-rec:
			return nil, nil, true, errRetryShared
		}
	}
	return local, rec, false, nil
}

// closedError is the error of a wait that ctx ended while the Bucket was
// in ModeClosed: it matches both ctxErr and the store error that closed it
// (ErrStore for an outage, ErrMisconfigured for a refused client), so that
// the caller learns why nothing was granted.
func closedError(ctxErr, cause error) error {
	if cause == nil {
		return fmt.Errorf("bucket closed by its store-failure policy: %w", ctxErr)
	}
	return fmt.Errorf("bucket closed by its store-failure policy (%w): %w", cause, ctxErr)
}

// waitFallback waits under the store-failure policy for a request of class
// p. It returns errRetryShared when the store came back before tokens were
// granted.
func (b *Bucket) waitFallback(ctx context.Context, p Priority, cost int) error {
	local, _, settled, err := b.fallbackGate(ctx)
	if settled {
		return err
	}
	// A cost above the local share's burst is taken in chunks, each
	// reserved in turn, so that it costs the right time without being
	// impossible. Reservations reach no further than the horizon, as in
	// the shared bucket, so that little is booked ahead when the store
	// comes back.
	pushes := b.fallbackPushes(local)
	localRate, localBurst := local.Limits()
	for left := cost; left > 0; {
		if left == cost && b.fallbackBucket() != local {
			// The store came back while this caller waited for the
			// local bucket: the tokens the local bucket grants now
			// would not be charged to the shared one.
			return errRetryShared
		}
		n := min(left, localBurst)
		gen := b.gen.Load()
		var heard [NumPriorities]uint64
		if pushes != nil {
			heard = pushes.heard()
		}
		res, err := local.TakeAt(b.clock.Now(), backend.TakeRequest{Cost: n, MaxWait: b.opts.MaxReserve, Priority: p, MinShare: b.opts.MinShare})
		if err != nil {
			return err
		}
		if !res.Granted {
			if err := b.sleep(ctx, gen.changed, res.Wait); err != nil && !errors.Is(err, errChanged) {
				return err
			}
			continue
		}
		if err := b.sleepReserved(ctx, nil, pushes, heard, res, localRate, 0, nil); err != nil {
			local.RefundClassAt(b.clock.Now(), n, res.Class)
			return err
		}
		left -= n
	}
	return nil
}

// storeFailed reports a failed store call and, in ModeShared, switches to
// the policy for it.
func (b *Bucket) storeFailed(err error) {
	if o := b.opts.Observer; o != nil && o.StoreError != nil {
		o.StoreError(err)
	}
	b.fb.mu.Lock()
	defer b.fb.mu.Unlock()
	select {
	case <-b.done:
		return
	default:
	}
	from := b.Mode()
	switch {
	case errors.Is(err, ErrMisconfigured):
		if from == ModeClosed {
			return
		}
		b.log.Error("the bucket store refused this replica: not granting until it is fixed", "mode", ModeClosed, "error", err)
		b.switchLocked(from, ModeClosed, err)
	case from != ModeShared:
		return
	case b.opts.OnStoreError == ModeLocal:
		b.fallBackLocked(err)
	default:
		b.log.Warn("bucket store failed", "mode", b.opts.OnStoreError, "error", err)
		b.switchLocked(from, b.opts.OnStoreError, err)
	}
}

// fallBackLocked switches from ModeShared to ModeLocal, or to ModeClosed
// when this replica does not know its share. b.fb.mu is held.
func (b *Bucket) fallBackLocked(err error) {
	rate := b.opts.FallbackRate
	replicas := float64(b.shareReplicas())
	full, burst := math.Float64frombits(b.lastRate.Load()), b.lastBurst.Load()
	if rate == 0 {
		if !b.countKnown.Load() {
			b.log.Error("bucket store failed and this replica does not know its share of the rate: not granting until the store answers",
				"mode", ModeClosed, "reason", errUnknownShare, "error", err)
			b.switchLocked(ModeShared, ModeClosed, err)
			return
		}
		rate = full / replicas
	} else if full > 0 {
		replicas = max(1, full/rate)
	}
	now := b.clock.Now()
	// The local bucket starts empty: the shared bucket's tokens were spent
	// or are about to be. Reservations already made there are still
	// served: the local bucket refills only after them.
	booked := time.Unix(0, b.bookedUntil.Load())
	// Other replicas booked more since this one last looked: a queue
	// seen D tokens deep stays about that deep while the bucket is busy,
	// so it reaches at least D/rate past the failure.
	if full > 0 {
		queue := math.Float64frombits(b.lastDebt.Load()) / full
		if t := now.Add(time.Duration(min(queue, 1e6) * float64(time.Second))); t.After(booked) {
			booked = t
		}
	}
	local, ferr := backend.NewEmptyMemory(rate, max(1, int(math.Ceil(float64(burst)/replicas))), b.clock.Now, booked)
	if ferr != nil {
		b.log.Error("bucket store failed and the local share is unusable: not granting", "mode", ModeClosed, "local_rate", rate, "error", ferr)
		b.switchLocked(ModeShared, ModeClosed, err)
		return
	}
	b.warmLocal(local, now)
	b.setLocalLocked(local)
	b.fb.replicas = replicas
	_, localBurst := local.Limits()
	b.log.Warn("bucket store failed, limiting locally", "mode", ModeLocal, "local_rate", rate, "local_burst", localBurst,
		"replicas", math.Round(replicas*100)/100, "local_start_in", max(0, booked.Sub(now)), "error", err)
	b.switchLocked(ModeShared, ModeLocal, err)
}

// warmLocal gives the local bucket, not yet in use, the store's warm-up
// (WarmupStore), and puts it where the shared bucket's ramp was as far as
// this replica can tell, without ever going above the local rate:
//
//   - A replica that never saw the shared bucket's effective rate starts
//     the local ramp at the failure, from a third of its rate: the shared
//     bucket may be cold.
//   - With Options.FallbackRate, the local rate is fixed whatever the
//     shared bucket did: the local bucket starts at the factor f of the
//     ramp that the last effective rate shows against the store's rate
//     (Store.Limits), between 1/3 and 1, and climbs to FallbackRate over
//     the rest of the warm-up. An adaptive rate or an override below the
//     configured one looks like a ramp, so it only ramps from lower.
//   - Without it, the local rate is the last effective rate over the
//     replicas, which already carries the shared ramp's factor: the local
//     bucket starts warm and keeps it (it does not climb further, since
//     the plain rate under the ramp is unknown).
//
// In every case a local bucket idle for longer than the warm-up ramps
// again from a third of its rate on its next take, as the shared one
// would. m.mu need not be held: local is not shared yet.
func (b *Bucket) warmLocal(local *backend.Memory, now time.Time) {
	ws, ok := b.store.(backend.WarmupStore)
	if !ok {
		return
	}
	w := ws.Warmup()
	if w <= 0 {
		return
	}
	f := 1.0
	switch {
	case !b.fb.rateSeen.Load():
		f = 1.0 / 3
	case b.opts.FallbackRate > 0:
		if rate, _ := b.store.Limits(); rate > 0 {
			f = math.Float64frombits(b.lastRate.Load()) / rate
		}
	}
	local.WarmAt(w, f, now)
}

// switchLocked moves from one mode to another, and starts the probe when
// leaving ModeShared. b.fb.mu is held.
func (b *Bucket) switchLocked(from, to Mode, err error) {
	if from == ModeShared {
		b.fb.recovered = make(chan struct{})
	}
	b.fb.cause = err
	if to != ModeLocal {
		b.setLocalLocked(nil)
	}
	b.mode.Store(&to)
	if o := b.opts.Observer; o != nil && o.ModeChanged != nil {
		o.ModeChanged(from, to, err)
	}
	if !b.fb.probing {
		b.fb.probing = true
		b.wg.Add(1)
		go b.probe()
	}
}

// probe asks the store every ProbeInterval whether it is back, and switches
// to ModeShared when it is. It also asks at once when the store announces a
// change (see Notifier): the subscription of a Notifier comes back with the
// store, and another replica's recovery is announced, so that the replicas
// of a fleet come back together instead of up to a ProbeInterval apart,
// while the first ones back already take the whole rate from the shared
// bucket and the others still grant their local share.
func (b *Bucket) probe() {
	defer b.wg.Done()
	t := b.clock.NewTimer(b.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C():
		case <-b.fb.probeNow:
		}
		if b.tryRecover() {
			return
		}
		t.Reset(b.opts.ProbeInterval)
	}
}

// tryRecover asks the store whether it is back and, if it is, switches to
// ModeShared. A failed probe is reported to Observer.StoreError, so that an
// error count keeps rising through an outage. Coming from ModeLocal or
// ModeOpen it first charges the store's layers with the keys the local
// fallback sent (chargeLocalSends), then drains the shared bucket and
// charges it with what the local bucket has booked ahead. It reports
// whether the probe is done.
func (b *Bucket) tryRecover() bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.ProbeInterval)
	defer cancel()
	st, err := b.store.Status(ctx)
	if err == nil && b.Mode() != ModeClosed { // a closed replica granted nothing
		// The keys the local fallback sent, first: on an error the
		// Bucket stays in its fallback, with nothing drained twice.
		err = b.chargeLocalSends()
	}
	if err == nil && b.Mode() != ModeClosed {
		// The other replicas fell back too, most likely, and booked about
		// as much as this one: charge the fleet's estimate, since the
		// first replica back takes from the shared bucket while the
		// others still serve their local bookings. The drain has a
		// probe interval of its own, whatever the charge took.
		debt := 0
		b.fb.mu.Lock()
		local, replicas := b.fb.local, max(b.fb.replicas, float64(b.shareReplicas()))
		b.fb.mu.Unlock()
		if local != nil {
			ls := local.StatusAt(b.clock.Now())
			debt = int(math.Ceil(max(0, -ls.Tokens) * replicas))
		}
		dctx, dcancel := context.WithTimeout(context.Background(), b.opts.ProbeInterval)
		err = b.store.Drain(dctx, debt)
		dcancel()
	}
	if err != nil {
		if errors.Is(err, ErrMisconfigured) {
			b.storeFailed(err) // reports it, and closes a local or open Bucket
		} else if o := b.opts.Observer; o != nil && o.StoreError != nil {
			o.StoreError(err)
		}
		return false
	}
	b.recoveredAt.Store(b.clock.Now().UnixNano())
	b.observeState(st)
	b.fb.mu.Lock()
	from := b.Mode()
	shared := ModeShared
	b.mode.Store(&shared)
	b.setLocalLocked(nil)
	close(b.fb.recovered)
	b.fb.recovered = nil
	b.fb.probing = false
	b.fb.mu.Unlock()
	b.log.Info("bucket store is back, sharing the bucket again", "previous_mode", from)
	// Sends the fallback granted while the charge above was under way.
	if err := b.chargeLocalSends(); err != nil {
		b.log.Warn("could not charge the bucket store's layers with the last keys sent while limiting locally", "error", err)
	}
	if o := b.opts.Observer; o != nil && o.ModeChanged != nil {
		o.ModeChanged(from, ModeShared, nil)
	}
	return true
}
