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

// consumerLimiter returns the consumer's limiter: w, or, with limit.extra,
// a layeredLimiter around it.
func consumerLimiter(cfg config.Limit, bucket *limiter.Bucket, w *waitLimiter) (consumer.Limiter, error) {
	if len(cfg.Extra) == 0 {
		return w, nil
	}
	keys, err := cfg.LayerKeys()
	if err != nil {
		return nil, &configError{err: err}
	}
	exceeded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttle_limit_exceeded_total",
		Help: "Messages a layer of limit.extra refused, by layer and action (dead_letter, delay).",
	}, []string{"layer", "action"})
	if err := w.m.reg.Register(exceeded); err != nil {
		return nil, err
	}
	return &layeredLimiter{waitLimiter: w, bucket: bucket, keys: keys, exceeded: exceeded}, nil
}

// layeredLimiter waits on the shared bucket and the layers of limit.extra
// in one decision (limiter.Bucket.WaitN), with the message's key in each
// keyed layer. A layer whose on_exceed is dead_letter refuses with a
// permanent error whose dead-letter headers name it; delay waits here
// until the layer has room, charging nothing meanwhile (no delay queue
// yet). It is safe for concurrent use.
type layeredLimiter struct {
	*waitLimiter
	bucket   *limiter.Bucket
	keys     func(consumer.Message) (map[string]string, error) // nil: no keyed layer
	exceeded *prometheus.CounterVec
}

// WaitMessage implements consumer.MessageLimiter.
func (w *layeredLimiter) WaitMessage(ctx context.Context, msg consumer.Message, cost int) error {
	var keys map[string]string
	if w.keys != nil {
		var err error
		if keys, err = w.keys(msg); err != nil {
			return err
		}
	}
	defer w.m.startWaiting()()
	req := limiter.Request{Cost: cost, Keys: keys}
	for {
		err := w.waitN(ctx, req)
		var le *limiter.LimitError
		if !errors.As(err, &le) {
			if err == nil {
				w.m.tookTokens(cost)
			}
			return err
		}
		if le.Action == limiter.ActionDelay && !errors.Is(err, limiter.ErrCostExceedsBurst) {
			w.exceeded.WithLabelValues(le.Layer, string(limiter.ActionDelay)).Inc()
			if err := consumer.Sleep(ctx, max(le.Wait, time.Millisecond)); err != nil {
				return err
			}
			continue
		}
		w.exceeded.WithLabelValues(le.Layer, string(limiter.ActionDeadLetter)).Inc()
		return consumer.Permanent(limitRefusal{le})
	}
}

// waitN is WaitN bounded by limit.max_wait, as waitLimiter.wait bounds
// Wait.
func (w *layeredLimiter) waitN(ctx context.Context, req limiter.Request) error {
	if w.maxWait <= 0 {
		return w.bucket.WaitN(ctx, req)
	}
	wctx, cancel := context.WithTimeoutCause(ctx, w.maxWait, errMaxWait)
	defer cancel()
	err := w.bucket.WaitN(wctx, req)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), errMaxWait) {
		return fmt.Errorf("no tokens within %v: %w", w.maxWait, errMaxWait)
	}
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
