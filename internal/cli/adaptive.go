package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// adaptiveJSON is the adaptive rate (limit.adaptive) in 'bucket status':
// present while a push-back holds the bucket's rate below its ceiling.
type adaptiveJSON struct {
	// Rate is the adaptive rate now, in tokens per second.
	Rate float64 `json:"rate"`
	// Ceiling is the override's rate, else the configured one.
	Ceiling float64 `json:"ceiling"`
	// SinceDecreaseSeconds is the time since the last push-back lowered
	// the rate, nil when Redis records none.
	SinceDecreaseSeconds *float64 `json:"since_decrease_seconds"`
}

// readAdaptive reads the bucket's adaptive rate; nil when none is in force.
func readAdaptive(ctx context.Context, admin *redislimiter.Admin) (*adaptiveJSON, error) {
	st, err := admin.Adaptive(ctx)
	if err != nil || !st.On || st.Rate <= 0 {
		return nil, err
	}
	a := &adaptiveJSON{Rate: st.Rate, Ceiling: st.Ceiling}
	if st.SinceDecrease >= 0 {
		s := st.SinceDecrease.Seconds()
		a.SinceDecreaseSeconds = &s
	}
	return a, nil
}

// writeAdaptive prints the adaptive line of 'bucket status', if any.
func writeAdaptive(w io.Writer, a *adaptiveJSON) {
	if a == nil {
		return
	}
	since := ""
	if a.SinceDecreaseSeconds != nil {
		since = fmt.Sprintf(", last push-back %.1fs ago", *a.SinceDecreaseSeconds)
	}
	fmt.Fprintf(w, "  %-11s %.3g/s of a ceiling of %.3g/s (climbing back%s)\n", "adaptive", a.Rate, a.Ceiling, since)
}

// adaptiveGauge is throttle_bucket_adaptive_rate, registered in reg: the
// bucket's adaptive rate as Redis holds it (its ceiling when no push-back
// holds it lower), read every interval by watchAdaptive.
func adaptiveGauge(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "throttle_bucket_adaptive_rate",
		Help: "Adaptive rate of the shared bucket (limit.adaptive), in tokens per second: lowered by each push-back, climbing back to the configured rate.",
	})
	reg.MustRegister(g)
	return g
}

// watchAdaptive sets g from the bucket's adaptive rate every interval until
// ctx ends. A failed read leaves g as it was.
func watchAdaptive(ctx context.Context, admin *redislimiter.Admin, g prometheus.Gauge, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, interval)
		if st, err := admin.Adaptive(rctx); err == nil && st.Rate > 0 {
			g.Set(st.Rate)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// warmupJSON is the warm-up state (limit.warmup) in 'bucket status':
// present while a ramp is in progress, or while the bucket is cold.
type warmupJSON struct {
	// Ramping: the rate is RateFactor of the rate for SecondsLeft more.
	Ramping     bool     `json:"ramping"`
	RateFactor  *float64 `json:"rate_factor"`
	SecondsLeft *float64 `json:"seconds_left"`
	// Cold: the next take starts a ramp (when the replicas have a
	// warm-up).
	Cold bool `json:"cold"`
}

// readWarmup reads the bucket's warm-up state; nil when the replicas have
// no warm-up (warmup is 0) and no ramp is in progress.
func readWarmup(ctx context.Context, admin *redislimiter.Admin, warmup time.Duration) (*warmupJSON, error) {
	st, err := admin.Warmup(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case st.Ramping:
		f, left := st.Factor, st.Left.Seconds()
		return &warmupJSON{Ramping: true, RateFactor: &f, SecondsLeft: &left}, nil
	case st.Cold && warmup > 0:
		return &warmupJSON{Cold: true}, nil
	}
	return nil, nil
}

// writeWarmup prints the warm-up line of 'bucket status', if any.
func writeWarmup(w io.Writer, wj *warmupJSON) {
	switch {
	case wj == nil:
	case wj.Ramping:
		fmt.Fprintf(w, "  %-11s ramping: %.0f%% of the rate, %.0fs left\n", "warm-up", 100**wj.RateFactor, *wj.SecondsLeft)
	case wj.Cold:
		fmt.Fprintf(w, "  %-11s cold: the next message starts the ramp from a third of the rate\n", "warm-up")
	}
}
