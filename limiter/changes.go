package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// A change announced by the store (a rate override, a fill, a reset, a
// pause) ends the current generation. Callers sleeping on a reservation
// then move it to where the new settings put it, keeping its place in the
// queue: a reservation is a position in the bucket's queue, the number of
// tokens that must refill before it is due, and the store's counter keeps
// that position whatever the rate. So the new due instant is the refill
// start (now, or the end of a pause) plus the position at the new rate.
// One store read per generation, shared by every sleeper, gives the new
// rate, pause and time.
//
// Giving the tokens back and taking them again instead, as an earlier
// version did, puts every sleeper at the end of the queue at once: on a
// rate cut they stall, then come due together, above the new rate.

// generation is one period of unchanged bucket settings.
type generation struct {
	// changed is closed when the store announces a change.
	changed chan struct{}
	// once reads the bucket after the change that started this
	// generation; st, err and local are its result, local being the
	// Bucket's clock when the answer came.
	once  sync.Once
	st    State
	err   error
	local time.Time
}

func newGeneration() *generation { return &generation{changed: make(chan struct{})} }

// changed starts a new generation, waking every caller sleeping on the old
// one, and gives back the tokens this replica leased under the old
// settings. In fallback it makes the probe ask the store at once.
func (b *Bucket) changed() {
	gen := newGeneration()
	old := b.gen.Swap(gen)
	close(old.changed)
	if o := b.opts.Observer; o != nil && o.Paused != nil && b.Mode() == ModeShared {
		// Read what changed (the read serves the sleepers too) and
		// report a pause that another replica set.
		st, _, err := b.settings(context.Background(), gen)
		if end := st.At.Add(st.PausedFor).UnixMicro(); err == nil && st.PausedFor > 0 && st.PausedBy != b.opts.ReplicaID &&
			b.heardPauseEnd.Swap(end) != end { // once per pause, not per announcement
			o.Paused(st.PausedFor, st.PausedBy)
		}
	}
	if b.Mode() != ModeShared {
		select { // the store is back for someone: probe now
		case b.fb.probeNow <- struct{}{}:
		default:
		}
	}
	if n := b.lease.drain(); n > 0 && b.Mode() == ModeShared {
		b.refund(context.Background(), n)
	}
}

// settings reads the bucket once for generation g.
func (b *Bucket) settings(ctx context.Context, g *generation) (State, time.Time, error) {
	g.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ProbeInterval)
		defer cancel()
		g.st, g.err = b.store.Status(ctx)
		g.local = b.clock.Now()
		if g.err == nil && g.st.At.IsZero() {
			g.err = errors.New("the store's status does not say its time")
		}
		if g.err == nil {
			b.observeState(g.st)
		}
	})
	return g.st, g.local, g.err
}

// reservation is tokens granted ahead, as the store scheduled them.
type reservation struct {
	due  time.Time // on the store's clock
	pos  float64   // tokens that refill before it is due, its own included
	rate float64   // the effective rate it was scheduled at; 0 while paused
}

// sleepReserved sleeps until the reservation res, made in generation gen,
// is due, moving it each time the bucket changes. It returns nil when the
// tokens are due, or the error that ended the wait (the caller refunds).
func (b *Bucket) sleepReserved(ctx context.Context, gen *generation, res TakeResult) error {
	r := reservation{due: res.At.Add(res.Wait), pos: max(0, -res.Remaining), rate: res.Rate}
	// storeAt on the store's clock was localAt on the Bucket's.
	storeAt, localAt := res.At, b.clock.Now()
	wait := res.Wait
	for {
		err := b.sleep(ctx, gen.changed, wait)
		if !errors.Is(err, errChanged) {
			return err
		}
		gen = b.gen.Load()
		if st, local, err := b.settings(ctx, gen); err == nil {
			r = r.retime(st)
			storeAt, localAt = st.At, local
		}
		// Else the store cannot say what changed: the reservation keeps
		// its slot, which still stands in the store's queue.
		wait = r.due.Sub(storeAt) - b.clock.Now().Sub(localAt)
	}
}

// retime returns r moved to where the bucket st puts it.
func (r reservation) retime(st State) reservation {
	now := st.At
	pos := r.pos
	if r.rate > 0 { // part of the position has refilled since
		pos = min(pos, max(0, r.due.Sub(now).Seconds()*r.rate))
	}
	rate := baseRate(st)
	start := now.Add(st.PausedFor)
	due := start
	if rate > 0 && pos > 0 {
		due = start.Add(time.Duration(math.Min(pos/rate, 1e6) * float64(time.Second)))
	}
	eff := rate
	if st.PausedFor > 0 {
		eff = 0
	}
	return reservation{due: due, pos: pos, rate: eff}
}

// baseRate returns the rate st refills at apart from a pause.
func baseRate(st State) float64 {
	switch {
	case st.Rate > 0:
		return st.Rate
	case st.BaseRate > 0: // paused: the adaptive rate, else override or configured
		return st.BaseRate
	case st.Override != nil:
		return st.Override.Rate
	}
	return st.ConfiguredRate
}
