package msgtmpl

import (
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

func TestFormFunc(t *testing.T) {
	tests := []struct {
		name    string
		args    []any
		want    string
		wantErr bool
	}{
		{"pairs", []any{"b", "2", "a", 1}, "a=1&b=2", false},
		{"map any", []any{map[string]any{"to": "+1", "tags": []any{"x", "y"}, "n": nil}}, "n=&tags=x&tags=y&to=%2B1", false},
		{"map string", []any{map[string]string{"a": "&"}}, "a=%26", false},
		{"odd args", []any{"a", "1", "b"}, "", true},
		{"non-string key", []any{1, "x"}, "", true},
		{"not a map", []any{"x"}, "", true},
	}
	for _, tt := range tests {
		got, err := formFunc(tt.args...)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: formFunc = %q, %v; want %q, error %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestRender runs templates through Parse and Render on messages, step by
// step: the functions, the data fields, and the failures that must not
// render half a body.
func TestRender(t *testing.T) {
	msg := consumer.Message{
		Key:     []byte("k1"),
		Body:    []byte(`{"to":"+15550100","device":"tok\"1","n":12345678901234567890,"tags":["a","b"]}`),
		Headers: map[string]string{"x-from": "+15550199"},
		Source:  consumer.Source{Broker: "kafka", Topic: "sms", Partition: 2, Offset: 7},
		Attempt: 3,
	}
	tests := []struct {
		name, text string
		msg        consumer.Message
		want       string
		wantErr    string // substring; "" means success
	}{
		{"json of a string", `{"token":{{json .JSON.device}}}`, msg, `{"token":"tok\"1"}`, ""},
		{"json keeps big numbers exact", `{{json .JSON.n}}`, msg, `12345678901234567890`, ""},
		{"form pairs", `{{form "To" .JSON.to "Tag" .JSON.tags}}`, msg, `Tag=a&Tag=b&To=%2B15550100`, ""},
		{"urlquery builtin", `To={{.JSON.to | urlquery}}`, msg, `To=%2B15550100`, ""},
		{"header, key, source, attempt", `{{index .Headers "x-from"}} {{.Key}} {{.Source.Topic}}/{{.Source.Partition}} {{.Attempt}}`, msg, `+15550199 k1 sms/2 3`, ""},
		{"raw body", `{{.Body}}`, consumer.Message{Body: []byte("plain")}, `plain`, ""},
		{"optional header via index", `[{{index .Headers "absent"}}]`, msg, `[]`, ""},
		{"missing JSON field fails", `{{.JSON.absent}}`, msg, "", `map has no entry for key "absent"`},
		{"JSON of a non-JSON body fails", `{{.JSON.to}}`, consumer.Message{Body: []byte("not json")}, "", "nil"},
		{"two JSON values are not JSON", `{{.JSON.a}}`, consumer.Message{Body: []byte(`{"a":1} {}`)}, "", "nil"},
	}
	for _, tt := range tests {
		tmpl, err := Parse("body_template", tt.text)
		if err != nil {
			t.Fatalf("%s: Parse: %v", tt.name, err)
		}
		got, err := Render(tmpl, NewData(tt.msg))
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: Render: %v", tt.name, err)
		case tt.wantErr == "" && string(got) != tt.want:
			t.Errorf("%s: Render = %q, want %q", tt.name, got, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: Render = %q, %v; want an error containing %q", tt.name, got, err, tt.wantErr)
		case tt.wantErr != "" && !strings.Contains(err.Error(), "body_template"):
			t.Errorf("%s: error %q does not name the template", tt.name, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, text := range []string{`{{jsn .JSON}}`, `{{.JSON`, `{{end}}`} {
		_, err := Parse("key", text)
		if err == nil || !strings.Contains(err.Error(), "key:") {
			t.Errorf("Parse(%q) = %v, want an error naming the template", text, err)
		}
	}
}

func TestFuncMapIsACopy(t *testing.T) {
	m := FuncMap()
	if m["json"] == nil || m["form"] == nil {
		t.Fatalf("FuncMap lacks json or form: %v", m)
	}
	delete(m, "json")
	if FuncMap()["json"] == nil {
		t.Fatal("deleting from the returned map changed the package's functions")
	}
}
