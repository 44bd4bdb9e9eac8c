package limiter

// The one parser of rate strings, used by the config file (limit.rate,
// layer rates) and the CLI (bucket set --rate).

import (
	"errors"
	"strconv"
	"strings"

	"github.com/throttlehq/throttle/internal/backend"
)

// rateUnits maps the unit of a rate string to its length in seconds.
var rateUnits = map[string]float64{
	"s":   1,
	"min": 60,
	"h":   3600,
	"d":   86400,
}

// ParseRate parses a rate given as a number per second ("100", "0.5") or
// as a number per unit: "N/s", "N/min", "N/h" or "N/d", such as "5/h" (five
// per hour). White space around the number and the unit is allowed. The
// result, in tokens per second, must be above 0 and at most 1e9; a string that is
// not a rate yields an error that says what is accepted. ParseRate is safe
// for concurrent use.
func ParseRate(s string) (float64, error) {
	num, unit, hasUnit := strings.Cut(s, "/")
	num = strings.TrimSpace(num)
	per := 1.0
	if hasUnit {
		unit = strings.TrimSpace(unit)
		var ok bool
		if per, ok = rateUnits[unit]; !ok {
			return 0, &ParamError{Param: "Rate", Msg: "unknown unit: use N/s, N/min, N/h or N/d", Value: s}
		}
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, &ParamError{Param: "Rate", Msg: "out of range", Value: s}
		}
		return 0, &ParamError{Param: "Rate", Msg: "must be a number per second or N/s, N/min, N/h, N/d", Value: s}
	}
	rate := n / per
	if n > 0 && rate == 0 {
		// So small that it underflows: report it rather than a zero.
		return 0, &ParamError{Param: "Rate", Msg: "too small", Value: s}
	}
	if err := backend.ValidateRate(rate); err != nil {
		return 0, err
	}
	return rate, nil
}
