package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/throttlehq/throttle/limiter"
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
	// Concurrency makes an in-flight cap instead: at most Concurrency
	// messages of a key (or of the layer, without a key) in the sink at
	// once, across every replica (limiter.Layer.Concurrency).
	Concurrency int `yaml:"concurrency,omitempty" check:"nonzero"`
	// Lease is how long a concurrency slot is held at most, for a replica
	// that dies holding it. Default: the sink's timeout (sink.http.timeout)
	// times delivery.max_attempts, else limiter.DefaultLease (1m).
	Lease Duration `yaml:"lease,omitempty" check:"nonzero"`
	// OnExceed is wait (the default), dead_letter or delay.
	OnExceed string `yaml:"on_exceed,omitempty"`
	// MaxWait is the longest wait for this layer that a message is
	// granted (limiter.Layer.MaxWait): a message that would wait longer
	// is refused at once under OnExceed, dead_letter or delay. Default 0:
	// any wait for this layer is refused. It is not a timeout, unlike
	// limit.max_wait.
	MaxWait Duration `yaml:"max_wait,omitempty"`
	// Shadow makes the layer a shadow (limiter.Layer.Shadow): decided
	// and counted (throttle_limit_exceeded_total{shadow="true"}), never
	// enforced, with a state of its own. Default false.
	Shadow bool `yaml:"shadow,omitempty"`
	// Window makes a send window instead (limiter.Window): messages go
	// out only while the recipient's local time is inside it, and are
	// set aside until it opens (on_exceed defaults to delay). Timezone is
	// then an IANA name or e164, the zone of each recipient's number
	// (Key must give the number, e.g. {{e164 .JSON.to}}), with
	// DefaultTimezone for a number that cannot be placed; Countries
	// override the window by ISO 3166 code; Exempt lists the classes
	// (high, normal, low) it does not hold back. See docs/windows.md.
	Window          *LimitWindow           `yaml:"window,omitempty"`
	DefaultTimezone string                 `yaml:"default_timezone,omitempty"`
	Countries       map[string]LimitWindow `yaml:"countries,omitempty"`
	Exempt          []string               `yaml:"exempt,omitempty"`
	// Budget makes a spend budget instead (limiter.Layer.Budget): at most
	// Budget, in limit.prices.currency, per Per in Timezone, each message
	// charged its price (limit.prices). See docs/budgets.md.
	Budget Money `yaml:"budget,omitempty"`
}

// Layers maps limit.extra onto the limiter's layers: Libraries.Layers,
// for the operator commands that need the layers alone. Its error is a
// *ValidationError naming the YAML key of an unknown time zone; Validate
// reports every problem.
func (l Limit) Layers() ([]limiter.Layer, error) {
	var ps problems
	layers := l.layers(&ps)
	if len(ps) > 0 {
		return nil, &ValidationError{Problems: ps}
	}
	return layers, nil
}

// layers maps limit.extra onto the limiter's layers, nil without; an
// unknown time zone is a problem and left out.
func (l *Limit) layers(ps *problems) []limiter.Layer {
	if len(l.Extra) == 0 {
		return nil
	}
	out := make([]limiter.Layer, len(l.Extra))
	for i, x := range l.Extra {
		out[i] = limiter.Layer{
			Name: x.Name, Keyed: x.Key != "",
			Rate: x.Rate, Burst: x.Burst,
			Quota: x.Quota, Per: limiter.Period(x.Per),
			Concurrency: x.Concurrency, Lease: time.Duration(x.Lease),
			OnExceed: limiter.Action(x.OnExceed), MaxWait: time.Duration(x.MaxWait),
			Shadow: x.Shadow,
		}
		x.policyLayer(ps, i, &out[i])
		if x.Timezone != "" && x.Window == nil {
			loc, err := time.LoadLocation(x.Timezone)
			if err != nil {
				ps.add(fmt.Sprintf("limit.extra[%d].timezone", i), "unknown time zone %q", x.Timezone)
				continue
			}
			out[i].Location = loc
		}
	}
	return out
}

// validateLayers records the problems limiter.Layers.Validate finds in
// layers, mapped from limit.extra, each under its YAML key. Validate fills
// in the layers' defaults in place.
func (l *Limit) validateLayers(ps *problems, layers []limiter.Layer) {
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
		yamlKey := map[string]string{"Location": "timezone", "Keyed": "key", "Window.Location": "timezone", "Window.Exempt": "exempt"}[field]
		if yamlKey == "" && strings.HasPrefix(field, "Window.Countries") {
			yamlKey = "countries"
		} else if yamlKey == "" && strings.HasPrefix(field, "Window") {
			yamlKey = "window"
		}
		if yamlKey == "" {
			yamlKey = yamlKeyOf(reflect.TypeFor[LimitLayer](), field)
		}
		ps.add(fmt.Sprintf("limit.extra[%d].%s", i, yamlKey), "%s", paramMessage(pe))
	}
}
