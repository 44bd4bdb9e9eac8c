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
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		return ra.RetryAfter(), true
	}
	return 0, false
}

// ErrAbandoned marks a message that was not handled and must be neither
// committed nor dead-lettered, so that the broker delivers it again. Process
// returns an Abandoned outcome for it. The Throttle middleware uses it when
// the limiter was closed under a running consumer, which happens during
// shutdown.
var ErrAbandoned = errors.New("message abandoned for redelivery")
