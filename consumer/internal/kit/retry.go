package kit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// Outcome is how one message ended in Process.
type Outcome struct {
	// Attempts is the number of handler calls made, not counting those
	// that asked to set the message aside (consumer.SetAside); 1 for a
	// message that failed before its handler was called
	// (Processor.KeyFailed).
	Attempts int
	// Err is nil when the message was delivered. Otherwise it is the last
	// handler error, and the message must be dead-lettered, unless Abandoned
	// is set.
	Err error
	// Abandoned is set when ctx ended before the message was delivered or
	// dead-lettered. Such a message must not be committed or acked, so that
	// the broker delivers it again.
	Abandoned bool
	// SetAside, when positive, says that the handler asked
	// (consumer.SetAside) for the message to come back after that long;
	// Err holds its error. Only a Processor made with SetsAside returns
	// it: the backend sets the message aside, then commits or acks it, and
	// does not dead-letter it.
	SetAside time.Duration
	// Deduplicated is set when the message was not sent because its
	// dedupe key was already marked sent (consumer.Options.Dedupe): Err
	// is nil and the backend commits or acks it as delivered.
	Deduplicated bool
	// Marking is set, for a delivered message, when its dedupe mark is
	// still under way (a Processor made with MarksLater): the backend
	// commits or acks the message in Marking.Then, once it is marked.
	Marking *Marking
}

// Delivered reports whether the handler succeeded, or the message was
// already sent (Deduplicated): the backend commits or acks it.
func (o Outcome) Delivered() bool { return o.Err == nil && !o.Abandoned && o.SetAside == 0 }

// DeadLetterHeaders returns the headers that say why and from where a
// message was dead-lettered: consumer.HeaderError (when o has an error),
// consumer.HeaderAttempts, and the backend's position headers, which it
// passes in position. An error in o that has, or wraps an error that has,
// a method DeadLetterHeaders() map[string]string adds those headers too (a
// sink's "recipient gone", a layer's refusal); the consumer's own headers
// take precedence.
func (o Outcome) DeadLetterHeaders(position map[string]string) map[string]string {
	h := make(map[string]string, len(position)+2)
	maps.Copy(h, position)
	h[consumer.HeaderAttempts] = strconv.Itoa(o.Attempts)
	if o.Err == nil {
		return h
	}
	h[consumer.HeaderError] = o.Err.Error()
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

// SetAsideHeaders returns the headers that the message set aside for o
// (Outcome.SetAside) must come back with: a backend sets them on the copy
// it sets aside, removing those whose value is empty. It is nil when there
// are none.
func (o Outcome) SetAsideHeaders() map[string]string {
	if e := setaside.Of(o.Err); o.SetAside > 0 && e != nil {
		return e.Headers
	}
	return nil
}

// Returned returns msg as it comes back after being set aside for o: with
// o's SetAsideHeaders set. A backend that waits out the delay itself
// handles the returned message.
func (o Outcome) Returned(msg consumer.Message) consumer.Message {
	return withHeaders(msg, o.SetAsideHeaders())
}

// SetAsideOf returns how long err, or an error it wraps, asked with
// consumer.SetAside to set the message aside, as consumer.Throttle's error
// does for a layer with on_exceed delay. A permanent error is never set
// aside: it is dead-lettered.
func SetAsideOf(err error) (time.Duration, bool) {
	if sa := setaside.Of(err); sa != nil && !consumer.IsPermanent(err) {
		return sa.After, true
	}
	return 0, false
}

// RetryDelay returns how long p waits after the given failed attempt
// (1-based) before the next one: p.Backoff·2^(attempt-1), capped at
// p.MaxBackoff, with equal jitter (Backoff) so that replicas that failed
// together do not retry together. When err asks for a later retry with
// consumer.RetryAfter, the delay is at least that long. p's zero fields
// take their defaults.
func RetryDelay(p consumer.RetryPolicy, attempt int, err error) time.Duration {
	p = retryDefaults(p)
	d := Backoff{Initial: p.Backoff, Max: p.MaxBackoff}.Delay(attempt - 1)
	if after, ok := consumer.RetryAfterOf(err); ok && after > d {
		d = after
	}
	return d
}

// Process calls h for msg until it succeeds, fails permanently, or uses up
// p's attempts, sleeping RetryDelay between attempts. It sets msg.Attempt
// for each call and reports each event to obs, which may be nil.
//
// A handler error made with consumer.SetAside is not a failure: Process
// waits for its delay and calls h again with the same attempt number, and
// with the headers the error asks for (Outcome.Returned). (A Processor made
// with SetsAside returns such an Outcome instead, for the backend to set
// the message aside.) A failed attempt's retry is called without
// setaside.HeaderPaid: the slots a delay layer booked pay for one limiter
// wait. Only the first take of a returned message uses its marker.
//
// When ctx ends, during an attempt or a backoff, or the handler returns an
// error that wraps consumer.ErrAbandoned, Process stops and returns an
// Abandoned outcome. A handler that panics fails permanently with
// ErrHandlerPanic. Process is safe for concurrent use.
func Process(ctx context.Context, p consumer.RetryPolicy, h consumer.Handler, msg consumer.Message, obs *consumer.MessageObserver) Outcome {
	return process(ctx, p, h, msg, obs, false)
}

func process(ctx context.Context, p consumer.RetryPolicy, h consumer.Handler, msg consumer.Message, obs *consumer.MessageObserver, setAside bool) Outcome {
	p = retryDefaults(p)
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
			observeDelivered(obs, msg)
			return Outcome{Attempts: attempt}
		}
		if err == errDeduplicated {
			return Outcome{Attempts: attempt - 1, Deduplicated: true}
		}
		if ctx.Err() != nil || errors.Is(err, consumer.ErrAbandoned) {
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
		msg = withHeaders(msg, map[string]string{setaside.HeaderPaid: ""})
		observeFailed(obs, msg, err)
		if consumer.IsPermanent(err) || attempt >= p.MaxAttempts {
			return Outcome{Attempts: attempt, Err: err}
		}
		delay := RetryDelay(p, attempt, err)
		observeRetried(obs, msg, err, delay)
		spanRetried(ctx, attempt, err, delay)
		if !wait(delay) {
			return Outcome{Attempts: attempt, Err: err, Abandoned: true}
		}
	}
}

// ErrHandlerPanic is wrapped, as a permanent error, when a handler panics.
// The panic is recovered so that one poison message is dead-lettered instead
// of crashing every replica that receives it in turn.
var ErrHandlerPanic = errors.New("handler panicked")

func call(ctx context.Context, h consumer.Handler, msg consumer.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = consumer.Permanent(fmt.Errorf("%w: %v", ErrHandlerPanic, r))
		}
	}()
	return h(ctx, msg)
}

// withHeaders returns msg with h set in a copy of its headers: an empty
// value removes the header.
func withHeaders(msg consumer.Message, h map[string]string) consumer.Message {
	if len(h) == 0 {
		return msg
	}
	headers := maps.Clone(msg.Headers)
	if headers == nil {
		headers = make(map[string]string, len(h))
	}
	for k, v := range h {
		if v == "" {
			delete(headers, k)
		} else {
			headers[k] = v
		}
	}
	msg.Headers = headers
	return msg
}
