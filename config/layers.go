package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/msgtmpl"
)

// LimitLayer is one further limit under limit.extra, decided with the
// shared bucket in one atomic step (see limiter.Layer): a keyed bucket
// (rate, burst) or a calendar quota (quota, per, timezone). It is a plain
// value: safe to read concurrently, not to mutate concurrently.
type LimitLayer struct {
	// Name names the layer in metrics, logs and the dead-letter header
	// x-throttle-limit. Required, unique; limiter.Layers.Validate says which
	// names are valid.
	Name string `yaml:"name"`
	// Key is a message template (sinks/msgtmpl, the data and functions of
	// the HTTP sink's templates) giving the message's key in this layer,
	// such as {{.JSON.to}}: one bucket or quota per key. Empty means one
	// state shared by every message. A message for which it fails (a
	// field that is missing or JSON null, a body that is not JSON; see
	// msgtmpl.Render) or renders empty is dead-lettered with the reason.
	Key string `yaml:"key,omitempty"`
	// Rate and Burst make a keyed token bucket. Rate is a number per
	// second or "N/s", "N/min", "N/h", "N/d"; Burst defaults to
	// one second of tokens (limiter.Layers.Validate).
	Rate  float64 `yaml:"rate,omitempty" check:"rate"`
	Burst int     `yaml:"burst,omitempty" check:"nonzero"`
	// Quota makes a calendar quota instead of a bucket: at most Quota
	// tokens per Per (hour, day or month) in Timezone (an IANA name,
	// default UTC), reset at the window's start.
	Quota    int    `yaml:"quota,omitempty" check:"nonzero"`
	Per      string `yaml:"per,omitempty"`
	Timezone string `yaml:"timezone,omitempty"`
	// OnExceed is wait (the default), dead_letter or delay.
	OnExceed string `yaml:"on_exceed,omitempty"`
	// MaxWait is how long a message may wait for this layer before
	// OnExceed (dead_letter or delay) applies. Default 0: no wait.
	MaxWait Duration `yaml:"max_wait,omitempty"`
}

// Layers maps limit.extra onto the limiter's layers. Its error names the
// YAML key of an unknown time zone; Validate reports every problem.
func (l Limit) Layers() ([]limiter.Layer, error) {
	layers, errs := l.layers()
	return layers, errors.Join(errs...)
}

func (l Limit) layers() ([]limiter.Layer, []error) {
	var errs []error
	out := make([]limiter.Layer, len(l.Extra))
	for i, x := range l.Extra {
		out[i] = limiter.Layer{
			Name: x.Name, Keyed: x.Key != "",
			Rate: x.Rate, Burst: x.Burst,
			Quota: x.Quota, Per: limiter.Period(x.Per),
			OnExceed: limiter.Action(x.OnExceed), MaxWait: time.Duration(x.MaxWait),
		}
		if x.Timezone != "" {
			loc, err := time.LoadLocation(x.Timezone)
			if err != nil {
				errs = append(errs, fmt.Errorf("limit.extra[%d].timezone: unknown time zone %q", i, x.Timezone))
				continue
			}
			out[i].Location = loc
		}
	}
	return out, errs
}

// LayerKeys returns a function giving a message's key in every keyed layer
// of limit.extra, by layer name, or nil when no layer has a key. The
// function decodes the message once for all templates; for a template that
// fails or renders empty it returns a consumer.Permanent error naming the
// layer and its YAML key.
func (l Limit) LayerKeys() (func(consumer.Message) (map[string]string, error), error) {
	var keys []msgtmpl.LayerKey
	for i, x := range l.Extra {
		if x.Key != "" {
			keys = append(keys, msgtmpl.LayerKey{Layer: x.Name, Name: "limit.extra[" + strconv.Itoa(i) + "].key", Text: x.Key})
		}
	}
	return msgtmpl.KeysFunc(keys)
}

// validateExtra checks limit.extra: the key templates, the time zones, and
// the layers themselves with limiter.Layers.Validate, each problem under
// its YAML key.
func (l *Limit) validateExtra(ps *problems) {
	for i, x := range l.Extra {
		if x.Key != "" {
			key := fmt.Sprintf("limit.extra[%d].key", i)
			if _, err := msgtmpl.Parse(key, x.Key); err != nil {
				ps.add(key, "%s", err)
			}
		}
		if x.Quota == 0 && x.Rate == 0 && x.Per == "" {
			ps.add(fmt.Sprintf("limit.extra[%d]", i), "set rate (a keyed bucket) or quota and per (a quota)")
		}
	}
	layers, errs := l.layers()
	for _, err := range errs {
		key, msg, _ := strings.Cut(err.Error(), ": ")
		ps.add(key, "%s", msg)
	}
	for _, err := range leaves(limiter.Layers(layers).Validate()) {
		var pe *limiter.ParamError
		if !errors.As(err, &pe) {
			ps.add("limit.extra", "%s", err)
			continue
		}
		// Param is "Layers[i].Field".
		idx, field, ok := strings.Cut(strings.TrimPrefix(pe.Param, "Layers["), "].")
		i, aerr := strconv.Atoi(idx)
		if !ok || aerr != nil || i < 0 || i >= len(l.Extra) {
			ps.add("limit.extra", "%s", err)
			continue
		}
		if field == "Rate" && l.Extra[i].Rate == 0 && l.Extra[i].Quota == 0 && l.Extra[i].Per == "" {
			continue // reported above
		}
		yamlKey := map[string]string{"Location": "timezone", "Keyed": "key"}[field]
		if yamlKey == "" {
			yamlKey = yamlKeyOf(reflect.TypeFor[LimitLayer](), field)
		}
		ps.add(fmt.Sprintf("limit.extra[%d].%s", i, yamlKey), "%s", paramMessage(pe))
	}
}
