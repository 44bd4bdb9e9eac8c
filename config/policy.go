package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/msgtmpl"
)

// Money is an amount of money, written in YAML as a decimal number such as
// 500.00 or 0.0079 and kept as written, exactly: at most six decimals
// (limiter.ParseAmount). Convert it with Amount. A Money is a plain value
// and safe for concurrent use.
type Money string

// UnmarshalYAML reads a scalar node with limiter.ParseAmount.
func (m *Money) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("expected an amount such as 0.0079, got %s", describeNode(n))
	}
	if _, err := limiter.ParseAmount(n.Value); err != nil {
		return fmt.Errorf("invalid amount %q: a decimal number >= 0 with at most 6 decimals", n.Value)
	}
	*m = Money(n.Value)
	return nil
}

// Amount returns m in micro-units; 0 for "" or an invalid amount (which
// Parse rejects).
func (m Money) Amount() limiter.Amount {
	a, _ := limiter.ParseAmount(string(m))
	return a
}

// LimitPrices are what a message costs by its recipient's country (YAML
// key limit.prices), charged on the budget layers of limit.extra
// (limiter.Prices). It is a plain value.
type LimitPrices struct {
	// Currency names the unit of the prices and budgets ("USD"), for
	// people.
	Currency string `yaml:"currency,omitempty"`
	// Default is the price of a recipient whose country has none.
	Default Money `yaml:"default,omitempty"`
	// PerSegment charges the price once per unit of the message's cost
	// (limit.cost_template, its SMS segments).
	PerSegment bool `yaml:"per_segment,omitempty"`
	// Countries are prices by ISO 3166 code ("GB").
	Countries map[string]Money `yaml:"countries,omitempty"`
	// Recipient is a message template giving the recipient's telephone
	// number, for Countries. Default: the key of the first layer of
	// limit.extra that is a window with timezone e164.
	Recipient string `yaml:"recipient,omitempty"`
}

// LimitWindow is the daily open time of a send window (limit.extra[].window
// and its countries): From until To (exclusive), "HH:MM" in local time, on
// Days ("mon-fri", "mon-sat,sun"; default every day). From after To spans
// midnight.
type LimitWindow struct {
	From string `yaml:"from"`
	To   string `yaml:"to"`
	Days string `yaml:"days,omitempty"`
}

// timezoneE164 is the timezone of a window that takes each recipient's
// zone from its number.
const timezoneE164 = "e164"

// calendar maps w onto a limiter.Calendar; a problem is recorded at key.
func (w LimitWindow) calendar(ps *problems, key string) limiter.Calendar {
	var c limiter.Calendar
	var err error
	if c.From, err = limiter.ParseClock(w.From); err != nil {
		ps.add(key+".from", "must be HH:MM or HH:MM:SS (00:00 to 24:00), got %q", w.From)
	}
	if c.To, err = limiter.ParseClock(w.To); err != nil {
		ps.add(key+".to", "must be HH:MM or HH:MM:SS (00:00 to 24:00), got %q", w.To)
	}
	if c.Days, err = limiter.ParseWeekdays(w.Days); err != nil {
		ps.add(key+".days", "%s", paramMessage(err))
	}
	return c
}

// policyLayer maps the window or budget of limit.extra[i] onto out.
func (x LimitLayer) policyLayer(ps *problems, i int, out *limiter.Layer) {
	key := "limit.extra[" + strconv.Itoa(i) + "]"
	if x.Budget != "" {
		out.Budget = x.Budget.Amount()
	}
	if x.Window == nil {
		for name, set := range map[string]bool{"default_timezone": x.DefaultTimezone != "", "countries": len(x.Countries) > 0, "exempt": len(x.Exempt) > 0} {
			if set {
				ps.add(key+"."+name, "applies only to a window (limit.extra[%d].window)", i)
			}
		}
		return
	}
	w := &limiter.Window{Calendar: x.Window.calendar(ps, key+".window")}
	switch x.Timezone {
	case timezoneE164:
		w.ByNumber = true
	case "":
	default:
		loc, err := time.LoadLocation(x.Timezone)
		if err != nil {
			ps.add(key+".timezone", "unknown time zone %q (an IANA name, or e164 for the zone of each recipient's number)", x.Timezone)
		}
		w.Location = loc
	}
	if x.DefaultTimezone != "" {
		loc, err := time.LoadLocation(x.DefaultTimezone)
		if err != nil {
			ps.add(key+".default_timezone", "unknown time zone %q", x.DefaultTimezone)
		}
		w.DefaultLocation = loc
	}
	for _, c := range slices.Sorted(maps.Keys(x.Countries)) {
		if w.Countries == nil {
			w.Countries = map[string]limiter.Calendar{}
		}
		w.Countries[c] = x.Countries[c].calendar(ps, key+".countries."+c)
	}
	for j, e := range x.Exempt {
		p, err := limiter.ParsePriority(e)
		if err != nil {
			ps.add(fmt.Sprintf("%s.exempt[%d]", key, j), "%s", paramMessage(err))
			continue
		}
		w.Exempt = append(w.Exempt, p)
	}
	out.Window = w
	out.Location = nil // the window's own zones
}

// priceOptions maps limit.prices onto o (Prices, Recipient).
func (l *Limit) priceOptions(ps *problems, o *consumer.LimitOptions) {
	p := l.Prices
	if p == nil {
		return
	}
	lp := &limiter.Prices{Currency: p.Currency, Default: p.Default.Amount(), PerSegment: p.PerSegment}
	for c, m := range p.Countries {
		if lp.Countries == nil {
			lp.Countries = map[string]limiter.Amount{}
		}
		lp.Countries[c] = m.Amount()
	}
	o.Prices = lp
	name, text := "limit.prices.recipient", p.Recipient
	if text == "" {
		for i, x := range l.Extra {
			if x.Window != nil && x.Timezone == timezoneE164 && x.Key != "" {
				name, text = "limit.extra["+strconv.Itoa(i)+"].key", x.Key
				break
			}
		}
	}
	if text == "" {
		return // consumer.LimitOptions.Validate names what is missing
	}
	const recipient = "prices.recipient"
	f, err := msgtmpl.KeysFunc([]msgtmpl.LayerKey{{Layer: recipient, Name: name, Text: text}})
	if err != nil {
		if name == "limit.prices.recipient" { // a layer's key is reported as such
			ps.add(name, "%s", err)
		}
		return
	}
	o.Recipient = func(m consumer.Message) (string, error) {
		keys, err := f(m)
		return keys[recipient], err
	}
}
