package httpsink

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDefaultRulesKeepTheClassification: the default rule set decides
// exactly as the sink did before rules existed.
func TestDefaultRulesKeepTheClassification(t *testing.T) {
	rs, err := compileRules(namedRules{name: "DefaultRules", rules: DefaultRules, builtin: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const def, maxd = time.Second, time.Minute
	tests := []struct {
		status     int
		retryAfter string
		action     Action
		delay      time.Duration
		hasDelay   bool
	}{
		{200, "", Delivered, 0, false},
		{204, "5", Delivered, 0, false},
		{429, "", PushBack, def, true},
		{429, "7", PushBack, 7 * time.Second, true},
		{429, "3600", PushBack, maxd, true},
		{429, "soon", PushBack, def, true},
		{503, "", Retry, 0, false},
		{503, "2", Retry, 2 * time.Second, true},
		{500, "", Retry, 0, false},
		{408, "", Retry, 0, false},
		{599, "", Retry, 0, false},
		{400, "5", Permanent, 0, false},
		{404, "", Permanent, 0, false},
		{301, "", Permanent, 0, false},
		{101, "", Permanent, 0, false},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.retryAfter != "" {
			h.Set("Retry-After", tt.retryAfter)
		}
		d := rs.decide(&response{status: tt.status, header: h}, func() time.Time { return now }, def, maxd)
		if d.rule.Action != tt.action || d.delay != tt.delay || d.hasDelay != tt.hasDelay {
			t.Errorf("%d Retry-After %q: %s %v %v; want %s %v %v", tt.status, tt.retryAfter,
				d.rule.Action, d.delay, d.hasDelay, tt.action, tt.delay, tt.hasDelay)
		}
	}
}

func TestRulesMatchBodyAndHeaders(t *testing.T) {
	rules := []Rule{
		{Name: "throttled", Status: []string{"2xx"}, Body: map[string][]string{"messages.0.status": {"1"}}, Action: PushBack, Delay: 3 * time.Second},
		{Name: "ok", Status: []string{"200-204"}, Body: map[string][]string{"messages.0.status": {"0"}}, Action: Delivered},
		{Name: "gone", Body: map[string][]string{"code": {"21610", "21614"}}, Action: Permanent, RecipientGone: true},
		{Name: "flag", Body: map[string][]string{"ok": {"false"}, "err": {"null"}}, Action: Retry},
		{Name: "present", Body: map[string][]string{"error.reason": nil}, Action: Permanent},
		{Name: "header", Headers: map[string][]string{"x-limit": {"hit"}}, Action: PushBack},
		{Name: "header present", Headers: map[string][]string{"X-Other": nil}, Action: Retry, Delay: time.Second},
	}
	rs, err := compileRules(namedRules{name: "Rules", rules: rules}, namedRules{name: "DefaultRules", rules: DefaultRules, builtin: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		status int
		header http.Header
		body   string
		rule   string
		delay  time.Duration
	}{
		{"200 with status 1", 200, nil, `{"messages":[{"status":"1"}]}`, "throttled", 3 * time.Second},
		{"200 with status 0", 200, nil, `{"messages":[{"status":"0"}]}`, "ok", 0},
		{"status 0 on a 206 is outside 200-204", 206, nil, `{"messages":[{"status":"0"}]}`, "2xx", 0},
		{"number code", 400, nil, `{"code":21610,"status":400}`, "gone", 0},
		{"string code", 400, nil, `{"code":"21614"}`, "gone", 0},
		{"other code", 400, nil, `{"code":21211}`, "other status", 0},
		{"bool and null", 500, nil, `{"ok":false,"err":null}`, "flag", 0},
		{"object is no value", 400, nil, `{"code":{"a":1}}`, "other status", 0},
		{"path present", 400, nil, `{"error":{"reason":{"x":1}}}`, "present", 0},
		{"index out of range", 200, nil, `{"messages":[]}`, "2xx", 0},
		{"not json", 200, nil, `status=1`, "2xx", 0},
		{"header value", 500, http.Header{"X-Limit": {" hit "}}, "", "header", time.Second},
		{"header other value", 500, http.Header{"X-Limit": {"no"}}, "", "408 or 5xx", 0},
		{"header present", 500, http.Header{"X-Other": {""}}, "", "header present", time.Second},
	}
	for _, tt := range tests {
		h := tt.header
		if h == nil {
			h = http.Header{}
		}
		d := rs.decide(&response{status: tt.status, header: h, body: []byte(tt.body)}, time.Now, time.Second, time.Minute)
		if d.rule.Name != tt.rule || d.delay != tt.delay {
			t.Errorf("%s: rule %q delay %v; want %q %v", tt.name, d.rule.Name, d.delay, tt.rule, tt.delay)
		}
	}
	if !rs.needBody {
		t.Error("needBody is false with body rules")
	}
}

func TestCompileRulesRejects(t *testing.T) {
	tests := []struct {
		rule Rule
		want string
	}{
		{Rule{}, "action is required"},
		{Rule{Action: "drop"}, `action "drop" is not one of`},
		{Rule{Action: Delivered, Delay: time.Second}, "delay is only valid"},
		{Rule{Action: Retry, Delay: -time.Second}, "negative"},
		{Rule{Action: Retry, RecipientGone: true}, "recipient_gone is only valid"},
		{Rule{Action: Permanent, Status: []string{"6xx"}}, `status "6xx"`},
		{Rule{Action: Permanent, Status: []string{"500-400"}}, `status "500-400"`},
		{Rule{Action: Permanent, Status: []string{"abc"}}, `status "abc"`},
		{Rule{Action: Permanent, Headers: map[string][]string{"bad name": nil}}, "header name"},
		{Rule{Action: Permanent, Body: map[string][]string{"a..b": nil}}, "empty element"},
	}
	for _, tt := range tests {
		_, err := compileRules(namedRules{name: "Rules", rules: []Rule{{Action: Delivered}, tt.rule}})
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Rules[1]") {
			t.Errorf("%+v: err = %v, want Rules[1] and %q", tt.rule, err, tt.want)
		}
	}
}

// TestPresetRulesCompile: every preset's rules are valid, and each
// preset's documented answers get the documented action.
func TestPresetRules(t *testing.T) {
	type answer struct {
		status int
		body   string
		action Action
		gone   bool
	}
	cases := map[string][]answer{
		PresetTwilio: {
			{201, `{"sid":"SM1","status":"queued"}`, Delivered, false},
			{400, `{"code":21610,"message":"unsubscribed","status":400}`, Permanent, true},
			{400, `{"code":21614,"status":400}`, Permanent, true},
			{400, `{"code":21211,"status":400}`, Permanent, false},
			{429, `{"code":20429,"status":429}`, Retry, false},
			{400, `{"code":30001,"status":400}`, PushBack, false},
			{401, `{"code":20003,"status":401}`, Permanent, false},
			{503, ``, Retry, false},
		},
		PresetVonage: {
			{202, `{"message_uuid":"x"}`, Delivered, false},
			{429, `{"title":"Rate Limit Hit"}`, PushBack, false},
			{422, `{"title":"Invalid params"}`, Permanent, false},
		},
		PresetVonageSMS: {
			{200, `{"message-count":"1","messages":[{"status":"0"}]}`, Delivered, false},
			{200, `{"message-count":"1","messages":[{"status":"1","error-text":"Throughput Rate Exceeded"}]}`, PushBack, false},
			{200, `{"messages":[{"status":"7"}]}`, Permanent, true},
			{200, `{"messages":[{"status":"3"}]}`, Permanent, false},
			{200, `{"messages":[{"status":"5"}]}`, Retry, false},
			{200, `not json`, Permanent, false},
			{500, ``, Retry, false},
		},
		PresetFCM: {
			{200, `{"name":"projects/p/messages/1"}`, Delivered, false},
			{404, `{"error":{"code":404,"status":"NOT_FOUND","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}`, Permanent, true},
			{400, `{"error":{"code":400,"status":"INVALID_ARGUMENT"}}`, Permanent, false},
			{429, `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}`, PushBack, false},
			{503, ``, Retry, false},
			{500, ``, Retry, false},
		},
		PresetAPNs: {
			{200, ``, Delivered, false},
			{410, `{"reason":"Unregistered","timestamp":1}`, Permanent, true},
			{400, `{"reason":"BadDeviceToken"}`, Permanent, false},
			{429, `{"reason":"TooManyRequests"}`, Retry, false},
			{403, `{"reason":"ExpiredProviderToken"}`, Permanent, false},
		},
	}
	for _, name := range Presets {
		rs, err := compileRules(namedRules{name: "preset " + name, rules: presetSpecs[name].rules}, namedRules{name: "DefaultRules", rules: DefaultRules, builtin: true})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(cases[name]) == 0 {
			t.Errorf("%s: no cases", name)
		}
		for _, a := range cases[name] {
			d := rs.decide(&response{status: a.status, header: http.Header{}, body: []byte(a.body)}, time.Now, time.Second, time.Minute)
			if d.rule.Action != a.action || d.rule.RecipientGone != a.gone {
				t.Errorf("%s %d %s: rule %q: %s gone=%v; want %s gone=%v", name, a.status, a.body, d.rule.Name, d.rule.Action, d.rule.RecipientGone, a.action, a.gone)
			}
		}
	}
}
