package backend

import (
	"context"
	"math"
	"strconv"
	"time"
)

// Priority is a request's class. Across every replica and deployment that
// shares a bucket, a waiting request of a higher class gets tokens before
// any request of a lower class, including lower-class requests that already
// hold reservations further out: those reservations move back by the
// tokens the higher class took ahead of them (see Push). A lower class gets
// what the higher ones leave, and Options.MinShare keeps a floor under it.
//
// The zero value is PriorityNormal, so a caller that never names a class
// gets the behaviour of a bucket without classes.
type Priority uint8

// The classes. PriorityHigh is served first, then PriorityNormal, then
// PriorityLow (Priority.Rank gives that order); PriorityNormal is the zero
// value, so that a request that names no class is normal.
const (
	PriorityNormal Priority = iota
	PriorityHigh
	PriorityLow
)

// NumPriorities is the number of classes; Shares is indexed by Priority.
const NumPriorities = 3

// Rank returns the class's place in the order of service: 0 for high, 1 for
// normal, 2 for low. The stores order reservations by it.
func Rank(p Priority) int {
	switch p {
	case PriorityHigh:
		return 0
	case PriorityLow:
		return 2
	}
	return 1
}

// PriorityOfRank is the inverse of Rank.
func PriorityOfRank(rank int) Priority {
	switch rank {
	case 0:
		return PriorityHigh
	case 2:
		return PriorityLow
	}
	return PriorityNormal
}

// String returns "high", "normal" or "low".
func (p Priority) String() string {
	switch p {
	case PriorityHigh:
		return "high"
	case PriorityLow:
		return "low"
	case PriorityNormal:
		return "normal"
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

// ParsePriority parses "high", "normal" or "low". The empty string is
// PriorityNormal.
func ParsePriority(s string) (Priority, error) {
	switch s {
	case "high":
		return PriorityHigh, nil
	case "normal", "":
		return PriorityNormal, nil
	case "low":
		return PriorityLow, nil
	}
	return PriorityNormal, &ParamError{Param: "Priority", Msg: "must be high, normal or low", Value: s}
}

// Shares holds a fraction of the rate per class, indexed by Priority, such
// as Options.MinShare. The zero value is no floor for any class.
type Shares [NumPriorities]float64

// Validate returns a *ParamError naming param (such as "MinShare.low") for
// a share outside [0, 1), or for shares that add up to 1 or more, or nil.
func (s Shares) Validate(param string) error {
	sum := 0.0
	for p, v := range s {
		if !(v >= 0 && v < 1) {
			return &ParamError{Param: param + "." + Priority(p).String(), Msg: "must be a fraction >= 0 and < 1", Value: v}
		}
		sum += v
	}
	if sum >= 1 {
		return &ParamError{Param: param, Msg: "the shares must add up to less than 1", Value: sum}
	}
	return nil
}

// Push is a store's announcement that a take of a higher class moved every
// reservation of Class made before it, and not yet due at At, back by
// Tokens: Tokens/rate later. Counter is the class's push counter after the
// move: a reservation remembers the counter its take saw
// (TakeResult.Pushed) and applies each Push with a larger Counter once.
type Push struct {
	Class   Priority
	Tokens  float64
	Counter float64
	At      time.Time
}

// byRank returns the shares indexed by rank (see Priority.Rank).
func (s Shares) byRank() [NumPriorities]float64 {
	return [NumPriorities]float64{s[PriorityHigh], s[PriorityNormal], s[PriorityLow]}
}

// ClassRefunder is implemented by stores with priority classes. A Bucket
// gives back the tokens of a cancelled reservation with RefundClass, naming
// the class that holds it (TakeResult.Class), so that the store forgets it
// in that class's queue; Store.Refund gives back tokens of no class, such
// as an unused lease, and repays the front of the queue.
type ClassRefunder interface {
	// RefundClass is Store.Refund of a reservation in class's queue.
	RefundClass(ctx context.Context, tokens int, class Priority) error
}

// Priority state of a store
//
// Both stores keep the same state beside a bucket's tokens T (negative
// while reserved ahead), with the same arithmetic in the same order: the
// Memory store in prio, the Redis scripts in the state hash's fields q0 q2
// p1 p2 j1 j2 (redislimiter's lua/priority.lua). Every reservation is
// in one queue: rank 0's first, then rank 1's, then rank 2's.
//
//   - q[0], q[2] are the tokens reserved by ranks 0 and 2 and not yet
//     refilled; rank 1's, the default class's, are the rest of max(0, −T),
//     so that a bucket used by one class only keeps no more state than a
//     bucket without classes. A refill of r reserved tokens repays the
//     front of the queue first: q[0] loses min(q[0], r), and q[2] is cut
//     to what is left after q[0]. A drain's debt goes to the front (q[0]).
//   - p[1], p[2] are the push counters of ranks 1 and 2: the tokens by
//     which takes of a higher rank have moved their reservations back,
//     ever.
//   - j[1], j[2] are the jump allowances over ranks 1 and 2, for a rank
//     with a MinShare s > 0: a higher rank may push it back only while its
//     allowance min((1−s)·j, burst) covers the push; each push spends it.
//     j is kept in refilled tokens (each refill adds what it refilled), so
//     that the scripts and calls that do not know the shares (refund,
//     pause, drain, fill) keep it right; no j yet, or a full bucket, is a
//     whole burst of allowance.
//
// A take of rank c and cost k from T tokens pushes the lower ranks back by
// pushed = k − max(0, T) when T < k. When a lower rank l with reservations
// and s[l] > 0 has an allowance a below pushed, the take would take l
// below its floor: it is refused (TakeResult.Floor), changing nothing,
// and told the exact wait until the refill has grown the allowance enough,
// (pushed − a)/(1 − s[l]) tokens (the longest over such ranks). Otherwise
// it sees the tokens T plus the reservations of the ranks after c, ahead
// of all of them; granted, T falls by its tokens, c's reservations grow by
// pushed, and every lower rank with reservations gets pushed added to its
// counter (and spent from its allowance, which never goes below 0). A
// refund of rank e gives k tokens back and takes min(q[e], k) off q[e]
// (rank 1's shrink with T). A rank-1 take with no rank-2 reservations, the
// default, is exactly the take of a bucket without classes.
type prio struct {
	q, p, j [NumPriorities]float64 // indexed by rank; q[1], p[0], j[0] unused
	jset    [NumPriorities]bool    // j[l] holds a value; else a whole burst
}

// minQueued is the least reservation of rank 1, which is computed as a
// difference, that counts: less is rounding.
const minQueued = 1e-9

// refilled updates s for the bucket's tokens going from t0 (those stored;
// NaN when there is no state) to t by a refill: a full bucket restores
// the allowances, the others grow by the tokens refilled; the refill
// repays the front of the queue.
func (s *prio) refilled(t0, t float64, burst int) {
	if s.jset[1] || s.jset[2] {
		if t >= float64(burst) {
			s.jset = [NumPriorities]bool{}
		} else if t > t0 {
			for l := 1; l <= 2; l++ {
				if s.jset[l] {
					s.j[l] += t - t0
				}
			}
		}
	}
	if s.q[0] > 0 || s.q[2] > 0 {
		total := math.Max(0, -t)
		if t > t0 {
			if r := math.Max(0, -t0) - total; r > 0 {
				s.q[0] -= math.Min(s.q[0], r)
			}
		}
		s.q[0] = math.Min(s.q[0], total)
		s.q[2] = math.Min(s.q[2], total-s.q[0])
	}
}

// drained updates s for a drain from t0 to t tokens: the debt is reserved
// at the front of the queue.
func (s *prio) drained(t0, t float64) {
	s.q[0] += math.Max(0, -t) - math.Max(0, -t0)
}

// queued1 returns rank 1's reservations at t tokens.
func (s *prio) queued1(t float64) float64 {
	q1 := math.Max(0, -t) - s.q[0] - s.q[2]
	if q1 < minQueued {
		return 0
	}
	return q1
}

// allow returns the jump allowance over rank l with share sh.
func (s *prio) allow(l int, sh float64, burst int) float64 {
	if !s.jset[l] {
		return float64(burst)
	}
	return math.Min((1-sh)*s.j[l], float64(burst))
}

// class returns, for a take of rank c and cost k from t tokens, the tokens
// it pushes lower ranks back by, the tokens it sees, rank 1's reservations,
// and the refill (in tokens) its floors need first: 0 when no lower rank's
// MinShare holds it back. sh holds the shares by rank.
func (s *prio) class(t float64, c int, k float64, sh [NumPriorities]float64, burst int) (pushed, visible, q1, need float64) {
	if t < k {
		pushed = k - math.Max(0, t)
	}
	if c == 2 || (c == 1 && s.q[2] == 0) {
		return pushed, t, 0, 0
	}
	q1 = s.queued1(t)
	q := [NumPriorities]float64{0, q1, s.q[2]}
	if pushed > 0 {
		for l := c + 1; l <= 2; l++ {
			if q[l] > 0 && sh[l] > 0 {
				if a := s.allow(l, sh[l], burst); a < pushed {
					need = math.Max(need, (pushed-a)/(1-sh[l]))
				}
			}
		}
	}
	visible = t
	for l := c + 1; l <= 2; l++ {
		visible += q[l]
	}
	return pushed, visible, q1, need
}

// grant records a granted take of rank c that pushed lower ranks back by
// pushed, rank 1 having held q1 tokens reserved. It returns the ranks it
// pushed, as bits 1<<rank.
func (s *prio) grant(c int, pushed, q1 float64, sh [NumPriorities]float64, burst int) (moved uint8) {
	if !(pushed > 0) {
		return 0
	}
	if c != 1 {
		s.q[c] += pushed
	}
	q := [NumPriorities]float64{0, q1, s.q[2]}
	for l := c + 1; l <= 2; l++ {
		if q[l] > 0 {
			s.p[l] += pushed
			if sh[l] > 0 {
				limit := float64(burst) / (1 - sh[l])
				j := limit
				if s.jset[l] {
					j = math.Min(s.j[l], limit)
				}
				s.j[l], s.jset[l] = j-pushed/(1-sh[l]), true
			}
			moved |= 1 << l
		}
	}
	return moved
}

// refund takes the k tokens of a cancelled reservation of rank e off its
// queue; the caller has put them back in the bucket.
func (s *prio) refund(e int, k float64) {
	if e == 0 || e == 2 {
		s.q[e] -= math.Min(s.q[e], k)
	}
}

// reserved returns the tokens each class has reserved, from t tokens.
func (s *prio) reserved(t float64) Shares {
	var r Shares
	r[PriorityHigh], r[PriorityNormal], r[PriorityLow] = s.q[0], s.queued1(t), s.q[2]
	return r
}

// pushed returns the push counters by class.
func (s *prio) pushed() Shares {
	var r Shares
	r[PriorityNormal], r[PriorityLow] = s.p[1], s.p[2]
	return r
}

// pushes are the announcements of a granted take: one Push per rank in
// moved.
func (s *prio) pushes(moved uint8, tokens float64, at time.Time) []Push {
	var out []Push
	for l := 1; l <= 2; l++ {
		if moved&(1<<l) != 0 {
			out = append(out, Push{Class: PriorityOfRank(l), Tokens: tokens, Counter: s.p[l], At: at})
		}
	}
	return out
}
