package config

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

const providersBase = `
limit:
  bucket: sms
  rate: 10
source:
  kafka: {brokers: ["127.0.0.1:9092"], topic: sms, group: g}
`

func TestPresetAndClassify(t *testing.T) {
	cfg := mustParse(t, providersBase+`
sink:
  http:
    preset: twilio
    credentials: {username: AC1, password: "${TOK}"}
    classify:
      - name: legacy throttled
        status: 200
        body: {messages.0.status: 1}
        action: push_back
        delay: 2s
      - status: [4xx, 500-503]
        headers: {X-Reason: [gone, dead]}
        action: permanent
        recipient_gone: true
`, map[string]string{"TOK": "s3cret-token"})
	sc := libs(t, cfg).HTTP
	if sc.Preset != "twilio" || sc.Credentials.Username != "AC1" || sc.Credentials.Password != "s3cret-token" || sc.URL != "" {
		t.Fatalf("SinkConfig = %+v", sc)
	}
	want := []httpsink.Rule{
		{Name: "legacy throttled", Status: []string{"200"}, Body: map[string][]string{"messages.0.status": {"1"}}, Action: httpsink.PushBack, Delay: 2 * time.Second},
		{Status: []string{"4xx", "500-503"}, Headers: map[string][]string{"X-Reason": {"gone", "dead"}}, Action: httpsink.Permanent, RecipientGone: true},
	}
	if len(sc.Rules) != 2 || sc.Rules[0].Name != want[0].Name || sc.Rules[0].Status[0] != "200" ||
		sc.Rules[0].Body["messages.0.status"][0] != "1" || sc.Rules[0].Delay != want[0].Delay ||
		sc.Rules[1].Headers["X-Reason"][1] != "dead" || !sc.Rules[1].RecipientGone || sc.Rules[1].Action != httpsink.Permanent {
		t.Errorf("rules = %+v, want %+v", sc.Rules, want)
	}
	if dump := cfg.String(); strings.Contains(dump, "s3cret-token") || !strings.Contains(dump, "AC1") {
		t.Errorf("dump leaks the password or lost the username:\n%s", dump)
	}
}

func TestProviderConfigErrors(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"unknown preset", `sink: {http: {preset: sinch}}`, "sink.http.preset: must be one of twilio"},
		{"no url without preset", `sink: {http: {method: POST}}`, "sink.http.url: required"},
		{"bad action", `sink: {http: {url: "http://h/", classify: [{action: drop}]}}`, `sink.http.classify: rule 0: action "drop"`},
		{"bad status", `sink: {http: {url: "http://h/", classify: [{status: 6xx, action: retry}]}}`, `sink.http.classify: rule 0: status "6xx"`},
		{"gone on retry", `sink: {http: {url: "http://h/", classify: [{action: retry, recipient_gone: true}]}}`, "recipient_gone is only valid"},
		{"cost both", `limit: {bucket: b, rate: 1, cost_header: n, cost_template: "1"}`, "limit.cost_template: set either limit.cost_header or limit.cost_template"},
		{"cost parse", `limit: {bucket: b, rate: 1, cost_template: "{{sms_segments"}`, "limit.cost_template"},
	}
	for _, tt := range tests {
		doc := providersBase + "sink: {stdout: {}}\n"
		switch {
		case strings.HasPrefix(tt.doc, "sink:"):
			doc = providersBase + tt.doc + "\n"
		case strings.HasPrefix(tt.doc, "limit:"):
			doc = strings.Replace(providersBase, "limit:\n  bucket: sms\n  rate: 10\n", tt.doc+"\n", 1) + "sink: {stdout: {}}\n"
		}
		_, err := Parse([]byte(doc), env(nil))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestCostFunc(t *testing.T) {
	cfg := mustParse(t, strings.Replace(providersBase, "rate: 10\n", "rate: 10\n  cost_template: '{{sms_segments .JSON.text}}'\n", 1)+"sink: {stdout: {}}\n", nil)
	cost := libs(t, cfg).Kafka.Cost
	if n, err := cost(consumer.Message{Body: []byte(`{"text":"` + strings.Repeat("x", 161) + `"}`)}); n != 2 || err != nil {
		t.Errorf("cost = %d, %v; want 2", n, err)
	}
	if _, err := cost(consumer.Message{Body: []byte(`{}`)}); !consumer.IsPermanent(err) {
		t.Errorf("cost of a message without text: %v, want permanent", err)
	}
	if c := libs(t, mustParse(t, providersBase+"sink: {stdout: {}}\n", nil)).Kafka.Cost; c != nil {
		t.Error("no cost settings: a cost function, want nil (one token each)")
	}
	header := libs(t, mustParse(t, strings.Replace(providersBase, "rate: 10\n", "rate: 10\n  cost_header: n\n", 1)+"sink: {stdout: {}}\n", nil))
	if n, err := header.Kafka.Cost(consumer.Message{Headers: map[string]string{"n": "3"}}); n != 3 || err != nil {
		t.Errorf("cost_header: %d, %v; want 3", n, err)
	}
}
