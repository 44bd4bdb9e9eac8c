package redislimiter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// Decrease implements backend.Adapter with one script call: the bucket's
// adaptive rate, kept in its override hash (see lua/adaptive.lua), drops by
// a.Decrease unless another replica's push-back did so within
// a.MergeWindow, by Redis time. The decrease is announced on the bucket's
// channel, so that replicas re-time the reservations their callers sleep
// on.
func (s *Store) Decrease(ctx context.Context, a limiter.Adaptive) (float64, bool, error) {
	return s.decrease(ctx, 0, a)
}

func (s *Store) decrease(ctx context.Context, nowUS int64, a limiter.Adaptive) (float64, bool, error) {
	if err := a.Validate(); err != nil {
		return 0, false, err
	}
	a = backend.AdaptiveDefaults(a, s.cfg.Rate)
	v, err := decreaseScript.Run(ctx, s.client, s.stateKeys, s.rateArg, s.burstArg,
		strconv.FormatFloat(a.Decrease, 'g', -1, 64), strconv.FormatFloat(a.MinRate, 'g', -1, 64),
		strconv.FormatFloat(backend.AdaptiveSlope(a), 'g', -1, 64), a.MergeWindow.Microseconds(), nowUS, s.channel).Int64Slice()
	if err != nil {
		return 0, false, s.fail("decrease", err)
	}
	if len(v) != 2 {
		return 0, false, s.malformed("decrease", v)
	}
	return float64(v[1]) / 1000, v[0] == 1, nil
}

// AdaptiveStatus is the adaptive rate of a bucket as Redis holds it.
type AdaptiveStatus struct {
	// On is set while a push-back holds the rate below the ceiling, or
	// the climb back has not been read since it reached it.
	On bool
	// Rate is the adaptive rate now, in tokens per second: the ceiling
	// when On is false. 0 when the ceiling is unknown (an Admin without a
	// configured rate and no override).
	Rate float64
	// Ceiling is the override's rate, else the configured one (0 when
	// unknown).
	Ceiling float64
	// SinceDecrease is the time since the last decrease, or -1 when the
	// hash records none.
	SinceDecrease time.Duration
	// At is Redis's clock when it answered.
	At time.Time
}

// Adaptive reads the bucket's adaptive rate without changing it.
func (a *Admin) Adaptive(ctx context.Context) (AdaptiveStatus, error) {
	return a.adaptive(ctx, 0)
}

func (a *Admin) adaptive(ctx context.Context, nowUS int64) (AdaptiveStatus, error) {
	v, err := adaptiveStatusScript.Run(ctx, a.client, a.keys.all[:2], a.rateArg, a.burstArg, nowUS).Int64Slice()
	if err != nil {
		return AdaptiveStatus{}, storeError("adaptive status", a.name, err)
	}
	if len(v) != 5 {
		return AdaptiveStatus{}, storeError("adaptive status", a.name, fmt.Errorf("%w: %d values %v", backend.ErrMalformedReply, len(v), v))
	}
	st := AdaptiveStatus{On: v[0] == 1, Rate: float64(v[1]) / 1000, Ceiling: float64(v[2]) / 1000, SinceDecrease: -1, At: time.UnixMicro(v[4])}
	if v[3] >= 0 {
		st.SinceDecrease = time.Duration(v[3]) * time.Microsecond
	}
	return st, nil
}

var _ backend.Adapter = (*Store)(nil)
