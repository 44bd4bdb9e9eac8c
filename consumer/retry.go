package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// RetryPolicy decides how often and how long apart a failed handler is
// retried. The zero value uses the documented defaults. A RetryPolicy is a
// plain value and safe for concurrent use.
type RetryPolicy struct {
	// MaxAttempts is the number of handler calls before a message is
	// dead-lettered, counting the first. Default 5; 1 disables retries.
	MaxAttempts int
	// Backoff is the delay before the second attempt. It doubles with each
	// further attempt. Default 200ms.
	Backoff time.Duration
	// MaxBackoff caps the delay; set with Backoff, it must not be below
	// it (Options.Validate). Default 30s, or Backoff when that is longer.
	MaxBackoff time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
	if p.Backoff <= 0 {
		p.Backoff = 200 * time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = 30 * time.Second
	}
	if p.MaxBackoff < p.Backoff {
		p.MaxBackoff = p.Backoff
	}
	return p
}

// Delay returns how long to wait after the given failed attempt (1-based)
// before the next one: Backoff·2^(attempt-1), capped at MaxBackoff, with
// equal jitter (see consumer.Backoff) so that replicas that failed together
// do not retry together. When err asks for a later retry with RetryAfter,
// the delay is at least that long.
func (p RetryPolicy) Delay(attempt int, err error) time.Duration {
	p = p.withDefaults()
	d := Backoff{Initial: p.Backoff, Max: p.MaxBackoff}.Delay(attempt - 1)
	if after, ok := RetryAfterOf(err); ok && after > d {
		d = after
	}
	return d
}

// Outcome is how one message ended in Process.
type Outcome struct {
	// Attempts is the number of handler calls made, not counting those
	// that asked to set the message aside (SetAside); 1 for a message
	// that failed before its handler was called (Processor.KeyFailed).
	Attempts int
	// Err is nil when the message was delivered. Otherwise it is the last
	// handler error, and the message must be dead-lettered, unless Abandoned
	// is set.
	Err error
	// Abandoned is set when ctx ended before the message was delivered or
	// dead-lettered. Such a message must not be committed or acked, so that
	// the broker delivers it again.
	Abandoned bool
	// SetAside, when positive, says that the handler asked (SetAside) for
	// the message to come back after that long; Err holds its error. Only
	// a Processor made with SetsAside returns it: the backend sets the
	// message aside, then commits or acks it, and does not dead-letter it.
	SetAside time.Duration
}

// Delivered reports whether the handler succeeded.
func (o Outcome) Delivered() bool { return o.Err == nil && !o.Abandoned && o.SetAside == 0 }

// Process calls h for msg until it succeeds, fails permanently, or uses up
// the policy's attempts, sleeping Delay between attempts. It sets
// msg.Attempt for each call and reports each failure to obs, which may be nil.
//
// A handler error made with SetAside is not a failure: Process waits for
// its delay and calls h again with the same attempt number, and with the
// headers the error asks for (SetAsideWith). (A backend's Processor made
// with SetsAside returns such an Outcome instead, for the backend to set
// the message aside.) A failed attempt's retry is called without
// HeaderPaid: the slots a delay layer booked pay for one limiter wait.
// Only the first take of a returned message uses its marker.
//
// When ctx ends, during an attempt or a backoff, or the handler returns an
// error that wraps ErrAbandoned, Process stops and returns an Abandoned
// outcome. Process is safe for concurrent use.
func (p RetryPolicy) Process(ctx context.Context, h Handler, msg Message, obs *MessageObserver) Outcome {
	return p.process(ctx, h, msg, obs, false)
}

func (p RetryPolicy) process(ctx context.Context, h Handler, msg Message, obs *MessageObserver, setAside bool) Outcome {
	p = p.withDefaults()
	var timer *time.Timer
	wait := func(d time.Duration) bool {
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 1; ; attempt++ {
		msg.Attempt = attempt
		err := call(ctx, h, msg)
		if err == nil {
			obs.delivered(msg)
			return Outcome{Attempts: attempt}
		}
		if ctx.Err() != nil || errors.Is(err, ErrAbandoned) {
			return Outcome{Attempts: attempt, Err: err, Abandoned: true}
		}
		if d, ok := SetAsideOf(err); ok {
			out := Outcome{Attempts: attempt - 1, Err: err, SetAside: d}
			if setAside {
				return out
			}
			if !wait(d) {
				return Outcome{Attempts: attempt - 1, Err: err, Abandoned: true}
			}
			msg = out.Returned(msg) // as a backend would set it aside
			attempt--               // not an attempt: call again with the same number
			continue
		}
		// The slots the message paid for when it was set aside served
		// this attempt's limiter wait; the next attempt pays again.
		msg = withHeaders(msg, map[string]string{HeaderPaid: ""})
		obs.failed(msg, err)
		if IsPermanent(err) || attempt >= p.MaxAttempts {
			return Outcome{Attempts: attempt, Err: err}
		}
		delay := p.Delay(attempt, err)
		obs.retry(msg, err, delay)
		if !wait(delay) {
			return Outcome{Attempts: attempt, Err: err, Abandoned: true}
		}
	}
}

// ErrHandlerPanic is wrapped, as a Permanent error, when a handler panics.
// The panic is recovered so that one poison message is dead-lettered instead
// of crashing every replica that receives it in turn.
var ErrHandlerPanic = errors.New("handler panicked")

func call(ctx context.Context, h Handler, msg Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Permanent(fmt.Errorf("%w: %v", ErrHandlerPanic, r))
		}
	}()
	return h(ctx, msg)
}

// Header names that the consumers add to a dead-lettered message: the
// reason (HeaderError, HeaderAttempts, the same for every backend) and the
// message's original position, which each backend supplies: topic,
// partition and offset for Kafka; queue, exchange and routing key for
// RabbitMQ.
const (
	HeaderError              = "x-throttle-error"
	HeaderAttempts           = "x-throttle-attempts"
	HeaderOriginalTopic      = "x-throttle-original-topic"
	HeaderOriginalPartition  = "x-throttle-original-partition"
	HeaderOriginalOffset     = "x-throttle-original-offset"
	HeaderOriginalQueue      = "x-throttle-original-queue"
	HeaderOriginalExchange   = "x-throttle-original-exchange"
	HeaderOriginalRoutingKey = "x-throttle-original-routing-key"
)

// DeadLetterHeaders returns the headers that say why and from where a
// message was dead-lettered: HeaderError (when o has an error),
// HeaderAttempts, and the backend's position headers, which it passes in
// position (HeaderOriginalTopic..., HeaderOriginalQueue...). An error in o
// that has, or wraps an error that has, a method DeadLetterHeaders()
// map[string]string adds those headers too (a sink's "recipient gone", for
// example); the consumer's own headers take precedence.
func (o Outcome) DeadLetterHeaders(position map[string]string) map[string]string {
	h := make(map[string]string, len(position)+2)
	for k, v := range position {
		h[k] = v
	}
	h[HeaderAttempts] = strconv.Itoa(o.Attempts)
	if o.Err == nil {
		return h
	}
	h[HeaderError] = o.Err.Error()
	var extra interface{ DeadLetterHeaders() map[string]string }
	if errors.As(o.Err, &extra) {
		for k, v := range extra.DeadLetterHeaders() {
			if _, taken := h[k]; !taken {
				h[k] = v
			}
		}
	}
	return h
}
