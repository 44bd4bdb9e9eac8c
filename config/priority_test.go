package config

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

func TestLimitPriorityMapsOntoTheLimiter(t *testing.T) {
	cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  priority: low\n  priority_header: x-priority\n  min_share: {low: 0.1, normal: 0.2}", 1), nil)
	opts := libs(t, cfg).Limiter
	if opts.Priority != limiter.PriorityLow {
		t.Errorf("Priority = %v, want low", opts.Priority)
	}
	want := limiter.Shares{}
	want[limiter.PriorityLow], want[limiter.PriorityNormal] = 0.1, 0.2
	if opts.MinShare != want {
		t.Errorf("MinShare = %v, want %v", opts.MinShare, want)
	}
	// Round trip through String.
	again := mustParse(t, cfg.String(), nil)
	if o := libs(t, again).Limiter; o.Priority != limiter.PriorityLow || o.MinShare != want || again.Limit.PriorityHeader != "x-priority" {
		t.Errorf("after String(): %+v", again.Limit)
	}
	// Left out: normal, no floor, every message in its replica's class.
	def := libs(t, mustParse(t, minimal, nil))
	if o := def.Limiter; o.Priority != limiter.PriorityNormal || o.MinShare != (limiter.Shares{}) {
		t.Errorf("without the keys: Priority %v, MinShare %v", o.Priority, o.MinShare)
	}
	// Without priority_header every message has the bucket's class: the
	// limiter's Priority, and none of the consumer's.
	if def.Limit.Priority != nil {
		t.Error("without priority_header, a class function")
	}
}

// TestLimitPriorityOfAMessage: the header's class when it is set, the
// replica's class without it, and a permanent error naming the header for a
// value that is not a class, the empty one too.
func TestLimitPriorityOfAMessage(t *testing.T) {
	cfg := mustParse(t, strings.Replace(minimal, "rate: 10", "rate: 10\n  priority: low\n  priority_header: x-priority", 1), nil)
	class := libs(t, cfg).Limit.Priority
	for _, c := range []struct {
		headers map[string]string
		want    limiter.Priority
		bad     bool
	}{
		{nil, limiter.PriorityLow, false},
		{map[string]string{"x-priority": ""}, 0, true},
		{map[string]string{"x-priority": "high"}, limiter.PriorityHigh, false},
		{map[string]string{"x-priority": "normal"}, limiter.PriorityNormal, false},
		{map[string]string{"x-priority": "low"}, limiter.PriorityLow, false},
		{map[string]string{"x-priority": "urgent"}, 0, true},
		{map[string]string{"x-priority": "High"}, 0, true},
	} {
		p, err := class(consumer.Message{Headers: c.headers})
		switch {
		case c.bad:
			v := c.headers["x-priority"]
			if v == "" {
				v = "empty"
			}
			if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `priority header "x-priority"`) || !strings.Contains(err.Error(), v) {
				t.Errorf("headers %v: err %v, want a permanent error naming the header and the value", c.headers, err)
			}
		case err != nil || p != c.want:
			t.Errorf("headers %v: %v, %v; want %v", c.headers, p, err, c.want)
		}
	}
}

func TestLimitPriorityErrorsNameTheKey(t *testing.T) {
	for _, c := range []struct{ yaml, key, msg string }{
		{"priority: urgent", "limit.priority", `must be high, normal or low, got "urgent"`},
		{"priority: 2", "limit.priority", `must be high, normal or low, got "2"`},
		{"min_share: {low: 1.5}", "limit.min_share.low", "must be a fraction >= 0 and < 1, got 1.5"},
		{"min_share: {normal: -0.1}", "limit.min_share.normal", "must be a fraction >= 0 and < 1"},
		{"min_share: {low: 0.6, normal: 0.5}", "limit.min_share", "the shares must add up to less than 1"},
		{"min_share: {urgent: 0.1}", "limit.min_share", `a key must be high, normal or low, got "urgent"`},
		{"min_share: {low: lots}", "limit.min_share.low", ""},
		{"min_share: 0.1", "limit.min_share", "expected a mapping"},
	} {
		_, err := Parse([]byte(strings.Replace(minimal, "rate: 10", "rate: 10\n  "+c.yaml, 1)), nil)
		if err == nil {
			t.Errorf("%s: accepted", c.yaml)
			continue
		}
		found := false
		for _, p := range problemsOf(t, err) {
			if p.Key == c.key && strings.Contains(p.Message, c.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: %v; want %s: ...%s", c.yaml, err, c.key, c.msg)
		}
	}
}
