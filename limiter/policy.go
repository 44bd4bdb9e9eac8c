package limiter

import (
	"errors"
	"fmt"
	"strings"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/phone"
)

// Window makes a layer a send window (Layer.Window): the layer grants only
// while the local time of the message's key, its recipient, is inside the
// window's Calendar, in a fixed zone (Location) or in the zone of the
// recipient's telephone number (ByNumber), with per-country calendars
// (Countries) and classes that ignore it (Exempt). Outside it a request
// waits, or with ActionDelay (a window's default OnExceed) is refused with a
// *LimitError whose RetryAt is when the window opens, so that a consumer
// sets the message aside until then. A window keeps no state and charges
// nothing; the store decides it on its own clock, in the same atomic step
// as the other layers (see docs/windows.md).
type Window = backend.Window

// Calendar is a window's daily open time in local time: From until To
// (exclusive) on Days; From after To spans midnight.
type Calendar = backend.Calendar

// Weekdays is a set of days of the week (bit d is time.Weekday d); zero is
// every day.
type Weekdays = backend.Weekdays

// EveryDay holds the seven days.
const EveryDay = backend.EveryDay

// Amount is money in micro-units (millionths) of a currency: budgets and
// prices are integers, so that they add up exactly.
type Amount = backend.Amount

// ParseWeekdays parses days and ranges such as "mon-fri" or "sat,sun"; ""
// is every day.
func ParseWeekdays(s string) (Weekdays, error) { return backend.ParseWeekdays(s) }

// ParseClock parses a time of day "HH:MM" (00:00 to 24:00) as the time
// after midnight.
var ParseClock = backend.ParseClock

// ParseAmount parses a decimal amount such as "500.00" or "0.0079"
// exactly, with at most six decimals.
func ParseAmount(s string) (Amount, error) { return backend.ParseAmount(s) }

// AmountOf converts a float amount (as a YAML or JSON number) to an
// Amount, exact for any amount written with at most six decimals.
func AmountOf(f float64) (Amount, error) { return backend.AmountOf(f) }

// Prices are what a message costs by its recipient's country, for budget
// layers (Layer.Budget, Request.Price). The zero value prices every
// message at 0.
type Prices struct {
	// Currency names the unit of the amounts ("USD"), for people: budgets
	// are in the same currency.
	Currency string
	// Default is the price of a recipient whose country has no price.
	Default Amount
	// Countries are prices by ISO 3166 code ("GB").
	Countries map[string]Amount
	// PerSegment charges the price once per unit of the message's cost
	// (its SMS segments), instead of once per message.
	PerSegment bool
}

// Validate checks the prices: countries keyed by two capital letters,
// amounts not negative nor above 2^53 micro-units. Errors are *ParamError,
// joined.
func (p Prices) Validate() error {
	var errs []error
	check := func(param string, a Amount) {
		if a < 0 || a > backend.MaxAmount {
			errs = append(errs, &ParamError{Param: param, Msg: "must be >= 0 and at most 2^53 micro-units", Value: a})
		}
	}
	check("Prices.Default", p.Default)
	for c, a := range p.Countries {
		if len(c) != 2 || strings.ToUpper(c) != c {
			errs = append(errs, &ParamError{Param: "Prices.Countries", Msg: "must be keyed by ISO 3166 codes in capitals (GB)", Value: c})
		}
		check("Prices.Countries["+c+"]", a)
	}
	return errors.Join(errs...)
}

// NeedsRecipient reports whether a price depends on the recipient: some
// country has a price of its own.
func (p Prices) NeedsRecipient() bool { return len(p.Countries) > 0 }

// Price returns what a message of cost (its segments) to recipient costs:
// the price of the recipient's country, or Default, times cost when
// PerSegment. recipient is a telephone number, read as the e164 template
// function reads it; it may be "" when NeedsRecipient is false. A
// recipient that is not a telephone number returns a *LimitError with
// ActionDeadLetter, naming the layer budget: retrying cannot price it.
func (p Prices) Price(recipient string, cost int, budget string) (Amount, error) {
	price := p.Default
	if p.NeedsRecipient() {
		info, err := phone.Lookup(recipient)
		if err != nil {
			return 0, &LimitError{Layer: budget, Action: ActionDeadLetter, Reason: "cannot price the recipient: " + err.Error()}
		}
		if c, ok := phone.ByCountry(info, p.Countries); ok {
			price = c
		}
	}
	if p.PerSegment {
		if cost < 0 || (cost > 0 && int64(price) > int64(backend.MaxAmount)/int64(cost)) {
			return 0, fmt.Errorf("price %s times %d segments: %w", price, cost, ErrInvalidCost)
		}
		price *= Amount(cost)
	}
	return price, nil
}
