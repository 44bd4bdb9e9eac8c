package consumer_test

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// TestPriorityFromHeader: a message without the header has the default
// class; a class name gives that class; any other value, the empty one
// too, is a permanent error naming the header and the value.
func TestPriorityFromHeader(t *testing.T) {
	msg := func(v string) consumer.Message {
		return consumer.Message{Headers: map[string]string{"x-priority": v}}
	}
	for _, c := range []struct {
		name string
		msg  consumer.Message
		want limiter.Priority
		bad  bool
	}{
		{"x-priority", consumer.Message{}, limiter.PriorityLow, false},
		{"x-priority", msg(""), 0, true},
		{"x-priority", msg("high"), limiter.PriorityHigh, false},
		{"x-priority", msg("normal"), limiter.PriorityNormal, false},
		{"", msg("high"), limiter.PriorityLow, false},
		{"x-priority", msg("urgent"), 0, true},
	} {
		p, err := consumer.PriorityFromHeader(c.name, limiter.PriorityLow)(c.msg)
		switch {
		case c.bad:
			v := c.msg.Headers["x-priority"]
			if v == "" {
				v = "empty"
			}
			if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `priority header "x-priority"`) || !strings.Contains(err.Error(), v) {
				t.Errorf("%q in %q: %v, want a permanent error naming the header and the value", c.msg.Headers, c.name, err)
			}
		case err != nil || p != c.want:
			t.Errorf("%q in %q: %v, %v; want %v", c.msg.Headers, c.name, p, err, c.want)
		}
	}
}
