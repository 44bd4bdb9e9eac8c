package msgtmpl

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/throttlehq/throttle/consumer"
)

// CostFunc parses text as a cost template named name (for example
// "limit.cost_template") and returns a consumer.CostFunc that renders it
// for each message. The rendering, spaces trimmed, must be a positive
// integer: {{sms_segments .JSON.text}} costs an SMS by its segments. A
// template that fails for a message (see Render: a null or missing field,
// a body that is not JSON, a run past the limits such as MaxSteps), or
// renders anything else, makes a
// consumer.Permanent error naming the template and quoting (at most 64
// bytes of) what it rendered, so the message is dead-lettered with the
// reason rather than sent at a guessed cost. A parse error is returned at
// once. The CostFunc is safe for concurrent use.
func CostFunc(name, text string) (consumer.CostFunc, error) {
	c, err := compile(name, text)
	if err != nil {
		return nil, err
	}
	return func(msg consumer.Message) (int, error) {
		var d *Data
		out, err := c.render(msg, &d)
		if err != nil {
			return 0, consumer.Permanent(err)
		}
		s := strings.TrimSpace(out)
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			if len(s) > 64 {
				s = s[:64] + "…"
			}
			return 0, consumer.Permanent(fmt.Errorf("%s: rendered %q, not a positive integer", name, s))
		}
		return n, nil
	}, nil
}
