package msgtmpl

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

func TestCostFunc(t *testing.T) {
	tests := []struct {
		name, text, body string
		want             int
		wantErr          string // substring; the error must also be permanent
	}{
		{"segments", `{{sms_segments .JSON.text}}`, `{"text":"` + strings.Repeat("€", 81) + `"}`, 2, ""},
		{"spaces trimmed", " {{.JSON.n}}\n", `{"n":3}`, 3, ""},
		{"zero", `{{.JSON.n}}`, `{"n":0}`, 0, `rendered "0", not a positive integer`},
		{"negative", `{{.JSON.n}}`, `{"n":-2}`, 0, "not a positive integer"},
		{"not a number", `{{.JSON.n}}`, `{"n":"two"}`, 0, `"two"`},
		{"empty", `{{with .JSON.none}}1{{end}}`, `{"none":null}`, 0, `rendered ""`},
		{"render error", `{{.JSON.missing}}`, `{"n":1}`, 0, "rendering limit.cost_template"},
		{"long output is cut", `{{.Body}}`, strings.Repeat("x", 200), 0, strings.Repeat("x", 64) + "…"},
	}
	for _, tt := range tests {
		cost, err := CostFunc("limit.cost_template", tt.text)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		n, err := cost(consumer.Message{Body: []byte(tt.body)})
		if tt.wantErr == "" {
			if err != nil || n != tt.want {
				t.Errorf("%s: cost = %d, %v; want %d", tt.name, n, err, tt.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !consumer.IsPermanent(err) {
			t.Errorf("%s: err = %v, want a permanent error containing %q", tt.name, err, tt.wantErr)
		}
	}
	if _, err := CostFunc("limit.cost_template", "{{"); err == nil || !strings.Contains(err.Error(), "limit.cost_template") {
		t.Errorf("parse error = %v, want one naming the template", err)
	}
}
