package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// layeredStore adds the layers of limit.extra to store, or returns store
// itself when there are none.
func layeredStore(store *redislimiter.Store, cfg config.Limit) (limiter.Store, error) {
	if len(cfg.Extra) == 0 {
		return store, nil
	}
	layers, err := cfg.Layers()
	if err != nil {
		return nil, &configError{err: err}
	}
	ls, err := store.WithLayers(layers)
	if err != nil {
		return nil, &configError{err: fmt.Errorf("limit.extra: %w", err)}
	}
	return ls, nil
}

// layerObserver returns obs with the metrics of limit.extra added, or obs
// itself without layers: throttle_limit_exceeded_total{layer,action}, the
// refusals, throttle_limit_wait_seconds{layer}, the waits by the layer
// that set them ("bucket" for the shared bucket), and
// throttle_paid_slots_refused_total{layer}, the paid slots (x-throttle-paid)
// refused for a missing or wrong signature ("other" for a layer that is not
// configured). Labels name layers, never keys, so their number is bounded
// by the configuration.
func layerObserver(m *metrics, obs *limiter.Observer, cfg config.Limit) *limiter.Observer {
	if len(cfg.Extra) == 0 {
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

// consumerLimiter returns the consumer's limiter: w, or, with limit.extra,
// a layeredLimiter around it.
func consumerLimiter(cfg config.Limit, w *waitLimiter) (consumer.Limiter, error) {
	if len(cfg.Extra) == 0 {
		return w, nil
	}
	keys, err := cfg.LayerKeys()
	if err != nil {
		return nil, &configError{err: err}
	}
	return &layeredLimiter{waitLimiter: w, keys: keys}, nil
}

// layeredLimiter waits on the shared bucket and the layers of limit.extra
// in one decision (limiter.Bucket.WaitN), with the message's key in each
// keyed layer. A layer whose on_exceed is dead_letter refuses with a
// permanent error whose dead-letter headers name it; a delay layer's
// refusal goes back to consumer.Throttle, which sets the message aside
// until the layer has room: a token-bucket layer books the message's slot
// then, and the message comes back with consumer.HeaderPaid naming it. It
// is safe for concurrent use.
type layeredLimiter struct {
	*waitLimiter
	keys func(consumer.Message) (map[string]string, error) // nil: no keyed layer
}

// WaitMessage implements consumer.MessageLimiter.
func (w *layeredLimiter) WaitMessage(ctx context.Context, msg consumer.Message, cost int) error {
	p, err := w.classOf(msg)
	if err != nil {
		return err
	}
	var keys map[string]string
	if w.keys != nil {
		if keys, err = w.keys(msg); err != nil {
			return err
		}
	}
	// A message set aside by a delay layer that booked its slot comes
	// back naming the layer (consumer.HeaderPaid): it passes it without
	// taking from it again.
	err = w.waitCounted(ctx, limiter.Request{Cost: cost, Keys: keys, Priority: p, Paid: consumer.PaidSlots(msg)})
	var le *limiter.LimitError
	if errors.As(err, &le) && le.Action == limiter.ActionDeadLetter {
		return consumer.Permanent(limitRefusal{le})
	}
	// A delay layer's *limiter.LimitError goes to consumer.Throttle as is:
	// it sets the message aside (consumer.SetAside) for le.Wait.
	return err
}

// limitRefusal is a layer's refusal as the consumer dead-letters it: the
// headers name the layer and say why.
type limitRefusal struct{ *limiter.LimitError }

func (e limitRefusal) Unwrap() error { return e.LimitError }

// DeadLetterHeaders implements the consumer's dead-letter header hook.
func (e limitRefusal) DeadLetterHeaders() map[string]string {
	return map[string]string{"x-throttle-limit": e.Layer, "x-throttle-limit-reason": e.Reason}
}

var _ consumer.MessageLimiter = (*layeredLimiter)(nil)
