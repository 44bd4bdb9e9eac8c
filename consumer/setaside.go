package consumer

import (
	"errors"
	"time"
)

// SetAside marks err as "not now": the message should come back after d,
// without holding a handler meanwhile, as a layered limit with on_exceed
// delay asks. It is neither a failure nor permanent: no attempt is counted
// and nothing is dead-lettered. A backend that can set messages aside
// (consumer/rabbitmq: a delay queue; consumer/kafka with SetAside: a delay
// topic) stores the message there and acks or commits it; the others wait
// d inside the handler and call it again (see RetryPolicy.Process).
// SetAside(nil, d) returns nil.
func SetAside(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &setAsideError{err: err, after: max(d, time.Millisecond)}
}

type setAsideError struct {
	err   error
	after time.Duration
}

func (e *setAsideError) Error() string { return e.err.Error() }
func (e *setAsideError) Unwrap() error { return e.err }

// SetAsideOf returns how long err, or an error it wraps, asked with
// SetAside to set the message aside. A permanent error is never set aside.
func SetAsideOf(err error) (time.Duration, bool) {
	var sa *setAsideError
	if errors.As(err, &sa) && !IsPermanent(err) {
		return sa.after, true
	}
	return 0, false
}
