package consumer

import (
	"time"

	"github.com/throttlehq/throttle/consumer/internal/setaside"
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
	return SetAsideWith(err, d, nil)
}

// SetAsideWith is SetAside for a message that should come back with the
// headers h set (an empty value: removed), such as HeaderPaid after a
// delay layer booked its slot. The backend writes them with the copy it
// sets aside; one that waits in the handler calls it again with them
// (Outcome.Returned).
func SetAsideWith(err error, d time.Duration, h map[string]string) error {
	return setaside.With(err, d, h)
}

// SetAsideOf returns how long err, or an error it wraps, asked with
// SetAside to set the message aside. A permanent error is never set aside.
func SetAsideOf(err error) (time.Duration, bool) {
	if sa := setaside.Of(err); sa != nil && !IsPermanent(err) {
		return sa.After, true
	}
	return 0, false
}

// SetAsideHeaders returns the headers that the message set aside for o
// (Outcome.SetAside) must come back with (see SetAsideWith): a backend
// sets them on the copy it sets aside, removing those whose value is
// empty. It is nil when there are none.
func (o Outcome) SetAsideHeaders() map[string]string {
	if sa := setaside.Of(o.Err); o.SetAside > 0 && sa != nil {
		return sa.Headers
	}
	return nil
}

// Returned returns msg as it comes back after being set aside for o: with
// o's SetAsideHeaders set. A backend that waits out the delay itself
// handles the returned message.
func (o Outcome) Returned(msg Message) Message {
	return withHeaders(msg, o.SetAsideHeaders())
}
