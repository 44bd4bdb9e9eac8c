package msgtmpl

import (
	"fmt"

	"github.com/throttlehq/throttle/consumer"
)

// LayerKey is the key template of one keyed layer of a bucket
// (limiter.Layer.Keyed), such as '{{.JSON.to}}' for a per-recipient layer.
type LayerKey struct {
	// Layer is the layer's name (limiter.Layer.Name).
	Layer string
	// Name names the template in errors, such as its YAML key.
	Name string
	// Text is the template, with the data and functions of this package.
	Text string
}

// KeysFunc returns a function giving a message's key in every layer of
// keys, by layer name: consumer.LimitOptions.Keys. A template that is one
// field, such as '{{.JSON.to}}' or '{{index .Headers "x-tenant"}}', is
// read from the message without decoding the whole body; the others
// share one decoding of the message. A template that fails (a missing or null
// value, a body that is not JSON) or renders empty returns a
// consumer.Permanent error naming the layer and the template, so that the
// message is dead-lettered with the reason. KeysFunc returns an error for
// a template that does not parse, and nil for no keys. The function is
// safe for concurrent use.
func KeysFunc(keys []LayerKey) (func(consumer.Message) (map[string]string, error), error) {
	type parsed struct {
		LayerKey
		c *compiled
	}
	ps := make([]parsed, 0, len(keys))
	for _, k := range keys {
		c, err := compile(k.Name, k.Text)
		if err != nil {
			return nil, err
		}
		ps = append(ps, parsed{k, c})
	}
	if len(ps) == 0 {
		return nil, nil
	}
	return func(m consumer.Message) (map[string]string, error) {
		var d *Data // built for the first template the fast path cannot render
		out := make(map[string]string, len(ps))
		for _, k := range ps {
			s, err := k.c.render(m, &d)
			if err != nil {
				return nil, consumer.Permanent(fmt.Errorf("the key of limit %q (%s): %w", k.Layer, k.Name, err))
			}
			if s == "" {
				return nil, consumer.Permanent(fmt.Errorf("the key of limit %q (%s) rendered empty", k.Layer, k.Name))
			}
			out[k.Layer] = s
		}
		return out, nil
	}, nil
}
