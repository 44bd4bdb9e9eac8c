package msgtmpl

import (
	"encoding/json"
	"fmt"

	"github.com/throttlehq/throttle/sinks/sms"
)

func init() {
	funcs["sms_segments"] = smsSegments
	funcs["sms_encoding"] = smsEncoding
}

// smsSegments is the template function sms_segments: the number of SMS
// segments its argument occupies, by the rules of package sms (GSM-7: 160
// septets alone, 153 per concatenated segment, extension characters count
// two; UCS-2: 70 code units alone, 67 per segment, a character outside the
// BMP counts two; an empty text is one segment). The argument is a string,
// or a JSON number taken as its text; anything else, null included, is an
// error, so a message without its text is not silently costed as one
// segment.
func smsSegments(v any) (int, error) {
	switch t := v.(type) {
	case string:
		return sms.Segments(t), nil
	case json.Number:
		return sms.Segments(t.String()), nil
	case nil:
		return 0, fmt.Errorf("sms_segments: the text is null or missing")
	}
	return 0, fmt.Errorf("sms_segments: want a string, got %T", v)
}

// smsEncoding is the template function sms_encoding: "GSM-7" or "UCS-2",
// the encoding its argument is sent in (package sms), for APIs that must
// be told, such as Vonage's type=unicode. It takes what sms_segments takes.
func smsEncoding(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return sms.Detect(t).String(), nil
	case json.Number:
		return sms.Detect(t.String()).String(), nil
	case nil:
		return "", fmt.Errorf("sms_encoding: the text is null or missing")
	}
	return "", fmt.Errorf("sms_encoding: want a string, got %T", v)
}
