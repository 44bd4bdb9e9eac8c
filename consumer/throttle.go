package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/limiter"
)

// Limiter is what the consumers need from a rate limiter: a blocking wait for
// cost tokens. *limiter.Bucket satisfies it.
type Limiter interface {
	Wait(ctx context.Context, cost int) error
}

// SlotLimiter is a MessageLimiter whose grant may hold slots of a
// concurrency layer (limiter.Layer.Concurrency: at most N messages of a
// key at once) until release is called. Throttle calls AcquireMessage
// instead of WaitMessage when its Limiter implements it, and release when
// the handler attempt returns, whatever its outcome (delivered, failed,
// abandoned at shutdown), so that a slot is held exactly while the sink
// works on the message; a retry acquires again. release must never be nil
// and may be called more than once. NewLimiter's limiter implements it.
type SlotLimiter interface {
	MessageLimiter
	AcquireMessage(ctx context.Context, msg Message, cost int) (release func(), err error)
}

// MessageLimiter is a Limiter that decides with the message in hand, such
// as a bucket with further limits keyed by the message's recipient. Throttle
// calls WaitMessage instead of Wait when its Limiter implements it.
type MessageLimiter interface {
	Limiter
	WaitMessage(ctx context.Context, msg Message, cost int) error
}

// Pauser is a limiter that can be paused for every replica at once, as the
// PushBack middleware does when a provider asks to slow down. Pause caps d
// at the Pauser's own longest pause. *limiter.Bucket satisfies it.
type Pauser interface {
	Pause(ctx context.Context, d time.Duration) error
}

// CostFunc returns how many tokens a message costs. It returns a Permanent
// error for a message whose cost cannot be known.
type CostFunc func(Message) (int, error)

// costOne is the default CostFunc: every message costs one token.
func costOne(Message) (int, error) { return 1, nil }

// CostFromHeader returns a CostFunc that reads a message's cost from the
// named header, for example the number of SMS segments. A message without
// the header costs 1. A value that is not a positive integer is a Permanent
// error naming the header, so the message is dead-lettered, not dropped.
func CostFromHeader(name string) CostFunc {
	if name == "" {
		return costOne
	}
	return func(m Message) (int, error) {
		v, ok := m.Headers[name]
		if !ok || v == "" {
			return 1, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, Permanent(fmt.Errorf("cost header %q: %q is not a positive integer", name, v))
		}
		return n, nil
	}
}

// PriorityFunc returns a message's class (see limiter.Priority). It returns
// a Permanent error for a message whose class cannot be known.
type PriorityFunc func(Message) (limiter.Priority, error)

// PriorityFromHeader returns a PriorityFunc that reads a message's class
// from the named header: high, normal or low (limiter.ParsePriority). A
// message without the header has class def, and so has every message when
// name is empty. Any other value, the empty one too, is a Permanent error
// naming the header, so the message is dead-lettered with the reason
// rather than sent in a class nobody chose.
func PriorityFromHeader(name string, def limiter.Priority) PriorityFunc {
	return func(m Message) (limiter.Priority, error) {
		if name == "" {
			return def, nil
		}
		v, ok := m.Headers[name]
		if !ok {
			return def, nil
		}
		if v == "" {
			// limiter.ParsePriority takes "" for its default class.
			return def, Permanent(fmt.Errorf("priority header %q: empty, want %s, %s or %s", name,
				limiter.PriorityHigh, limiter.PriorityNormal, limiter.PriorityLow))
		}
		p, err := limiter.ParsePriority(v)
		if err != nil {
			return def, Permanent(fmt.Errorf("priority header %q: %w", name, err))
		}
		return p, nil
	}
}

// Throttle returns middleware that waits on l for the message's cost before
// each handler attempt, so retries are throttled like first attempts. A
// SlotLimiter's slots are held for the attempt and released when it
// returns. A nil
// cost costs every message one token. A cost the limiter can never grant
// (above its burst)
// becomes a Permanent error, so the message is dead-lettered instead of
// blocking the consumer. A layer that refuses with on_exceed dead_letter
// (a *limiter.LimitError with ActionDeadLetter) becomes a Permanent error
// whose dead letter carries HeaderLimit and HeaderLimitReason, so it is
// never retried. A layer that refuses with on_exceed delay (a
// *limiter.LimitError with ActionDelay) becomes a SetAside error for the
// layer's wait; the copy a backend sets aside carries the slot the layer
// booked, if it did (LimitError.Reserved), in the header x-throttle-paid,
// with the slots the message still holds from an earlier set-aside, and
// NewLimiter's limiter passes them on to the bucket when the message comes
// back (limiter.Request.Paid), so that it does not pay twice. A message
// back before its latest slot is due (a backend caps each set-aside at
// Options.MaxSetAside) is set aside again until then, or, when that is at
// most a few milliseconds away, waits for it here.
//
// When ctx carries a span that records (a consumer's, see
// Options.TracerProvider), each wait is a child span, WaitSpanName, from
// the same provider, with the cost, the wait, and the layer that set it
// ("bucket" for the shared bucket; known for NewLimiter's limiter and a
// *limiter.Bucket) or the layer that refused the message.
func Throttle(l Limiter, cost CostFunc) Middleware {
	if cost == nil {
		cost = costOne
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, msg Message) error {
			n, err := cost(msg)
			if err != nil {
				return err
			}
			if err := awaitPaidSlots(ctx, msg, time.Now); err != nil {
				return err
			}
			var release func()
			if ws := startWait(ctx, n); ws != nil {
				release, err = ws.wait(ctx, l, msg, n)
			} else {
				switch ml := l.(type) {
				case SlotLimiter:
					release, err = ml.AcquireMessage(ctx, msg, n)
				case MessageLimiter:
					err = ml.WaitMessage(ctx, msg, n)
				default:
					err = l.Wait(ctx, n)
				}
			}
			if release != nil {
				defer release() // when the attempt returns, whatever its outcome
			}
			if err != nil {
				var le *limiter.LimitError
				switch {
				case errors.As(err, &le) && le.Action == limiter.ActionDelay && !errors.Is(err, limiter.ErrCostExceedsBurst):
					// A layer asks to set the message aside until it has
					// room. When it booked that room, the message carries
					// the slot (setaside.HeaderPaid) so that it passes the layer
					// when it comes back.
					return setaside.With(fmt.Errorf("waiting for %d tokens: %w", n, err), le.Wait, paidHeaders(msg, le))
				case errors.As(err, &le) && le.Action == limiter.ActionDeadLetter:
					// A layer refuses the message, or its cost can never
					// pass a layer: dead-lettered, naming the layer.
					return Permanent(fmt.Errorf("waiting for %d tokens: %w", n, limitRefusal{le}))
				case errors.Is(err, limiter.ErrCostExceedsBurst):
					return Permanent(fmt.Errorf("waiting for %d tokens: %w", n, err))
				case errors.Is(err, limiter.ErrClosed):
					return fmt.Errorf("waiting for %d tokens: %w (%w)", n, ErrAbandoned, err)
				}
				return fmt.Errorf("waiting for %d tokens: %w", n, err)
			}
			return next(ctx, msg)
		}
	}
}

// PushBack returns middleware that pauses the shared bucket when the handler
// returns an error made with RetryAfter, such as a sink's answer to an HTTP
// 429. Every replica that shares the bucket then waits, not only this one,
// because a provider's limit is global too. The pause is the delay the
// error carries; the Pauser caps it (a *limiter.Bucket at
// limiter.Options.MaxPause, the one cap), and it always ends by itself. A
// failure to pause is ignored: the handler's error still reaches the retry
// policy.
func PushBack(p Pauser) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, msg Message) error {
			err := next(ctx, msg)
			if d, ok := RetryAfterOf(err); ok && d > 0 {
				_ = p.Pause(ctx, d)
			}
			return err
		}
	}
}
