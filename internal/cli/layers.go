package cli

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlehq/throttle/limiter"
)

// layerObserver returns obs with the metrics of limit.extra added, or obs
// itself without layers: throttle_limit_exceeded_total{layer,action}, the
// refusals, throttle_limit_wait_seconds{layer}, the waits by the layer
// that set them ("bucket" for the shared bucket), and
// throttle_paid_slots_refused_total{layer}, the paid slots (x-throttle-paid)
// refused for a missing or wrong signature ("other" for a layer that is not
// configured). Labels name layers, never keys, so their number is bounded
// by the configuration.
func layerObserver(m *metrics, obs *limiter.Observer, layers []limiter.Layer) *limiter.Observer {
	if len(layers) == 0 {
		return obs
	}
	exceeded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttle_limit_exceeded_total",
		Help: "Messages a layer of limit.extra refused, by layer and action (dead_letter, delay).",
	}, []string{"layer", "action"})
	waits := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "throttle_limit_wait_seconds",
		Help:    "Time a message waited for tokens, by the layer whose wait was the longest (bucket: the shared bucket).",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600},
	}, []string{"layer"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttle_paid_slots_refused_total",
		Help: "Paid slots (x-throttle-paid) refused for a missing or wrong signature, by layer (other: not a configured layer); the layer then decided as usual.",
	}, []string{"layer"})
	m.reg.MustRegister(exceeded, waits, refused)
	o := *obs
	o.LimitExceeded = func(layer string, action limiter.Action) { exceeded.WithLabelValues(layer, string(action)).Inc() }
	o.PaidRefused = func(layer string) {
		if layer == "" {
			layer = "other"
		}
		refused.WithLabelValues(layer).Inc()
	}
	o.LayerWaited = func(layer string, d time.Duration) {
		if layer == "" {
			layer = "bucket"
		}
		waits.WithLabelValues(layer).Observe(d.Seconds())
	}
	return &o
}
