package httpsink

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Action is what a Rule makes of a response.
type Action string

// The actions a Rule can take.
const (
	// Delivered: the message arrived; Send returns nil.
	Delivered Action = "delivered"
	// Retry: a retryable error. With a Retry-After header in the response,
	// or else Rule.Delay, the error carries that delay (capped at
	// Config.MaxRetryAfter) with consumer.RetryAfter, so the retry waits
	// at least that long (and a consumer with push-back on pauses the
	// shared bucket for it, as it does for every delay a sink reports).
	Retry Action = "retry"
	// PushBack: a retryable error that always carries a delay, so that
	// the consumer.PushBack middleware pauses the shared bucket: the
	// Retry-After header, else Rule.Delay, else Config.DefaultRetryAfter,
	// capped at Config.MaxRetryAfter.
	PushBack Action = "push_back"
	// Permanent: a consumer.Permanent error; the message is dead-lettered
	// at once.
	Permanent Action = "permanent"
)

// Rule maps the responses it matches to an Action. A rule matches when
// every condition it sets holds; a rule with no condition matches every
// response. The sink tries Config.Rules in order, then the rules of the
// preset, then DefaultRules, and the first rule that matches decides.
//
// A rule is a plain value; the sink copies the rules in New.
type Rule struct {
	// Name names the rule in error messages, e.g. "twilio 21610
	// unsubscribed". Optional.
	Name string
	// Status lists the status codes that match: "429", a class "4xx", or
	// an inclusive range "500-599". Empty matches every status.
	Status []string
	// Headers maps a response header name to the values that match
	// (compared exactly, after trimming spaces). An empty list matches
	// when the header is present with any value.
	Headers map[string][]string
	// Body maps a dotted path into the JSON response body to the values
	// that match. A path's elements are object keys or, for arrays,
	// indexes: "messages.0.status". A JSON string matches its text, a
	// number its literal text ("21610"), a boolean "true" or "false", and
	// null "null"; an object or array never matches a value. An empty list
	// matches when the path exists. A response whose body is not JSON
	// matches no Body condition. Only the first 64 KiB of a body are read.
	Body map[string][]string
	// Action is what a matching response means. It is required.
	Action Action
	// Delay is the delay of a Retry or PushBack action when the response
	// has no usable Retry-After header. Zero means none (Retry) or
	// Config.DefaultRetryAfter (PushBack). It must be 0 for the other
	// actions.
	Delay time.Duration
	// RecipientGone marks a Permanent answer that means the recipient
	// (phone number, device token) no longer exists or no longer accepts
	// messages. The error is a *StatusError with RecipientGone set, which
	// asks for the dead-letter header x-throttle-recipient-gone: true.
	// Only valid with Permanent.
	RecipientGone bool
}

// DefaultRules is the classification every sink ends with, after its own
// and its preset's rules:
//
//   - 2xx: delivered.
//   - 429: push back, with the Retry-After or Config.DefaultRetryAfter.
//   - 408 and 5xx: retry, with the Retry-After delay when there is one.
//   - Anything else (3xx, other 4xx, 1xx): permanent.
//
// Callers must not modify it.
var DefaultRules = []Rule{
	{Name: "2xx", Status: []string{"2xx"}, Action: Delivered},
	{Name: "429", Status: []string{"429"}, Action: PushBack},
	{Name: "408 or 5xx", Status: []string{"408", "5xx"}, Action: Retry},
	{Name: "other status", Action: Permanent},
}

// HeaderRecipientGone is the dead-letter header a *StatusError asks for
// when the rule that matched has RecipientGone set.
const HeaderRecipientGone = "x-throttle-recipient-gone"

// statusSpan is an inclusive range of status codes.
type statusSpan struct{ lo, hi int }

// compiledRule is a Rule with its conditions parsed.
type compiledRule struct {
	Rule
	builtin bool // one of DefaultRules: not named in errors
	spans   []statusSpan
	headers []headerCond
	body    []bodyCond
}

type headerCond struct {
	name   string // canonical
	values []string
}

type bodyCond struct {
	path   []string
	values []string
}

// ruleSet is an ordered list of compiled rules, safe for concurrent use.
type ruleSet struct {
	rules    []compiledRule
	needBody bool // some rule reads the body
}

// compileRules checks and compiles the rules of each list, in order. An
// error names the rule by its list and position (and Name, if set).
func compileRules(lists ...namedRules) (*ruleSet, error) {
	rs := &ruleSet{}
	for _, l := range lists {
		for i, r := range l.rules {
			c, err := compileRule(r)
			if err != nil {
				name := fmt.Sprintf("%s[%d]", l.name, i)
				if r.Name != "" {
					name += fmt.Sprintf(" (%s)", r.Name)
				}
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			c.builtin = l.builtin
			rs.needBody = rs.needBody || len(c.body) > 0
			rs.rules = append(rs.rules, c)
		}
	}
	return rs, nil
}

type namedRules struct {
	name    string
	rules   []Rule
	builtin bool
}

func compileRule(r Rule) (compiledRule, error) {
	c := compiledRule{Rule: r}
	switch r.Action {
	case Delivered, Permanent:
		if r.Delay != 0 {
			return c, fmt.Errorf("delay is only valid with %s or %s", Retry, PushBack)
		}
	case Retry, PushBack:
		if r.Delay < 0 {
			return c, fmt.Errorf("delay %v is negative", r.Delay)
		}
	case "":
		return c, errors.New("action is required")
	default:
		return c, fmt.Errorf("action %q is not one of %s, %s, %s, %s", r.Action, Delivered, Retry, PushBack, Permanent)
	}
	if r.RecipientGone && r.Action != Permanent {
		return c, fmt.Errorf("recipient_gone is only valid with %s", Permanent)
	}
	for _, s := range r.Status {
		sp, err := parseStatus(s)
		if err != nil {
			return c, err
		}
		c.spans = append(c.spans, sp)
	}
	for name, vals := range r.Headers {
		if !validToken(name) {
			return c, fmt.Errorf("header name %q is not valid", name)
		}
		c.headers = append(c.headers, headerCond{name: http.CanonicalHeaderKey(name), values: vals})
	}
	for path, vals := range r.Body {
		parts := strings.Split(path, ".")
		for _, p := range parts {
			if p == "" {
				return c, fmt.Errorf("body path %q has an empty element", path)
			}
		}
		c.body = append(c.body, bodyCond{path: parts, values: vals})
	}
	return c, nil
}

// parseStatus parses "429", "4xx" or "500-599".
func parseStatus(s string) (statusSpan, error) {
	s = strings.TrimSpace(s)
	bad := fmt.Errorf("status %q is not a code (429), a class (4xx) or a range (500-599)", s)
	if len(s) == 3 && strings.HasSuffix(strings.ToLower(s), "xx") && s[0] >= '1' && s[0] <= '5' {
		lo := int(s[0]-'0') * 100
		return statusSpan{lo, lo + 99}, nil
	}
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil || a < 100 || a > 599 {
		return statusSpan{}, bad
	}
	if !isRange {
		return statusSpan{a, a}, nil
	}
	b, err := strconv.Atoi(strings.TrimSpace(hi))
	if err != nil || b < a || b > 599 {
		return statusSpan{}, bad
	}
	return statusSpan{a, b}, nil
}

// response is what rules look at.
type response struct {
	status int
	header http.Header
	body   []byte
	json   any  // decoded lazily
	parsed bool // json was tried
}

func (r *response) jsonBody() any {
	if !r.parsed {
		r.parsed = true
		dec := json.NewDecoder(bytes.NewReader(r.body))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) == nil {
			r.json = v
		}
	}
	return r.json
}

// match returns the first rule that matches r, or nil.
func (rs *ruleSet) match(r *response) *compiledRule {
	for i := range rs.rules {
		if rs.rules[i].matches(r) {
			return &rs.rules[i]
		}
	}
	return nil
}

func (c *compiledRule) matches(r *response) bool {
	if len(c.spans) > 0 {
		ok := false
		for _, sp := range c.spans {
			ok = ok || (r.status >= sp.lo && r.status <= sp.hi)
		}
		if !ok {
			return false
		}
	}
	for _, h := range c.headers {
		vals, ok := r.header[h.name]
		if !ok {
			return false
		}
		if len(h.values) > 0 && !anyEqual(vals, h.values) {
			return false
		}
	}
	for _, b := range c.body {
		v, ok := lookup(r.jsonBody(), b.path)
		if !ok {
			return false
		}
		if len(b.values) == 0 {
			continue
		}
		text, scalar := scalarText(v)
		if !scalar || !anyEqual([]string{text}, b.values) {
			return false
		}
	}
	return true
}

func anyEqual(have, want []string) bool {
	for _, h := range have {
		h = strings.TrimSpace(h)
		for _, w := range want {
			if h == w {
				return true
			}
		}
	}
	return false
}

// lookup follows a dotted path through decoded JSON.
func lookup(v any, path []string) (any, bool) {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			e, ok := x[p]
			if !ok {
				return nil, false
			}
			v = e
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// scalarText is the text a JSON scalar matches.
func scalarText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return strconv.FormatBool(x), true
	case nil:
		return "null", true
	}
	return "", false
}

// decision is the outcome of classifying one response.
type decision struct {
	rule  *compiledRule
	delay time.Duration // for Retry (when hasDelay) and PushBack
	// hasDelay reports whether the error carries delay.
	hasDelay bool
}

// decide classifies r with rs. The delay comes from the Retry-After header
// (seconds or an HTTP date, relative to now(), which is read only for a
// rule that retries or pushes back), else the rule's Delay, else, for
// PushBack, defaultDelay; it is capped at maxDelay.
func (rs *ruleSet) decide(r *response, now func() time.Time, defaultDelay, maxDelay time.Duration) decision {
	rule := rs.match(r)
	if rule == nil { // DefaultRules end with a catch-all, so not expected
		rule = &compiledRule{Rule: Rule{Name: "no rule", Action: Permanent}}
	}
	d := decision{rule: rule}
	if rule.Action != Retry && rule.Action != PushBack {
		return d
	}
	if ra, ok := retryAfter(r.header.Get("Retry-After"), now()); ok {
		d.delay, d.hasDelay = ra, true
	} else if rule.Delay > 0 {
		d.delay, d.hasDelay = rule.Delay, true
	} else if rule.Action == PushBack {
		d.delay, d.hasDelay = defaultDelay, true
	}
	d.delay = min(d.delay, maxDelay)
	return d
}
