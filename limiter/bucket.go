package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Mode says how a Bucket is limiting right now.
type Mode string

// The modes of a Bucket. ModeShared is normal operation; the others are the
// policies for a store failure, chosen with Options.OnStoreError.
const (
	// ModeShared takes every token from the Store, shared by all replicas.
	ModeShared Mode = "shared"
	// ModeLocal limits with an in-process bucket at this replica's share of
	// the rate while the Store is down. It is the default policy.
	ModeLocal Mode = "local"
	// ModeClosed stops granting until the Store answers again.
	ModeClosed Mode = "closed"
	// ModeOpen grants everything while the Store is down. It is dangerous:
	// the sink sees the unthrottled rate of every replica.
	ModeOpen Mode = "open"
)

// ParseMode parses a store-error policy: "local", "closed" or "open".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeLocal, ModeClosed, ModeOpen:
		return m, nil
	}
	return "", &ParamError{Param: "on_store_error", Msg: "must be local, closed or open", Value: s}
}

// Options configure a Bucket. The zero value is ready to use; each field
// documents its default.
type Options struct {
	// MaxReserve is the reservation horizon: Wait reserves tokens that will
	// be due within max(MaxReserve, cost/rate), so that waiting replicas are
	// served in order with one store call per message. A caller beyond the
	// horizon is told how long to wait before it asks again. When more
	// callers wait than the rate serves within MaxReserve, the horizon grows
	// to fit them all (up to 10·MaxReserve), so that they queue instead of
	// coming back. A store that implements Notifier makes a runtime rate
	// change or pause reach reservations already made at once (or, if the
	// announcement came while its subscription was down, once it has
	// subscribed again); otherwise no later than the horizon. Default 1s.
	MaxReserve time.Duration
	// OnStoreError is the policy while the store fails: ModeLocal (the
	// default), ModeClosed or ModeOpen.
	OnStoreError Mode
	// FallbackRate is the rate of the local bucket in ModeLocal. Default:
	// the last effective rate divided by the live replicas seen in
	// heartbeats before the failure.
	FallbackRate float64
	// ProbeInterval is how often a Bucket in fallback asks the store
	// whether it is back. Default 1s.
	ProbeInterval time.Duration
	// ReplicaID names this replica in heartbeats. Default: host name,
	// process id and a counter.
	ReplicaID string
	// HeartbeatInterval is how often the Bucket reports itself alive to a
	// store that implements ReplicaTracker. A replica counts as gone after
	// three missed heartbeats. Default 3s.
	HeartbeatInterval time.Duration
	// MaxPause caps Pause. Default 60s.
	MaxPause time.Duration
	// Lease configures token leasing. Default: on, adapting to the rate.
	Lease LeaseOptions
	// Observer receives events for metrics. Default: none.
	Observer *Observer
	// Logger receives mode transitions. Default: slog.Default().
	Logger *slog.Logger
	// Clock is used only to measure how long Wait blocked, for the
	// Observer. It never takes part in the bucket's arithmetic, which uses
	// the store's clock. Default time.Now.
	Clock func() time.Time
}

// Observer receives a Bucket's events, for metrics. Every field is optional.
// The functions are called from many goroutines and must be safe for that.
type Observer struct {
	// Waited is called after each successful Wait with the time it
	// blocked.
	Waited func(d time.Duration)
	// Took is called after each store answer with the bucket's tokens,
	// effective rate and burst.
	Took func(remaining, rate float64, burst int)
	// ModeChanged is called once per transition, just after Mode reports
	// the new mode. err is the store error that caused a fallback, or nil
	// on recovery.
	ModeChanged func(from, to Mode, err error)
	// StoreError is called for every failed store call.
	StoreError func(err error)
}

// Bucket is one replica's handle on a shared token bucket. It implements
// Limiter on top of a Store, and adds the store-failure policy, heartbeats
// and token leasing.
//
// A Bucket is safe for concurrent use. Call Close when done to stop its
// background goroutines and give back leased tokens.
type Bucket struct {
	store Store
	opts  Options
	log   *slog.Logger

	mode      atomic.Pointer[Mode]
	mu        sync.Mutex // guards fallback, recovered and transitions
	fallback  *Memory
	recovered chan struct{}

	lastRate  atomic.Uint64 // math.Float64bits of the last effective rate
	lastBurst atomic.Int64
	replicas  atomic.Int64
	waiting   atomic.Int64  // Wait calls in this process past the lease
	lastDebt  atomic.Uint64 // math.Float64bits of the tokens last seen reserved ahead
	// countKnown is set once the replica count is known: at once for a
	// store that does not track replicas, else after the first heartbeat.
	// Leasing waits for it, so that a batch is never sized for one replica
	// when there are many.
	countKnown  atomic.Bool
	recoveredAt atomic.Int64 // unix nanoseconds of the last switch back to ModeShared

	lease leasePool

	// changes is closed, and replaced, when the store announces a change;
	// callers sleeping on a reservation then take it again.
	changes atomic.Pointer[chan struct{}]

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

var replicaSeq atomic.Int64

// New returns a Bucket on store. It makes no store call itself; heartbeats
// start in the background.
func New(store Store, opts Options) (*Bucket, error) {
	if store == nil {
		return nil, &ParamError{Param: "store", Msg: "must not be nil"}
	}
	if opts.MaxReserve <= 0 {
		opts.MaxReserve = time.Second
	}
	if opts.OnStoreError == "" {
		opts.OnStoreError = ModeLocal
	}
	if _, err := ParseMode(string(opts.OnStoreError)); err != nil {
		return nil, err
	}
	if opts.FallbackRate < 0 || math.IsNaN(opts.FallbackRate) || math.IsInf(opts.FallbackRate, 0) {
		return nil, &ParamError{Param: "fallback_rate", Msg: "must be a finite number >= 0", Value: opts.FallbackRate}
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 3 * time.Second
	}
	if opts.MaxPause <= 0 {
		opts.MaxPause = time.Minute
	}
	if opts.ReplicaID == "" {
		host, _ := os.Hostname()
		opts.ReplicaID = host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(replicaSeq.Add(1), 10)
	}
	if err := opts.Lease.validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	b := &Bucket{store: store, opts: opts, log: opts.Logger, done: make(chan struct{})}
	shared := ModeShared
	b.mode.Store(&shared)
	rate, burst := store.Limits()
	b.lastRate.Store(math.Float64bits(rate))
	b.lastBurst.Store(int64(burst))
	b.replicas.Store(1)
	b.lease.init(b)
	changes := make(chan struct{})
	b.changes.Store(&changes)
	if n, ok := store.(Notifier); ok {
		ctx, cancel := context.WithCancel(context.Background())
		b.wg.Add(2)
		go func() {
			defer b.wg.Done()
			n.Watch(ctx, b.changed)
		}()
		go func() {
			defer b.wg.Done()
			<-b.done
			cancel()
		}()
	}
	if rt, ok := store.(ReplicaTracker); ok {
		b.wg.Add(1)
		go b.heartbeat(rt)
	} else {
		b.countKnown.Store(true)
	}
	return b, nil
}

// NewLocal returns a Bucket on a new in-process Memory store, for a single
// replica or tests.
func NewLocal(rate float64, burst int) (*Bucket, error) {
	m, err := NewMemory(rate, burst)
	if err != nil {
		return nil, err
	}
	return New(m, Options{Lease: LeaseOptions{Disabled: true}})
}

// Mode returns how the Bucket is limiting now.
func (b *Bucket) Mode() Mode { return *b.mode.Load() }

// ReplicaID returns the name this replica uses in heartbeats.
func (b *Bucket) ReplicaID() string { return b.opts.ReplicaID }

// Replicas returns the number of live replicas seen in the last heartbeat,
// or 1 when the store does not track replicas.
func (b *Bucket) Replicas() int { return int(b.replicas.Load()) }

// Wait blocks until cost tokens are granted, ctx ends, or the Bucket is
// closed. The store either grants the tokens now, reserves them and says
// when they are due, or says when to ask again; Wait sleeps exactly that
// long. If ctx ends while a reservation is pending, the reserved tokens go
// back to the bucket. A cost above the burst fails at once with
// ErrCostExceedsBurst.
func (b *Bucket) Wait(ctx context.Context, cost int) error {
	if cost < 1 {
		return fmt.Errorf("cost %d: %w", cost, ErrInvalidCost)
	}
	if b.lease.take(cost) {
		b.observeWaited(0)
		return nil
	}
	start := b.opts.Clock()
	served, leading, err := b.lease.beginRefill(ctx, cost)
	if err != nil {
		return err
	}
	if served {
		b.observeWaited(b.opts.Clock().Sub(start))
		return nil
	}
	endRefill := func() {
		if leading {
			leading = false
			b.lease.endRefill()
		}
	}
	defer endRefill()
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	for {
		select {
		case <-b.done:
			return ErrClosed
		default:
		}
		if b.Mode() != ModeShared {
			endRefill()
			err := b.waitFallback(ctx, cost)
			if errors.Is(err, errRetryShared) {
				continue
			}
			if err == nil {
				b.observeWaited(b.opts.Clock().Sub(start))
			}
			return err
		}
		// The caller leading a refill asks for a whole lease: taken now if
		// the bucket has it, else reserved like any other request, so that
		// a saturated bucket still costs one store call per lease.
		extra := 0
		if leading {
			extra = b.lease.extra(cost)
		}
		changes := *b.changes.Load()
		res, err := b.store.Take(ctx, TakeRequest{Cost: cost + extra, MaxWait: b.horizon()})
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
			if err := sleep(ctx, b.done, changes, res.Wait); err != nil && !errors.Is(err, errChanged) {
				return err
			}
			continue
		}
		if res.Wait > 0 {
			err := sleep(ctx, b.done, changes, res.Wait)
			if errors.Is(err, errChanged) {
				// The rate or a pause changed: this reservation was
				// scheduled under the old settings, so take it again.
				b.refund(ctx, res.Tokens)
				continue
			}
			if err != nil {
				b.refund(ctx, res.Tokens)
				return err
			}
		}
		b.lease.put(res.Tokens - cost)
		b.observeWaited(b.opts.Clock().Sub(start))
		return nil
	}
}

// horizon returns the reservation horizon: MaxReserve, stretched so that
// every caller waiting on every replica fits in the queue (with a quarter to
// spare), but never beyond 10·MaxReserve. A caller turned away once sees the
// queue's depth in the answer and fits on its next call.
func (b *Bucket) horizon() time.Duration {
	rate := math.Float64frombits(b.lastRate.Load())
	if rate <= 0 {
		return b.opts.MaxReserve
	}
	// The queue is at least what the store last showed reserved ahead, and
	// about what this process has waiting times the replicas.
	queued := max(float64(b.waiting.Load()*max(1, b.replicas.Load())), math.Float64frombits(b.lastDebt.Load()))
	fit := time.Duration(1.25 * queued / rate * float64(time.Second))
	return min(max(b.opts.MaxReserve, fit), 10*b.opts.MaxReserve)
}

// Allow takes cost tokens if they are available now and reports whether it
// did. In ModeClosed it reports false and in ModeOpen true without asking
// the store.
func (b *Bucket) Allow(ctx context.Context, cost int) (bool, error) {
	if cost < 1 {
		return false, fmt.Errorf("cost %d: %w", cost, ErrInvalidCost)
	}
	if b.lease.take(cost) {
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
				res, err := fb.Take(ctx, TakeRequest{Cost: min(cost, fb.burst)})
				return res.Granted, err
			}
			continue
		}
		res, err := b.store.Take(ctx, TakeRequest{Cost: cost})
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
	st := State{Mode: mode, ConfiguredRate: rate, ConfiguredBurst: burst, Replicas: b.Replicas()}
	if fb := b.fallbackBucket(); fb != nil {
		local, _ := fb.Status(ctx)
		st.Tokens, st.Rate, st.Burst, st.PausedFor = local.Tokens, local.Rate, local.Burst, local.PausedFor
	}
	return st, nil
}

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
		err := b.store.Pause(ctx, d)
		if err == nil || ctx.Err() != nil {
			return err
		}
		b.storeFailed(err)
	}
	if fb := b.fallbackBucket(); fb != nil {
		return fb.Pause(ctx, d)
	}
	return nil
}

// Close stops the background goroutines, gives back leased tokens and
// removes this replica from the heartbeat set. Wait calls in progress return
// ErrClosed. Close is safe to call more than once.
func (b *Bucket) Close() error {
	var err error
	b.closeOnce.Do(func() {
		close(b.done)
		b.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if n := b.lease.drain(); n > 0 && b.Mode() == ModeShared {
			err = b.store.Refund(ctx, n)
		}
		if rt, ok := b.store.(ReplicaTracker); ok && b.Mode() == ModeShared {
			err = errors.Join(err, rt.Leave(ctx, b.opts.ReplicaID))
		}
	})
	return err
}

var errRetryShared = errors.New("store recovered")

// waitFallback waits under the store-failure policy. It returns
// errRetryShared when the store came back before tokens were granted.
func (b *Bucket) waitFallback(ctx context.Context, cost int) error {
	switch b.Mode() {
	case ModeOpen:
		return nil
	case ModeClosed:
		b.mu.Lock()
		recovered := b.recovered
		b.mu.Unlock()
		if recovered == nil {
			return errRetryShared
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.done:
			return ErrClosed
		case <-recovered:
			return errRetryShared
		}
	}
	fb := b.fallbackBucket()
	if fb == nil {
		return errRetryShared
	}
	// A cost above the local share's burst is taken in chunks, each
	// reserved in turn, so that it costs the right time without being
	// impossible.
	for left := cost; left > 0; {
		n := min(left, fb.burst)
		res, err := fb.Take(ctx, TakeRequest{Cost: n, MaxWait: math.MaxInt64})
		if err != nil {
			return err
		}
		if err := sleep(ctx, b.done, nil, res.Wait); err != nil {
			fb.Refund(ctx, n)
			return err
		}
		left -= n
	}
	return nil
}

func (b *Bucket) fallbackBucket() *Memory {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fallback
}

// storeFailed switches to the store-failure policy, once, and starts the
// probe that switches back.
func (b *Bucket) storeFailed(err error) {
	if o := b.opts.Observer; o != nil && o.StoreError != nil {
		o.StoreError(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Mode() != ModeShared {
		return
	}
	select {
	case <-b.done:
		return
	default:
	}
	to := b.opts.OnStoreError
	if to == ModeLocal {
		replicas := max(1, b.replicas.Load())
		rate := b.opts.FallbackRate
		if rate == 0 {
			rate = math.Float64frombits(b.lastRate.Load()) / float64(replicas)
		}
		burst := max(1, int(math.Ceil(float64(b.lastBurst.Load())/float64(replicas))))
		fb, ferr := newEmptyMemory(rate, burst)
		if ferr != nil {
			to = ModeClosed
		} else {
			b.fallback = fb
		}
		b.log.Warn("bucket store failed, limiting locally", "mode", to, "local_rate", rate, "replicas", replicas, "error", err)
	} else {
		b.log.Warn("bucket store failed", "mode", to, "error", err)
	}
	b.recovered = make(chan struct{})
	b.mode.Store(&to)
	if o := b.opts.Observer; o != nil && o.ModeChanged != nil {
		o.ModeChanged(ModeShared, to, err)
	}
	b.wg.Add(1)
	go b.probe()
}

// probe asks the store every ProbeInterval whether it is back, and switches
// to ModeShared when it is.
func (b *Bucket) probe() {
	defer b.wg.Done()
	t := time.NewTicker(b.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.ProbeInterval)
		st, err := b.store.Status(ctx)
		cancel()
		if err != nil {
			continue
		}
		b.recoveredAt.Store(time.Now().UnixNano())
		b.observeState(st)
		b.mu.Lock()
		from := b.Mode()
		shared := ModeShared
		b.mode.Store(&shared)
		b.fallback = nil
		close(b.recovered)
		b.recovered = nil
		b.mu.Unlock()
		b.log.Info("bucket store is back, sharing the bucket again", "previous_mode", from)
		if o := b.opts.Observer; o != nil && o.ModeChanged != nil {
			o.ModeChanged(from, ModeShared, nil)
		}
		return
	}
}

// heartbeat reports this replica alive every HeartbeatInterval. The second
// beat comes after at most 500 ms, so that replicas started together learn
// each other's count quickly and size their leases for it.
func (b *Bucket) heartbeat(rt ReplicaTracker) {
	defer b.wg.Done()
	ttl := 3 * b.opts.HeartbeatInterval
	t := time.NewTimer(min(b.opts.HeartbeatInterval, 500*time.Millisecond))
	defer t.Stop()
	for {
		if b.Mode() == ModeShared {
			ctx, cancel := context.WithTimeout(context.Background(), b.opts.HeartbeatInterval)
			n, err := rt.Heartbeat(ctx, b.opts.ReplicaID, ttl)
			cancel()
			if err == nil && n > 0 {
				b.setReplicas(n)
			}
		}
		select {
		case <-b.done:
			return
		case <-t.C:
			t.Reset(b.opts.HeartbeatInterval)
		}
	}
}

// setReplicas records the live replica count. For three heartbeat
// intervals after the store came back it only lets the count grow: a Redis
// restarted without persistence has lost the heartbeats, and a count of 1
// then would size a second fallback at the whole rate on every replica.
func (b *Bucket) setReplicas(n int) {
	defer b.countKnown.Store(true)
	if int64(n) < b.replicas.Load() &&
		time.Since(time.Unix(0, b.recoveredAt.Load())) < 3*b.opts.HeartbeatInterval {
		return
	}
	b.replicas.Store(int64(n))
}

func (b *Bucket) refund(ctx context.Context, tokens int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ProbeInterval)
	defer cancel()
	if err := b.store.Refund(ctx, tokens); err != nil {
		b.log.Debug("refunding a cancelled reservation failed", "tokens", tokens, "error", err)
	}
}

func (b *Bucket) observeTake(res TakeResult) {
	b.lastDebt.Store(math.Float64bits(max(0, -res.Remaining)))
	if res.Rate > 0 { // a paused bucket reports 0: keep the rate to fall back to
		b.lastRate.Store(math.Float64bits(res.Rate))
	}
	b.lastBurst.Store(int64(res.Burst))
	if o := b.opts.Observer; o != nil && o.Took != nil {
		o.Took(res.Remaining, res.Rate, res.Burst)
	}
}

func (b *Bucket) observeState(st State) {
	if st.Replicas > 0 {
		b.setReplicas(st.Replicas)
	}
	if o := b.opts.Observer; o != nil && o.Took != nil {
		o.Took(st.Tokens, st.Rate, st.Burst)
	}
}

func (b *Bucket) observeWaited(d time.Duration) {
	if o := b.opts.Observer; o != nil && o.Waited != nil {
		o.Waited(d)
	}
}

// changed wakes every caller sleeping on a reservation.
func (b *Bucket) changed() {
	next := make(chan struct{})
	close(*b.changes.Swap(&next))
}

var errChanged = errors.New("bucket changed")

// sleep waits for d, or until ctx or done ends, or until changes is closed
// (errChanged). A nil changes never fires.
func sleep(ctx context.Context, done, changes <-chan struct{}, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return ErrClosed
	case <-changes:
		return errChanged
	case <-t.C:
		return nil
	}
}
