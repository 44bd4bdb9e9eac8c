package backend

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"
)

// Adaptive configures the adaptive rate (AIMD) of a bucket whose real limit
// is unknown or changes, such as a provider's that throttles harder at
// peak. The configured rate (or an operator's override) becomes the
// ceiling. Each push-back (Bucket.Pause, which the PushBack middleware
// calls on a 429 or a provider's throttling answer) multiplies the bucket's
// rate by Decrease, down to MinRate; while no push-back comes, the rate
// climbs back by Increase every Interval, up to the ceiling.
//
// The adaptive rate is state of the shared bucket, kept by the store (see
// Adapter), so every replica follows it: replicas that report the same
// push-back within MergeWindow of each other decrease the rate once, not
// once each. The climb is computed from the store's clock when the bucket
// is next used, with no timer. An operator's override (SetOverride) and a
// reset start again from the ceiling.
//
// A zero field takes its default, except MinRate, which is required.
type Adaptive struct {
	// MinRate is the floor of the adaptive rate, in tokens per second: a
	// push-back never takes the rate below it. Required: > 0 and
	// <= MaxRate, and at most the bucket's configured rate (ValidateFor).
	// A store caps the rate at the ceiling in force, so an operator's
	// override below MinRate still wins.
	MinRate float64
	// Decrease multiplies the rate at each push-back: > 0 and < 1.
	// Default 0.7.
	Decrease float64
	// Increase is what the rate gains, in tokens per second, every
	// Interval without a push-back. Default: 1% of the configured rate,
	// which climbs from a third of the ceiling back to it in 67 Intervals.
	Increase float64
	// Interval is the period of Increase. Default 1s. The climb is
	// continuous: Increase/Interval is a slope, not a step.
	Interval time.Duration
	// MergeWindow is how long after a decrease further push-backs are
	// taken as reports of the same event and change nothing. Default
	// 500ms.
	MergeWindow time.Duration
}

// Defaults of Adaptive.
const (
	DefaultAdaptiveDecrease    = 0.7
	DefaultAdaptiveInterval    = time.Second
	DefaultAdaptiveMergeWindow = 500 * time.Millisecond
	// DefaultAdaptiveIncreaseShare is the default Increase as a share of
	// the configured rate.
	DefaultAdaptiveIncreaseShare = 0.01
)

// Validate returns the *ParamError of every field out of range, joined,
// each naming the Go field ("Adaptive.MinRate", ...), or nil.
func (a Adaptive) Validate() error {
	var errs []error
	bad := func(field, msg string, v any) {
		errs = append(errs, &ParamError{Param: "Adaptive." + field, Msg: msg, Value: v})
	}
	maxRate := strconv.FormatFloat(MaxRate, 'g', -1, 64)
	if !(a.MinRate > 0) || a.MinRate > MaxRate {
		bad("MinRate", "is required: a number > 0 and <= "+maxRate, a.MinRate)
	}
	if a.Decrease != 0 && !(a.Decrease > 0 && a.Decrease < 1) {
		bad("Decrease", "must be > 0 and < 1 (0 for the default 0.7)", a.Decrease)
	}
	if a.Increase != 0 && !(a.Increase > 0 && a.Increase <= MaxRate) {
		bad("Increase", "must be a rate > 0 and <= "+maxRate+" (0 for the default)", a.Increase)
	}
	if a.Interval < 0 || (a.Interval > 0 && a.Interval < time.Microsecond) {
		bad("Interval", "must be >= 1µs (0 for the default 1s)", a.Interval)
	}
	if a.MergeWindow < 0 {
		bad("MergeWindow", "must be >= 0 (0 for the default 500ms)", a.MergeWindow)
	}
	return errors.Join(errs...)
}

// ValidateFor is Validate for a bucket configured at rate tokens per
// second: MinRate must also be at most rate, since a floor above the
// ceiling is a configuration mistake, not a limit. A rate that
// ValidateRate rejects, or a MinRate that Validate rejects, is not
// compared (their own checks report them).
func (a Adaptive) ValidateFor(rate float64) error {
	err := a.Validate()
	if ValidateRate(rate) == nil && a.MinRate > rate && a.MinRate <= MaxRate {
		msg := "must be <= the bucket's rate " + strconv.FormatFloat(rate, 'g', -1, 64)
		err = errors.Join(err, &ParamError{Param: "Adaptive.MinRate", Msg: msg, Value: a.MinRate})
	}
	return err
}

// AdaptiveDefaults returns a with every zero field but MinRate set to its
// default, for a bucket configured at rate tokens per second.
func AdaptiveDefaults(a Adaptive, rate float64) Adaptive {
	if a.Decrease == 0 {
		a.Decrease = DefaultAdaptiveDecrease
	}
	if a.Interval == 0 {
		a.Interval = DefaultAdaptiveInterval
	}
	if a.Increase == 0 {
		a.Increase = rate * DefaultAdaptiveIncreaseShare
	}
	if a.MergeWindow == 0 {
		a.MergeWindow = DefaultAdaptiveMergeWindow
	}
	return a
}

// AdaptiveSlope returns the climb in tokens per second per microsecond, the unit
// the stores keep. a has its defaults.
func AdaptiveSlope(a Adaptive) float64 {
	return a.Increase / float64(a.Interval.Microseconds())
}

// Adapter is implemented by stores that keep an adaptive rate (see
// Adaptive). A Bucket with Options.Adaptive calls Decrease after each
// successful Pause.
type Adapter interface {
	// Decrease records a push-back: unless another decrease happened
	// within a.MergeWindow (by the store's clock), it multiplies the rate
	// in force by a.Decrease, floored at a.MinRate and capped at the
	// ceiling, and the rate then climbs by a.Increase per a.Interval from
	// now, or from the end of a pause in force. Zero fields of a take their
	// defaults for the store's configured rate. It returns the adaptive
	// rate after the call and whether this call decreased it; a store that
	// implements Notifier announces a decrease.
	Decrease(ctx context.Context, a Adaptive) (rate float64, decreased bool, err error)
}

// adaptiveCurve is a bucket's adaptive rate over time: a from the instant at
// (µs), then climbing by k tokens/s per µs, never above the ceiling. The
// Redis scripts compute the same curve, with the same operations in the same
// order (redislimiter's lua/adaptive.lua), so that both stores pass the
// same step tables.
type adaptiveCurve struct {
	on   bool
	a    float64 // tokens/s at `at`
	at   int64   // µs: the climb starts here
	k    float64 // tokens/s per µs
	last int64   // µs: the last decrease, for the merge window
}

// rateAt returns the adaptive rate at t (µs), capped at ceil.
func (c adaptiveCurve) rateAt(ceil float64, t int64) float64 {
	if !c.on {
		return ceil
	}
	r := c.a
	if t > c.at {
		r = r + float64(c.k*float64(t-c.at))
	}
	return math.Min(r, ceil)
}

// cum returns the integral of the rate from c.at to t, in tokens·µs/s.
func (c adaptiveCurve) cum(ceil float64, t int64) float64 {
	u := float64(t - c.at)
	a := math.Min(c.a, ceil)
	if u <= 0 || c.k <= 0 || a >= ceil {
		return a * u
	}
	uc := (ceil - a) / c.k
	if u <= uc {
		return float64(a*u) + float64(c.k*u*u)/2
	}
	return float64(a*uc) + float64(c.k*uc*uc)/2 + float64(ceil*(u-uc))
}

// refill returns the tokens the bucket gains from `from` to `to` (µs) at
// ceiling ceil.
func (c adaptiveCurve) refill(ceil float64, from, to int64) float64 {
	if !c.on {
		return float64(to-from) * ceil / 1e6
	}
	return (c.cum(ceil, to) - c.cum(ceil, from)) / 1e6
}

// Decrease implements Adapter.
func (m *Memory) Decrease(_ context.Context, a Adaptive) (float64, bool, error) {
	if err := a.Validate(); err != nil {
		return 0, false, err
	}
	rate, ok := m.DecreaseAt(m.now(), a)
	if ok {
		m.notify()
	}
	return rate, ok, nil
}

// DecreaseAt is Decrease at an explicit instant, without announcing it. a
// must be valid (see Adaptive.Validate).
func (m *Memory) DecreaseAt(t time.Time, a Adaptive) (float64, bool) {
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	a = AdaptiveDefaults(a, m.rate)
	cur := m.ad.rateAt(m.rate, now)
	if m.ad.on && now-m.ad.last < a.MergeWindow.Microseconds() {
		return cur, false
	}
	tokens, ts, pr := m.load(now)
	m.store(tokens, ts, pr)
	nr := math.Min(m.rate, math.Max(a.MinRate, cur*a.Decrease))
	m.ad = adaptiveCurve{on: true, a: nr, at: max(now, ts), k: AdaptiveSlope(a), last: now}
	m.changed = now
	return nr, true
}

// AdaptiveRateAt returns the adaptive rate at t: the configured rate when
// no push-back has lowered it.
func (m *Memory) AdaptiveRateAt(t time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ad.rateAt(m.rate, t.UnixMicro())
}
