package msgtmpl

import (
	"encoding/json"
	"fmt"

	"github.com/throttlehq/throttle/internal/phone"
)

func init() {
	funcs["e164"] = e164
}

// e164 is the template function e164: a telephone number normalised to
// E.164, "+" and digits, so that "+1 (212) 555-0100", "1.212.555.0100"
// and "12125550100" are one key ("+12125550100"). The number must carry
// its country code (a missing "+" or an international "00" is supplied);
// anything else, a missing or null value included, fails the template,
// so that the message is dead-lettered with the reason.
func e164(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		if v == nil {
			return "", fmt.Errorf("e164: the number is null or missing")
		}
		if n, isNum := v.(json.Number); isNum { // {"to": 12125550100}
			s = n.String()
		} else {
			return "", fmt.Errorf("e164: want a string, got %T", v)
		}
	}
	return e164String(s)
}

// e164String is e164 of a string.
func e164String(s string) (string, error) {
	n, err := phone.Normalize(s)
	if err != nil {
		return "", fmt.Errorf("e164: %w", err)
	}
	return n, nil
}
