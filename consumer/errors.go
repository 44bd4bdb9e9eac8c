package consumer

import (
	"errors"
	"time"
)

// ErrPermanent is the sentinel that Permanent errors match with errors.Is. A
// handler may also return it directly, or wrap it with fmt.Errorf("...: %w",
// ErrPermanent).
var ErrPermanent = errors.New("permanent failure")

// Permanent marks err as permanent: retrying cannot help (a 400 from an HTTP
// provider, a payload that does not parse). The consumer dead-letters such a
// message at once. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrPermanent) true for every Permanent error.
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// IsPermanent reports whether err, or any error it wraps, is permanent.
// It is the one classification the retry and dead-letter path uses: every
// error that is not permanent is retryable.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrPermanent)
}

// RetryAfter marks err as retryable no sooner than d from now, as a provider
// asks with an HTTP 429 or 503 and a Retry-After header. The retry policy
// waits at least d before the next attempt, and the PushBack middleware
// pauses the shared bucket for d so that every replica slows down.
// RetryAfter(nil, d) returns nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string             { return e.err.Error() }
func (e *retryAfterError) Unwrap() error             { return e.err }
func (e *retryAfterError) RetryAfter() time.Duration { return e.after }

// RetryAfterOf returns the delay that err, or an error it wraps, asked for
// with RetryAfter. Any error type with a method RetryAfter() time.Duration
// counts.
func RetryAfterOf(err error) (time.Duration, bool) {
	if err == nil {
		// Every delivered message comes here (PushBack): no target
		// for errors.As to allocate.
		return 0, false
	}
	if ra, ok := errors.AsType[interface {
		error
		RetryAfter() time.Duration
	}](err); ok {
		return ra.RetryAfter(), true
	}
	return 0, false
}

// ErrAbandoned marks a message that was not handled and must be neither
// committed nor dead-lettered, so that the broker delivers it again: a
// handler may return it (wrapped or not), and the Throttle middleware
// returns it when the limiter was closed under a running consumer, which
// happens during shutdown. The backends leave such a message for
// redelivery without counting an attempt as failed.
var ErrAbandoned = errors.New("message abandoned for redelivery")

// ErrStopped is returned by a backend's Run when Run was called before, or
// after Close: a consumer runs once. (A limiter.Bucket after Close returns
// limiter.ErrClosed.)
var ErrStopped = errors.New("consumer stopped")

// ErrAccessRefused is wrapped by the error a backend's Run returns when the
// broker refuses the consumer's credentials or permissions when it starts:
// a wrong user or password, a virtual host it may not use, a queue or topic
// it may not read. Retrying cannot fix that, so Run gives up at once and
// the binary exits 1. Once Run has consumed, such errors (a password
// rotated under a running replica) are retried: the consumer reports
// itself disconnected (Consumer.Connected) and counts each attempt
// (MessageObserver.ReconnectAttempt).
var ErrAccessRefused = errors.New("access refused by the broker")

// ErrNotConnected is wrapped by the errors of Consumer.Connected, and
// of calls that need a live broker connection, while a backend has none:
// before Run connected, while it reconnects, and after it returned.
var ErrNotConnected = errors.New("not connected to the broker")
