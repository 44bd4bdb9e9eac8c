package limiter

import (
	"context"
	"sync/atomic"
	"time"
)

// maxPaidAsk caps how long before a paid slot's Due a request asks the
// store (waitPaid): the shared bucket's token it takes then is held that
// long at most before it goes out.
const maxPaidAsk = 100 * time.Millisecond

// maxPaidAhead is how far ahead of its slot a request on a paid slot is
// waited for (waitPaid, paidAhead). One further ahead is decided at once,
// as it comes: its caller is to bring it back at its slot, as the backends
// do, within a few hundred ms.
const maxPaidAhead = time.Second

// waitPaid waits, for a request that comes back on slots it paid for
// (Request.Paid) ahead of them, until one recent round trip of the store
// (tripMeter) before the latest slot's Due, placed on the Bucket's clock
// by the skew estimate; it returns at once when the slots are due sooner
// or more than maxPaidAhead later, or when the store's clock is not known
// yet. A backend hands such a message on a little ahead of its slot (a
// delay queue's return is late by tens of ms under load), so that the
// store's answer is not late for the slot: one answered past the slot's
// lateness (backend.PaidLateness, 25 ms at 5/s) pays its layers for the
// move or, with the key's next slot booked a spacing after it, loses its
// slot and is set aside again. Asking the store right away instead would
// take the shared bucket's token early, and hold it until the slot. The request then goes out at the slot, not
// before: paidAhead for a grant, sleepReserved for a reservation.
func (b *Bucket) waitPaid(ctx context.Context, paid []PaidSlot) error {
	if len(paid) == 0 {
		return nil
	}
	skew, ok := b.skew.get()
	if !ok {
		return nil
	}
	due := latestDue(paid)
	ahead := due.Add(skew).Sub(b.clock.Now())
	if ahead > maxPaidAhead {
		return nil
	}
	return b.sleep(ctx, nil, ahead-b.trips.estimate())
}

// latestDue returns the latest Due of paid, the zero time for none.
func latestDue(paid []PaidSlot) time.Time {
	var due time.Time
	for _, s := range paid {
		if s.Due.After(due) {
			due = s.Due
		}
	}
	return due
}

// paidForfeit counts as forfeit (Stats.PaidForfeit, Observer.PaidForfeit)
// the slots of paid on layer, or all of them when layer is "": a slot
// that named the layer that refused its message was not honoured (back
// later than its lateness, or a booking the store no longer holds), and a
// message decided again after a move past its lateness lost every slot it
// came with. Each costs its key a spacing and its message one more
// set-aside.
func (b *Bucket) paidForfeit(paid []PaidSlot, layer string) {
	for _, s := range paid {
		if layer != "" && s.Layer != layer {
			continue
		}
		b.layered.paid.forfeit.Add(1)
		if o := b.opts.Observer; o != nil && o.PaidForfeit != nil {
			o.PaidForfeit(s.Layer)
		}
	}
}

// paidAhead returns how long from now, on the Bucket's clock, until the
// latest Due of the paid slots, for an answer the store ran at at: 0 when
// they are due by then or more than maxPaidAhead later, or without paid
// slots.
func (b *Bucket) paidAhead(paid []PaidSlot, at time.Time) time.Duration {
	due := latestDue(paid)
	if !due.After(at) {
		return 0
	}
	skew, ok := b.skew.get()
	if !ok {
		return 0
	}
	if ahead := due.Add(skew).Sub(b.clock.Now()); ahead <= maxPaidAhead {
		return ahead
	}
	return 0
}

// tripMeter keeps the last tripSamples round trips of the store's layered
// calls; its estimate is the longest of them, at most maxPaidAsk. observe,
// on every layered call, takes no lock. Safe for concurrent use.
type tripMeter struct {
	last [tripSamples]atomic.Int64 // time.Duration
	next atomic.Uint64
}

const tripSamples = 16

func (m *tripMeter) observe(d time.Duration) {
	m.last[(m.next.Add(1)-1)%tripSamples].Store(int64(max(d, 0)))
}

func (m *tripMeter) estimate() time.Duration {
	var longest time.Duration
	for i := range m.last {
		longest = max(longest, time.Duration(m.last[i].Load()))
	}
	return min(longest, maxPaidAsk)
}
