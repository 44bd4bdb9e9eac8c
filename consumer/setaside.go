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
// d inside the handler and call it again, with the same attempt number.
// SetAside(nil, d) returns nil.
func SetAside(err error, d time.Duration) error {
	return setaside.With(err, d, nil)
}
