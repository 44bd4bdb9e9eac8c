package msgtmpl

import (
	"errors"
	"strings"
	"testing"
	"text/template"

	"github.com/throttlehq/throttle/consumer"
)

// TestRenderNoValue: a template never prints "<no value>". Printing a JSON
// null, or a missing value that index or a range yields, fails with an
// error naming the template, its line and the action; the string
// "<no value>" itself is a value like any other, and a null that is not
// printed (with, json, if) is still usable.
func TestRenderNoValue(t *testing.T) {
	tests := []struct {
		name, text, body string
		want             string
		wantErr          string // substring; "" means success
	}{
		{"null field", `{{.JSON.to}}`, `{"to":null}`, "", `body_template:1:2: {{.JSON.to}} has no value`},
		{"the string <no value>", `{{.JSON.to}}`, `{"to":"<no value>"}`, "<no value>", ""},
		{"missing field via index", `{{index .JSON "to"}}`, `{}`, "", `{{index .JSON "to"}} has no value`},
		{"null in a pipeline", `{{.JSON.to | html}}`, `{"to":null}`, "", ""}, // html prints nil as its own text
		{"null element of a range", "a\n{{range .JSON.l}}{{.}}{{end}}", `{"l":["x",null]}`, "", `body_template:2:19: {{.}} has no value`},
		{"null through a defined template", `{{define "t"}}{{.}}{{end}}{{template "t" .JSON.to}}`, `{"to":null}`, "", `{{.}} has no value`},
		{"null is false for with", `{{with .JSON.to}}{{.}}{{else}}none{{end}}`, `{"to":null}`, "none", ""},
		{"null as JSON", `{{json .JSON.to}}`, `{"to":null}`, "null", ""},
		{"a variable declaration prints nothing", `{{$x := .JSON.to}}ok`, `{"to":null}`, "ok", ""},
		{"empty string is a value", `[{{.JSON.to}}]`, `{"to":""}`, "[]", ""},
	}
	for _, tt := range tests {
		tmpl, err := Parse("body_template", tt.text)
		if err != nil {
			t.Fatalf("%s: Parse: %v", tt.name, err)
		}
		got, err := Render(tmpl, NewData(consumer.Message{Body: []byte(tt.body)}))
		switch {
		case tt.name == "null in a pipeline":
			// Not printed by the action itself: the function decides.
			if err != nil || string(got) == "<no value>" {
				t.Errorf("%s: Render = %q, %v", tt.name, got, err)
			}
		case tt.wantErr == "" && (err != nil || string(got) != tt.want):
			t.Errorf("%s: Render = %q, %v; want %q", tt.name, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: Render = %q, %v; want an error containing %q", tt.name, got, err, tt.wantErr)
		case tt.wantErr != "" && !errors.Is(err, ErrNoValue):
			t.Errorf("%s: error %v is not ErrNoValue", tt.name, err)
		}
	}
}

// TestRenderNotJSON: a template that reads .JSON of a body that is not one
// JSON value fails saying so, with the decoder's reason; one that does not
// read .JSON, or tests it first, renders.
func TestRenderNotJSON(t *testing.T) {
	tests := []struct {
		name, text, body string
		want             string
		wantErr          string
	}{
		{"field of a text body", `{{.JSON.to}}`, `hello`, "", "message body is not JSON: invalid character 'h'"},
		{"index of a text body", `{{index .JSON "to"}}`, `hello`, "", "message body is not JSON"},
		{"empty body", `{{.JSON.to}}`, ``, "", "message body is not JSON: empty"},
		{"two values", `{{.JSON.a}}`, `{"a":1} {}`, "", "message body is not JSON: more than one JSON value"},
		{"trailing garbage", `{{.JSON.a}}`, `{"a":1} x`, "", "message body is not JSON: invalid character 'x'"},
		{"root variable", `{{$.JSON.to}}`, `hello`, "", "message body is not JSON"},
		{"tested first", `{{if .JSON}}{{.JSON.to}}{{else}}{{.Body}}{{end}}`, `hello`, "hello", ""},
		{"not read", `{{.Body}}`, `hello`, "hello", ""},
	}
	for _, tt := range tests {
		tmpl, err := Parse("limit.extra[0].key", tt.text)
		if err != nil {
			t.Fatalf("%s: Parse: %v", tt.name, err)
		}
		got, err := Render(tmpl, NewData(consumer.Message{Body: []byte(tt.body)}))
		switch {
		case tt.wantErr == "" && (err != nil || string(got) != tt.want):
			t.Errorf("%s: Render = %q, %v; want %q", tt.name, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrNotJSON)):
			t.Errorf("%s: Render = %q, %v; want ErrNotJSON containing %q", tt.name, got, err, tt.wantErr)
		case tt.wantErr != "" && !strings.HasPrefix(err.Error(), "rendering limit.extra[0].key: "):
			t.Errorf("%s: error %q does not name the template first", tt.name, err)
		}
	}
}

// TestRenderSameOutput: the checks Parse adds change no output. Each
// template renders as plain text/template renders it.
func TestRenderSameOutput(t *testing.T) {
	body := `{"to":"+1","l":["a","b","c"],"n":3,"m":{"k":"v"},"e":""}`
	for _, text := range []string{
		`{{.JSON.to}}-{{.JSON.n}}-{{.JSON.m.k}}`,
		`{{range $i, $e := .JSON.l}}{{if eq $e "b"}}{{continue}}{{end}}{{$i}}{{$e}}{{end}}`,
		`{{range .JSON.l}}{{if eq . "b"}}{{break}}{{end}}{{.}}{{else}}none{{end}}`,
		`{{if .JSON.e}}a{{else if .JSON.n}}b{{end}}{{with .JSON.e}}x{{else with .JSON.m}}{{.k}}{{end}}`,
		`{{block "b" .JSON}}[{{.to}}]{{end}}{{template "b" .JSON}}`,
		"{{- /* a comment */ -}}\n  {{ .JSON.to -}}  \n x",
		`{{$x := .JSON.to}}{{$x = "y"}}{{$x}}{{print $x 1 | len}}`,
		`{{range 3}}{{.}}{{end}}{{range $k, $v := .JSON.m}}{{$k}}={{$v}}{{end}}`,
		`{{with $y := .JSON.l}}{{index $y 1}}{{end}}{{json .JSON.m}}{{form "a" .JSON.to}}`,
		``,
	} {
		tmpl, err := Parse("t", text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		msg := consumer.Message{Body: []byte(body)}
		got, err := Render(tmpl, NewData(msg))
		if err != nil {
			t.Errorf("%q: %v", text, err)
			continue
		}
		plain := template.Must(template.New("t").Funcs(FuncMap()).Option("missingkey=error").Parse(text))
		var want strings.Builder
		if err := plain.Execute(&want, NewData(msg)); err != nil {
			t.Fatalf("%q: text/template: %v", text, err)
		}
		if string(got) != want.String() {
			t.Errorf("%q: Render = %q, text/template = %q", text, got, want.String())
		}
	}
}
