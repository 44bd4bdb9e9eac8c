package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
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
//
// A push (see Push) is not a change: a take of a higher class moved the
// reservations of a lower class back by some tokens. The store says by how
// much, so a push needs no store read, ends no generation and leaves the
// lease alone. It wakes only the callers sleeping on a reservation of the
// pushed class (pushHub), and each moves its own reservation back.

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
	// heard is how many pushes of each class the Bucket had heard just
	// before the read: st counts them all.
	heard [NumPriorities]uint64
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
		g.heard = b.pushes.heard()
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
	pos  float64   // tokens that refill from at before it is due, its own included
	at   time.Time // the store's instant pos is counted from
	rate float64   // the effective rate it was scheduled at; 0 while paused
	base float64   // the rate apart from a pause, which converts tokens to time
	// class is the class whose queue holds it (TakeResult.Class), and
	// pushed the class's push counter it has been moved for.
	class  Priority
	pushed float64
}

// sleepReserved sleeps until the reservation res, made in generation gen
// after pushes had heard the pushes counted in heard, is due; resume is the
// rate its bucket refills at after a pause. It moves the reservation each
// time the bucket changes and each time a push of its class moves it back.
// It returns nil when the tokens are due, or the error that ended the wait
// (the caller refunds). The local bucket's reservations have no generation
// (gen is nil): its settings do not change under them. A change never
// moves it before res.At+notBefore: a layered reservation charged its
// layers for the instant it was first due, and going out before they all
// had room (LayerResult.LayersDue) could put it closer to its key's
// previous message than a layer allows. When a push or a change moves it
// more than late.after past the instant its layers were last charged for,
// or it wakes up that late, sleepReserved calls late.pay with how much
// later (when late is not nil):
// going out later could put it closer to its key's next message, charged
// for an instant after this one's, so the layers are charged for the move.
func (b *Bucket) sleepReserved(ctx context.Context, gen *generation, pushes *pushHub, heard [NumPriorities]uint64, res backend.TakeResult, resume float64, notBefore time.Duration, late *lateness) error {
	_, err := b.sleepUntilDue(ctx, gen, pushes, heard, res, resume, notBefore, late)
	return err
}

// sleepUntilDue is sleepReserved that also reports, when the tokens are
// due, how long after their due instant it returned: the due instant on
// the store's clock placed on the Bucket's by the least skew (skewMeter),
// so that an answer that arrived after its slot, or a wake-up the
// scheduler delayed, shows as late (see lateFits).
func (b *Bucket) sleepUntilDue(ctx context.Context, gen *generation, pushes *pushHub, heard [NumPriorities]uint64, res backend.TakeResult, resume float64, notBefore time.Duration, late *lateness) (time.Duration, error) {
	base := res.Rate
	if base <= 0 { // paused
		base = resume
	}
	// Its position is the tokens reserved ahead of it, its own included:
	// -Remaining, less the reservations of lower classes behind it, which
	// Wait tells apart (at most Wait·rate tokens refill before it is due).
	pos := max(0, -res.Remaining)
	if base > 0 {
		pos = min(pos, res.Wait.Seconds()*base)
	}
	r := reservation{due: res.At.Add(res.Wait), pos: pos, at: res.At, rate: res.Rate, base: base,
		class: res.Class, pushed: res.Pushed}
	// storeAt on the store's clock was localAt on the Bucket's: the answer
	// arrived at localAt. For the shared bucket's answers (gen set), the
	// skew between the clocks is known better, from the quickest answers
	// (skewMeter): a reservation then wakes at its slot, not as late as
	// this answer was slow to arrive.
	storeAt, localAt := res.At, b.clock.Now()
	if skew, ok := b.skew.get(); ok && gen != nil && !storeAt.IsZero() && storeAt.Add(skew).Before(localAt) {
		localAt = storeAt.Add(skew)
	}
	// next is the first push of r's class this reservation has not seen;
	// a class that is never pushed (the highest) is not listened to.
	var next uint64
	listen := pushes != nil && r.class < NumPriorities && backend.Rank(r.class) > 0
	if listen {
		next = heard[r.class]
	}
	charged := r.due // the instant the layers were charged for
	for {
		var pushed <-chan struct{}
		if listen {
			var ps []backend.Push
			ps, next, pushed = pushes.since(r.class, next)
			for _, p := range ps {
				r = r.push(p)
			}
		}
		if late != nil && late.owes(charged, r.due) {
			if moved, err := late.payTo(charged, r.due); err == nil && !moved {
				return 0, errMovedLate
			}
			charged = r.due
		}
		var changed <-chan struct{}
		if gen != nil {
			changed = gen.changed
		}
		wait := r.due.Sub(storeAt) - b.clock.Now().Sub(localAt)
		err := b.sleepOn(ctx, changed, pushed, wait)
		if errors.Is(err, errPushed) {
			continue
		}
		if !errors.Is(err, errChanged) {
			if err != nil {
				return 0, err
			}
			lateBy := b.clock.Now().Sub(localAt) - r.due.Sub(storeAt)
			// A wake-up the scheduler delayed moves it back as a push
			// does: it goes out at r.due+lateBy, perhaps next to its
			// key's next message, charged for an instant after this
			// one's. Late against the store's clock, at worst: the
			// skew's estimate may place the slot later than it was
			// (a Bucket whose first answers were all slow wakes every
			// reservation that much late).
			if late != nil {
				// The instant it goes out, on the store's clock at worst,
				// as long as paying for the move takes.
				out := func() time.Time {
					return storeAt.Add(b.clock.Now().Sub(localAt) + b.skew.spread())
				}
				if !late.keeps(b.clock, charged, out) {
					return 0, errMovedLate
				}
				lateBy = b.clock.Now().Sub(localAt) - r.due.Sub(storeAt)
			}
			return lateBy, nil
		}
		gen = b.gen.Load()
		if st, local, err := b.settings(ctx, gen); err == nil {
			if listen {
				r = r.catchUp(st)
				// The pushes heard before the read are in st.
				next = max(next, gen.heard[r.class])
			}
			r = r.retime(st)
			if floor := res.At.Add(notBefore); r.due.Before(floor) {
				r.due = floor
			}
			storeAt, localAt = st.At, local
			if skew, ok := b.skew.get(); ok && storeAt.Add(skew).Before(localAt) {
				localAt = storeAt.Add(skew)
			}
		}
		// Else the store cannot say what changed: the reservation keeps
		// its slot, which still stands in the store's queue.
	}
}

// lateness is how a layered reservation that moves back pays its layers
// (see sleepReserved): pay is called with the instant it was charged for
// and how much later it goes out now, once that is more than after; it
// reports false when the layers cannot keep the reservation apart from a
// message charged after it, and the sleep ends with errMovedLate. An error
// (the store failing) lets the reservation go out as it is.
//
// A layer the request passed on a slot it paid for (a delay layer's
// booking) was charged for paidFrom, and takes going out up to paidUntil
// (the slot's Due plus its lateness, backend.PaidLateness; the earliest of
// such layers) as the slot's own lateness: pay leaves it out (withPaid
// false) until the reservation goes out past paidUntil, and then moves it
// too, from paidFrom. Counted from the Due, not from paidFrom: the key's
// next slot was booked a spacing after the Due, and a message taken a
// little late on its slot and then moved as much again went out twice the
// lateness after its slot, 1.6 s before the next one against 2 s.
type lateness struct {
	after     time.Duration
	pay       func(from time.Time, by time.Duration, withPaid bool) (bool, error)
	paidUntil time.Time
	paidFrom  time.Time
	paidMoved bool // the paid layers were moved: every payment moves them
}

// owes reports whether a reservation charged for the instant charged must
// pay its layers to go out at to.
func (l *lateness) owes(charged, to time.Time) bool {
	return l.after > 0 && to.Sub(charged) > l.after || l.paidLate(to)
}

// paidLate reports whether going out at to is past the paid layers'
// lateness while they are still where the take left them.
func (l *lateness) paidLate(to time.Time) bool {
	return !l.paidUntil.IsZero() && !l.paidMoved && to.After(l.paidUntil)
}

// payTo pays the layers of a reservation charged for the instant charged
// for going out at to (see pay).
func (l *lateness) payTo(charged, to time.Time) (bool, error) {
	from, withPaid := charged, l.paidMoved
	if l.paidLate(to) {
		// Over-charges the other layers for what an earlier payment
		// covered since paidFrom, at most their cost: safe.
		from, withPaid = l.paidFrom, true
	}
	moved, err := l.pay(from, to.Sub(from), withPaid)
	if err == nil && moved && withPaid {
		l.paidMoved = true
	}
	return moved, err
}

// payTries is how many payments keeps makes for one late send before the
// request is decided again: each pays for the time the one before took.
const payTries = 4

// keeps reports whether a reservation whose layers were charged for the
// instant charged may go out now; out tells, each time it is called, the
// instant it would go out at (the store's clock, at worst). Once it owes
// its layers for the move (owes), they are charged for it (payTo). A
// payment takes a store call, and the reservation goes out only when it is
// answered: so each payment also covers as long as the one before took,
// and one answered too late for what it paid is followed by another for
// the rest, up to payTries. A payment that could not be made (pay's error)
// lets the reservation go out.
func (l *lateness) keeps(clock backend.Clock, charged time.Time, out func() time.Time) bool {
	var took time.Duration
	for range payTries {
		to := out()
		if !l.owes(charged, to) {
			return true
		}
		to = to.Add(took)
		start := clock.Now()
		moved, err := l.payTo(charged, to)
		if err != nil {
			return true
		}
		if !moved {
			return false
		}
		charged, took = to, clock.Now().Sub(start)
	}
	return !l.owes(charged, out())
}

// errMovedLate is sleepReserved's answer for a reservation whose layers
// could not pay for moving back (see lateness).
var errMovedLate = errors.New("reservation moved back past its paid slot")

// retime returns r moved to where the bucket st puts it. Its position is
// counted at the change (st.Changed, when the store says and r was made
// before it): the tokens refilled until then at r's old rate, the rest at
// the new one from then, or from the end of a pause. Counting it at the
// instant this replica read st instead would credit the time between the
// change and the read at the old rate, so that two replicas reading at
// different instants would put their reservations out of the store's
// order, into pairs after a rate cut.
func (r reservation) retime(st State) reservation {
	now := st.At
	ref := now
	// A change made before r was (the store already scheduled r at the
	// new settings), or not recorded (an older binary's), counts from the
	// read, as before.
	if c := st.Changed; !c.IsZero() && c.Before(now) && !c.Before(r.at) {
		ref = c
	}
	pos := r.pos
	if r.rate > 0 { // part of the position has refilled since
		pos = min(pos, max(0, r.due.Sub(ref).Seconds()*r.rate))
	}
	rate := baseRate(st)
	start := ref
	if st.PausedFor > 0 {
		start = now.Add(st.PausedFor)
	}
	due := start
	if rate > 0 && pos > 0 {
		due = start.Add(seconds(pos / rate))
	}
	eff := rate
	if st.PausedFor > 0 {
		eff = 0
	}
	r.due, r.pos, r.at, r.rate, r.base = due, pos, ref, eff, rate
	return r
}

// push returns r moved back by the push p of its class: by p.Tokens when p
// is one it has not seen and it was not due yet when p was made, and by
// the tokens of the pushes it missed before p (their counters tell how
// many, not when: it is moved back by them all, which is conservative).
func (r reservation) push(p backend.Push) reservation {
	if p.Class != r.class || p.Counter <= r.pushed {
		return r
	}
	missed := max(0, p.Counter-p.Tokens-r.pushed)
	back := missed
	if p.At.Before(r.due) {
		back = p.Counter - r.pushed // p's tokens that are new to r, and the missed ones
	}
	r.pushed = p.Counter
	return r.back(back)
}

// catchUp returns r moved back by the pushes of its class that st counts
// and r has not seen, as when the Bucket resubscribed and may have missed
// some: all of them, which is conservative. A counter below r's means the
// bucket was reset: there is nothing to catch up.
func (r reservation) catchUp(st State) reservation {
	c := st.Pushed[r.class]
	if c > r.pushed {
		r = r.back(c - r.pushed)
	}
	r.pushed = c
	return r
}

// back returns r moved back by tokens.
func (r reservation) back(tokens float64) reservation {
	if !(tokens > 0) {
		return r
	}
	r.pos += tokens
	if r.base > 0 {
		r.due = r.due.Add(seconds(tokens / r.base))
	}
	return r
}

// seconds converts s seconds, at most 1e6, to a Duration.
func seconds(s float64) time.Duration {
	return time.Duration(math.Min(s, 1e6) * float64(time.Second))
}

// pushRing is how many recent pushes of each class a Bucket keeps for its
// sleepers. A sleeper that falls further behind is moved back by the
// missed pushes all together (see reservation.push).
const pushRing = 32

// pushHub hands the store's pushes to the callers sleeping on reservations
// of the pushed class: each class has a ring of its recent pushes and a
// channel closed and replaced at each push, so that a push wakes only the
// sleepers of its class.
type pushHub struct {
	mu      sync.Mutex
	classes [NumPriorities]pushLog
}

// pushLog is one class's recent pushes.
type pushLog struct {
	// n counts the pushes heard; written under pushHub.mu.
	n    atomic.Uint64
	ring [pushRing]backend.Push // push i is at ring[i%pushRing]
	wake chan struct{}
}

func (h *pushHub) init() {
	for c := range h.classes {
		h.classes[c].wake = make(chan struct{})
	}
}

// heard returns how many pushes of each class were heard so far. A caller
// reads it before its take: every push its reservation must apply comes
// after.
func (h *pushHub) heard() [NumPriorities]uint64 {
	var n [NumPriorities]uint64
	for c := range n {
		n[c] = h.classes[c].n.Load()
	}
	return n
}

// add records the push p and wakes the sleepers of its class.
func (h *pushHub) add(p backend.Push) {
	if p.Class >= NumPriorities {
		return
	}
	h.mu.Lock()
	l := &h.classes[p.Class]
	n := l.n.Load()
	l.ring[n%pushRing] = p
	l.n.Store(n + 1)
	close(l.wake)
	l.wake = make(chan struct{})
	h.mu.Unlock()
}

// since returns the pushes of class c from the next-th on that the ring
// still holds, the number to ask from next time, and a channel closed at
// the next push.
func (h *pushHub) since(c Priority, next uint64) (ps []backend.Push, after uint64, wake <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := &h.classes[c]
	n := l.n.Load()
	if n > pushRing {
		next = max(next, n-pushRing)
	}
	for i := next; i < n; i++ {
		ps = append(ps, l.ring[i%pushRing])
	}
	return ps, n, l.wake
}

// pushed is the Bucket's handler of the store's pushes (Notifier.Watch).
// It only wakes the sleepers of the pushed class: no store read, no new
// generation, no lease given back.
func (b *Bucket) pushed(p backend.Push) { b.pushes.add(p) }

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
