package backend

import (
	"math"
	"time"
)

// Warm-up
//
// A bucket with a warm-up (Memory.SetWarmup, redislimiter.Config.Warmup)
// is cold on its first use and after it has been idle, with no take, for
// longer than the warm-up period W. A cold bucket holds a third of its
// burst (at least 1 token) instead of a full burst, and its rate ramps
// from a third of the rate R to R over W, along the curve of Guava's
// SmoothWarmingUp with its coldFactor of 3, read in time:
//
//	rate(t) = R / √(9 − 8t/W)   for 0 ≤ t < W, then R
//
// Guava's limiter spends W going from its cold interval (3/R) to its
// stable interval (1/R) when it is saturated, and its interval is linear
// in the permits stored above the threshold; solving dt = interval(p)·dp
// for that line gives exactly this rate over time, and the tokens of the
// ramp, ∫rate = R·W/2, are the trapezoid of Guava's diagram. Unlike Guava,
// the ramp here advances with time, not with the permits taken: a bucket
// used below its rate warms up in W as well. Takes observe the warm-up,
// plain ones and the shared bucket of layered ones (LayeredMemory, the
// Redis layers script) alike, and refunds, plain and layered, refill along
// a ramp in progress without starting one; pauses and status refill at the
// plain rate. A Bucket's local fallback ramps at its share of the
// rate (see Bucket.warmLocal).

// MaxWarmup is the longest warm-up period a bucket accepts.
const MaxWarmup = 24 * time.Hour

// ValidateWarmup returns a *ParamError for the parameter "Warmup" unless d
// is 0 (no warm-up) or between 1ms and MaxWarmup.
func ValidateWarmup(d time.Duration) error {
	if d != 0 && (d < time.Millisecond || d > MaxWarmup) {
		return &ParamError{Param: "Warmup", Msg: "must be 0 (none) or between 1ms and 24h", Value: d}
	}
	return nil
}

// warmCum returns ∫₀ᵘ rate(t) dt for the ramp at rate (tokens/s) over w
// µs, in tokens·µs/s. The Redis scripts compute the same expression
// (redislimiter's lua/warmup.lua).
func warmCum(rate float64, w, u int64) float64 {
	if u >= w {
		return rate*float64(w)/2 + rate*float64(u-w)
	}
	return rate * float64(w) / 4 * (3 - math.Sqrt(9-8*float64(u)/float64(w)))
}

// SetWarmup sets the warm-up period of the bucket (see the package's
// warm-up section); 0 turns it off. Call it before the bucket is used. It
// returns a *ParamError for a negative d.
func (m *Memory) SetWarmup(d time.Duration) error {
	if err := ValidateWarmup(d); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.warm = d.Microseconds()
	return nil
}

// WarmupStore is a Store with a warm-up (Memory.SetWarmup,
// redislimiter.Config.Warmup). A Bucket's local fallback ramps with it
// (see the store-failure state machine).
type WarmupStore interface {
	Store
	// Warmup returns the warm-up period, 0 for none.
	Warmup() time.Duration
}

// Warmup returns the warm-up period set by SetWarmup, 0 for none.
func (m *Memory) Warmup() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Duration(m.warm) * time.Microsecond
}

// rampElapsed returns how far into a ramp of w µs the rate is f of the
// rate: the u with 1/√(9 − 8u/w) = f, for f clamped to [1/3, 1] (0 at a
// third, w at the full rate).
func rampElapsed(f float64, w int64) int64 {
	f = min(max(f, 1.0/3), 1)
	return int64(math.Round((9 - 1/(f*f)) / 8 * float64(w)))
}

// takeAdvance is advance for a take: with a warm-up it starts a cold
// bucket's ramp and refills along a ramp in progress. It returns the tokens
// and timestamp at now, the refill rate at now, and the ramp start to save
// with the take (the current one when there is no ramp). m.mu is held.
func (m *Memory) takeAdvance(now int64) (tokens float64, ts int64, rate float64, wts int64) {
	return m.warmAdvance(now, true)
}

// warmAdvance is takeAdvance when start is set. Without start (a refund) it refills along a ramp in progress but starts none: a cold
// bucket refills at the plain rate, as advance does. m.mu is held.
func (m *Memory) warmAdvance(now int64, start bool) (tokens float64, ts int64, rate float64, wts int64) {
	rate = m.ad.rateAt(m.rate, now)
	if m.warm > 0 {
		if !m.init || now-m.ts > m.warm {
			if start {
				b := float64(m.burst)
				return math.Min(b, math.Max(1, b/3)), now, rate / 3, now
			}
		} else if now-m.wts < m.warm {
			tokens, ts = m.tokens, m.ts
			if now > ts {
				tokens += (warmCum(rate, m.warm, now-m.wts) - warmCum(rate, m.warm, ts-m.wts)) / 1e6
				ts = now
			}
			return math.Min(tokens, float64(m.burst)), ts, rate / math.Sqrt(9-8*float64(now-m.wts)/float64(m.warm)), m.wts
		}
	}
	tokens, ts = m.advance(now)
	return tokens, ts, rate, m.wts
}

// takeLoad is load for a take (takeAdvance with the priority state after
// the refill); refundLoad is load for a refund, plain or layered (warmAdvance
// without starting a ramp). m.mu is held.
func (m *Memory) takeLoad(now int64) (tokens float64, ts int64, rate float64, wts int64, pr prio) {
	tokens, ts, rate, wts = m.warmAdvance(now, true)
	return tokens, ts, rate, wts, m.loaded(tokens)
}

func (m *Memory) refundLoad(now int64) (tokens float64, ts int64, pr prio) {
	tokens, ts, _, _ = m.warmAdvance(now, false)
	return tokens, ts, m.loaded(tokens)
}

// WarmAt gives m, not yet in use, a warm-up of w and puts it at the point of
// its ramp where the rate is f of the full rate (f clamped to [1/3, 1]) at
// now, as a Bucket's local fallback continues the shared bucket's ramp.
func (m *Memory) WarmAt(w time.Duration, f float64, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.warm = w.Microseconds()
	m.wts = now.UnixMicro() - rampElapsed(f, m.warm)
}
