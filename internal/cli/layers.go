package cli

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlehq/throttle/limiter"
)

// layerObserver returns obs with the metrics of limit.extra added, or obs
// itself without layers, fair shares nor a shadow shared bucket
// (limit.shadow) (fair: their waits and refusals go by the layer name
// "fair"; the shadow shared bucket by "bucket"): throttle_limit_exceeded_total{layer,action}, the
// refusals (shadow="true": what a shadow layer would have refused or made
// wait), throttle_limit_shadow_wait_seconds{layer}, each shadow layer's
// would-be wait, throttle_limit_wait_seconds{layer}, the waits by the layer
// that set them ("bucket" for the shared bucket), and
// throttle_paid_slots_refused_total{layer}, the paid slots (x-throttle-paid)
// refused for a missing or wrong signature ("other" for a layer that is not
// configured), and throttle_paid_slots_forfeit_total{layer}, those not
// honoured (Stats.PaidForfeit). Labels name layers, never keys, so their
// number is bounded by the configuration.
func layerObserver(m *metrics, obs *limiter.Observer, layers []limiter.Layer, fair, shadow bool) *limiter.Observer {
	if len(layers) == 0 && !fair && !shadow {
		return obs
	}
	exceeded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttle_limit_exceeded_total",
		Help: "Messages a layer of limit.extra refused, by layer and action (dead_letter, delay); shadow=\"true\": messages a shadow layer would have refused or made wait (action wait) had it been enforced.",
	}, []string{"layer", "action", "shadow"})
	shadowWaits := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "throttle_limit_shadow_wait_seconds",
		Help:    "For each message and shadow layer of limit.extra: how long after the decision the layer would have had room (0: at once), had it been enforced.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600},
	}, []string{"layer"})
	waits := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "throttle_limit_wait_seconds",
		Help:    "Time a message waited for tokens, by the layer whose wait was the longest (bucket: the shared bucket).",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600},
	}, []string{"layer"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttle_paid_slots_refused_total",
		Help: "Paid slots (x-throttle-paid) refused for a missing or wrong signature, by layer (other: not a configured layer); the layer then decided as usual.",
	}, []string{"layer"})
	forfeit := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttle_paid_slots_forfeit_total",
		Help: "Paid slots (x-throttle-paid) not honoured, by layer: the message came back later than the slot's lateness, or the store no longer held the booking; the layer then decided as usual, most often setting the message aside again.",
	}, []string{"layer"})
	m.reg.MustRegister(exceeded, waits, refused, forfeit)
	o := *obs
	o.LimitExceeded = func(layer string, action limiter.Action) {
		exceeded.WithLabelValues(layer, string(action), "false").Inc()
	}
	for _, l := range layers {
		shadow = shadow || l.Shadow
	}
	if shadow {
		m.reg.MustRegister(shadowWaits)
		o.ShadowDecided = func(d limiter.ShadowDecision) {
			layer := d.Layer
			if layer == "" { // the shared bucket (limit.shadow)
				layer = "bucket"
			}
			if d.Exceeded() {
				exceeded.WithLabelValues(layer, string(d.Action), "true").Inc()
			}
			shadowWaits.WithLabelValues(layer).Observe(d.Wait.Seconds())
		}
	}
	o.PaidRefused = func(layer string) {
		if layer == "" {
			layer = "other"
		}
		refused.WithLabelValues(layer).Inc()
	}
	o.PaidForfeit = func(layer string) { forfeit.WithLabelValues(layer).Inc() }
	o.LayerWaited = func(layer string, d time.Duration) {
		if layer == "" {
			layer = "bucket"
		}
		waits.WithLabelValues(layer).Observe(d.Seconds())
	}
	return &o
}
