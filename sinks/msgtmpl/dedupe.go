package msgtmpl

import (
	"errors"

	"github.com/throttlehq/throttle/consumer"
)

// DedupeKeyFunc parses text as the template of a message's dedupe key
// (consumer.Dedupe.Key), named name (such as "delivery.dedupe.key"), and
// returns the consumer.KeyFunc that renders it, spaces kept. A missing or
// null value (ErrNoValue: a header the message lacks) renders the empty
// key, which consumer.Dedupe reads as "this message has no key"; any
// other failure (a body that is not JSON, a limit reached) is a
// consumer.Permanent error, so the message is dead-lettered with the
// reason. A parse error is returned at once. The KeyFunc is safe for
// concurrent use.
func DedupeKeyFunc(name, text string) (consumer.KeyFunc, error) {
	c, err := compile(name, text)
	if err != nil {
		return nil, err
	}
	return func(msg consumer.Message) (string, error) {
		var d *Data
		out, err := c.render(msg, &d)
		switch {
		case errors.Is(err, ErrNoValue):
			return "", nil
		case err != nil:
			return "", consumer.Permanent(err)
		}
		return out, nil
	}, nil
}
