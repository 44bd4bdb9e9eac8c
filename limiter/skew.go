package limiter

import (
	"math"
	"sync"
	"time"
)

// skewMeter estimates where an instant of the store's clock falls on the
// Bucket's, from the shared bucket's answers: each answer carries the
// store's clock when it ran (TakeResult.At) and arrives at some local
// instant; their difference is the clocks' offset plus the time the answer
// took to come back. The least difference seen over the last one to two
// skewWindow is the offset plus the quickest return, so that a reservation
// timed from it wakes at its slot, where timing it from a slow answer's
// arrival would wake it as late as that answer was slow. The windows
// follow a drift of either clock. Safe for concurrent use.
type skewMeter struct {
	mu        sync.Mutex
	start     time.Time     // of the current window
	cur, prev time.Duration // least difference in each window
	have      int           // windows with a sample: 0, 1 or 2
	// curLo and prevLo are, in each window, the greatest difference
	// between a request's sending (local) and the store's clock when it
	// ran: the offset less the time the request took to get there, a
	// lower bound of the offset; loHave reports samples in them.
	curLo, prevLo time.Duration
	loHave        [2]bool
}

const skewWindow = 10 * time.Second

// timerSlack is how late past its slot a wake-up still counts as on time
// (lateFits).
const timerSlack = time.Millisecond

// observe records an answer that ran at store (the store's clock) and
// arrived at local.
func (m *skewMeter) observe(local, store time.Time) { m.observeTrip(time.Time{}, local, store) }

// rollLocked starts a new window at local when the current one is over.
func (m *skewMeter) rollLocked(local time.Time) {
	if m.have == 0 || local.Sub(m.start) < skewWindow {
		return
	}
	m.prev, m.prevLo, m.loHave[1] = m.cur, m.curLo, m.loHave[0]
	m.start, m.have, m.loHave[0] = local, 2, false
	m.cur = time.Duration(math.MaxInt64)
}

// observeTrip records an answer that ran at store (the store's clock),
// asked at sent (zero when unknown) and arrived at local.
func (m *skewMeter) observeTrip(sent, local, store time.Time) {
	if store.IsZero() {
		return
	}
	d := local.Sub(store)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rollLocked(local)
	if m.have == 0 {
		m.start, m.cur, m.prev, m.have = local, d, d, 1
	} else {
		m.cur = min(m.cur, d)
	}
	if sent.IsZero() {
		return
	}
	if lo := sent.Sub(store); !m.loHave[0] || lo > m.curLo {
		m.curLo, m.loHave[0] = lo, true
	}
}

// spread returns how much later than the offset get's estimate may place
// the store's instants: the estimate less the greatest lower bound of the
// offset seen (0 before a request's sending was recorded). A wake-up
// measured late against get may be up to spread later still against the
// store's clock.
func (m *skewMeter) spread() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.spreadLocked()
}

// estimate returns get's estimate and spread together, under one lock.
func (m *skewMeter) estimate() (skew, spread time.Duration, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.have == 0 {
		return 0, 0, false
	}
	return min(m.cur, m.prev), m.spreadLocked(), true
}

// spreadLocked is spread; m.mu must be held.
func (m *skewMeter) spreadLocked() time.Duration {
	if m.have == 0 || !m.loHave[0] && !m.loHave[1] {
		return 0
	}
	lo := m.curLo
	switch {
	case !m.loHave[0]:
		lo = m.prevLo
	case m.loHave[1]:
		lo = max(lo, m.prevLo)
	}
	return max(0, min(m.cur, m.prev)-lo)
}

// get returns the estimated offset: a store instant t is local t+skew.
func (m *skewMeter) get() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.have == 0 {
		return 0, false
	}
	return min(m.cur, m.prev), true
}

// recent is get for an estimate that answers seen within the last two
// skewWindow made: false when the store has not answered for longer (its
// clock or the Bucket's may have moved since).
func (m *skewMeter) recent(local time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.have == 0 || local.Sub(m.start) >= 2*skewWindow {
		return 0, false
	}
	return min(m.cur, m.prev), true
}

// lateFits reports whether tokens reserved on the shared bucket may still
// go out when the caller wakes late past their due instant (an answer that
// came back after its slot, or a wake-up the scheduler delayed), and if
// not, how many of them to give back before asking again.
//
// The store decided every slot so that the bucket, refilled at rate and
// capped at burst, never went below empty: any window of W holds at most
// rate·W + burst tokens. Tokens that go out late past their slot are as if
// taken late, the bucket holding them meanwhile; that stays within the
// bound while the bucket with them could not exceed its burst. At its slot
// a reservation leaves the bucket empty of spare tokens, and it refills by
// rate·late at most since, so tokens + rate·late ≤ burst keeps every
// window within the bound. A caller later than that must not go out with
// the slots after its own, which the store gave to others (up to a
// second's worth after a start-up whose answers took a second): it asks
// again. Of its tokens the bucket could have held only burst − rate·late
// before refilling past its burst; only those go back, so that the bucket
// never counts the refill it lost to its cap twice. A grant for now leaves
// the bucket with spare tokens (TakeResult.Remaining): its tokens fit while
// spare + tokens + rate·late ≤ burst, and a full bucket's grant that came
// back late goes out only within the slack; spare is 0 for a reservation.
// rate is the bucket's refill rate; at 0 (paused) nothing refills and late
// tokens fit. A wake-up up to timerSlack late is on time: timers fire
// after their instant, and the store's answers are in microseconds.
func lateFits(late time.Duration, tokens int, spare, rate float64, burst int) (fits bool, refund int) {
	late -= timerSlack
	if late <= 0 || rate <= 0 {
		return true, 0
	}
	room := float64(burst) - max(0, spare) - rate*late.Seconds()
	if float64(tokens) <= room {
		return true, 0
	}
	return false, max(0, int(room))
}

// spendWindow returns how much longer tokens granted as lateFits judges
// them may still go out: until the bucket, holding them, would refill past
// its burst (late is how late they are now past their grant or slot, spare
// what the grant left in the bucket; see lateFits). It is negative when
// that is already past, and a year at a rate of 0 (nothing refills). A
// lease's batch goes out within it: every window then holds at most
// rate·W + burst, whenever in it each token goes out.
func spendWindow(late time.Duration, tokens int, spare, rate float64, burst int) time.Duration {
	if rate <= 0 {
		return 365 * 24 * time.Hour
	}
	room := float64(burst) - max(0, spare) - float64(tokens)
	return time.Duration(room/rate*float64(time.Second)) - (late - timerSlack)
}
