package msgtmpl

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

func TestSMSSegmentsFunc(t *testing.T) {
	long := strings.Repeat("a", 161)
	tests := []struct {
		name, body, text, want, wantErr string
	}{
		{"gsm 161 is two", `{"text":"` + long + `"}`, `{{sms_segments .JSON.text}}`, "2", ""},
		{"ucs2", `{"text":"привет"}`, `{{sms_segments .JSON.text}}`, "1", ""},
		{"empty text is one", `{"text":""}`, `{{sms_segments .JSON.text}}`, "1", ""},
		{"number as its text", `{"text":12345}`, `{{sms_segments .JSON.text}}`, "1", ""},
		{"raw body", long, `{{sms_segments .Body}}`, "2", ""},
		{"usable in arithmetic-free pipelines", `{"text":"hi"}`, `{{.JSON.text | sms_segments}}`, "1", ""},
		{"null fails", `{"text":null}`, `{{sms_segments .JSON.text}}`, "", "null or missing"},
		{"object fails", `{"text":{}}`, `{{sms_segments .JSON.text}}`, "", "want a string"},
		{"encoding gsm", `{"text":"a€"}`, `{{sms_encoding .JSON.text}}`, "GSM-7", ""},
		{"encoding ucs2", `{"text":"a😀"}`, `{{sms_encoding .JSON.text}}`, "UCS-2", ""},
		{"encoding null fails", `{"text":null}`, `{{sms_encoding .JSON.text}}`, "", "null or missing"},
	}
	for _, tt := range tests {
		tmpl, err := Parse("limit.cost_template", tt.text)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got, err := Render(tmpl, NewData(consumer.Message{Body: []byte(tt.body)}))
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: err = %v, want one containing %q", tt.name, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || string(got) != tt.want):
			t.Errorf("%s: got %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}
