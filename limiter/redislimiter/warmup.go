package redislimiter

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// WarmupStatus is the warm-up state of a bucket as Redis holds it (see
// Config.Warmup).
type WarmupStatus struct {
	// Ramping is set while a ramp is in progress: the rate is Factor of
	// the rate, for Left more.
	Ramping bool
	Factor  float64
	Left    time.Duration
	// Cold is set when the bucket's last ramp recorded a warm-up and the
	// bucket has gone without a take for longer than it, or when Redis
	// holds no state for it: the next take starts a ramp, if the replicas
	// have a warm-up.
	Cold bool
	// Period is the warm-up of the replica that started the last ramp, 0
	// when unknown.
	Period time.Duration
}

// Warmup reads the bucket's warm-up state without changing it.
func (a *Admin) Warmup(ctx context.Context) (WarmupStatus, error) {
	return a.warmup(ctx, 0)
}

func (a *Admin) warmup(ctx context.Context, nowUS int64) (WarmupStatus, error) {
	v, err := warmupStatusScript.Run(ctx, a.client, a.keys.all[:1], nowUS).Int64Slice()
	if err != nil {
		return WarmupStatus{}, storeError("warm-up status", a.name, err)
	}
	if len(v) != 5 {
		return WarmupStatus{}, storeError("warm-up status", a.name, fmt.Errorf("%w: %d values %v", backend.ErrMalformedReply, len(v), v))
	}
	state, wts, wu, ts, now := v[0], v[1], v[2], v[3], v[4]
	var st WarmupStatus
	switch state {
	case 0:
		st.Cold = true
	case 2:
		st.Period = time.Duration(wu) * time.Microsecond
		switch {
		case now-ts > wu:
			st.Cold = true
		case now-wts < wu:
			u := float64(max(now-wts, 0)) / float64(wu)
			st.Ramping, st.Factor, st.Left = true, 1/math.Sqrt(9-8*u), time.Duration(wu-(now-wts))*time.Microsecond
		}
	}
	return st, nil
}

// Warmup returns Config.Warmup (backend.WarmupStore): a Bucket's local
// fallback ramps with it.
func (s *Store) Warmup() time.Duration { return s.cfg.Warmup }

var _ backend.WarmupStore = (*Store)(nil)
