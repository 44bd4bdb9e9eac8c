package msgtmpl

import (
	"errors"
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

// TestKeysFunc: the keys of a message, by the fast path or by the template,
// and the permanent errors of a key that fails or renders empty, each
// naming the layer and the template.
func TestKeysFunc(t *testing.T) {
	keys, err := KeysFunc([]LayerKey{
		{Layer: "recipient", Name: "limit.extra[0].key", Text: `{{e164 .JSON.to}}`},
		{Layer: "tenant", Name: "limit.extra[1].key", Text: `{{index .Headers "x-tenant"}}`},
		{Layer: "campaign", Name: "limit.extra[2].key", Text: `{{with index .JSON "meta"}}{{.campaign}}{{else}}none{{end}}`},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		msg     consumer.Message
		want    map[string]string
		wantErr string // substring; the error must be permanent
		is      error
	}{
		{"all", consumer.Message{Body: []byte(`{"to":"+1 212 555 0100","meta":{"campaign":"c1"}}`), Headers: map[string]string{"x-tenant": "acme"}},
			map[string]string{"recipient": "+12125550100", "tenant": "acme", "campaign": "c1"}, "", nil},
		{"the template's default", consumer.Message{Body: []byte(`{"to":"12125550100"}`), Headers: map[string]string{"x-tenant": "acme"}},
			map[string]string{"recipient": "+12125550100", "tenant": "acme", "campaign": "none"}, "", nil},
		{"a missing field", consumer.Message{Body: []byte(`{"from":"x"}`), Headers: map[string]string{"x-tenant": "acme"}},
			nil, `the key of limit "recipient" (limit.extra[0].key): rendering limit.extra[0].key: template: limit.extra[0].key:1:12: executing "limit.extra[0].key" at <.JSON.to>: map has no entry for key "to"`, nil},
		{"a null", consumer.Message{Body: []byte(`{"to":null}`)},
			nil, "e164: the number is null or missing", nil},
		{"not a number", consumer.Message{Body: []byte(`{"to":"call me"}`)},
			nil, "not an international telephone number", nil},
		{"not JSON", consumer.Message{Body: []byte(`{"to":"+12125550100"} x`)},
			nil, "message body is not JSON: invalid character 'x'", ErrNotJSON},
		{"an empty key", consumer.Message{Body: []byte(`{"to":"+12125550100"}`)},
			nil, `the key of limit "tenant" (limit.extra[1].key) rendered empty`, nil},
	}
	for _, tt := range tests {
		got, err := keys(tt.msg)
		if tt.wantErr == "" {
			if err != nil || len(got) != len(tt.want) {
				t.Errorf("%s: keys = %v, %v; want %v", tt.name, got, err, tt.want)
				continue
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s: keys = %v; want %v", tt.name, got, tt.want)
				}
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !consumer.IsPermanent(err) || tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: err = %v; want a permanent error containing %q", tt.name, err, tt.wantErr)
		}
	}
}

// TestDedupeKeyFunc: a missing header is no key; a body that is not JSON
// fails the message when the key reads it.
func TestDedupeKeyFunc(t *testing.T) {
	byHeader, err := DedupeKeyFunc("delivery.dedupe.key", `{{index .Headers "message-id"}}`)
	if err != nil {
		t.Fatal(err)
	}
	byField, err := DedupeKeyFunc("delivery.dedupe.key", `{{.JSON.id}}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		f       consumer.KeyFunc
		msg     consumer.Message
		want    string
		wantErr error
	}{
		{"header", byHeader, consumer.Message{Body: []byte("not json"), Headers: map[string]string{"message-id": " m-1 "}}, " m-1 ", nil},
		{"no header", byHeader, consumer.Message{Body: []byte("not json")}, "", nil},
		{"field", byField, consumer.Message{Body: []byte(`{"id":"a\u00e9"}`)}, "aé", nil},
		{"null field", byField, consumer.Message{Body: []byte(`{"id":null}`)}, "", nil},
		{"not JSON", byField, consumer.Message{Body: []byte("not json")}, "", ErrNotJSON},
	} {
		got, err := c.f(c.msg)
		if got != c.want || !errors.Is(err, c.wantErr) || c.wantErr != nil && !consumer.IsPermanent(err) {
			t.Errorf("%s: key = %q, %v; want %q, %v", c.name, got, err, c.want, c.wantErr)
		}
	}
}

// TestRenderSharesData: the templates of a message that the fast path
// leaves to text/template decode the message once between them; those it
// renders decode nothing.
func TestRenderSharesData(t *testing.T) {
	fast, err := compile("a", `{{.JSON.to}}`)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := compile("b", `{{if .JSON.to}}{{.JSON.to}}{{end}}`)
	if err != nil {
		t.Fatal(err)
	}
	msg := consumer.Message{Body: []byte(`{"to":"x"}`)}
	var d *Data
	if s, err := fast.render(msg, &d); s != "x" || err != nil || d != nil {
		t.Fatalf("fast: %q, %v, data %v", s, err, d)
	}
	if s, err := slow.render(msg, &d); s != "x" || err != nil || d == nil {
		t.Fatalf("slow: %q, %v, data %v", s, err, d)
	}
	first := d
	if s, err := slow.render(msg, &d); s != "x" || err != nil || d != first {
		t.Fatalf("slow again: %q, %v; data built again", s, err)
	}
}
