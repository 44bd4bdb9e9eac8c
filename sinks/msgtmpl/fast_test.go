package msgtmpl

import (
	"errors"
	"strings"
	"testing"

	"github.com/throttlehq/throttle/consumer"
)

// fastShapes are templates of the shapes the fast path evaluates.
var fastShapes = []string{
	`{{.JSON.to}}`,
	`{{.JSON.a.b}}`,
	`{{.JSON}}`,
	`{{e164 .JSON.to}}`,
	`{{.JSON.to | e164}}`,
	`{{.JSON.a.b | e164}}`,
	`{{sms_segments .JSON.text}}`,
	`{{.JSON.text | sms_segments}}`,
	`{{sms_encoding .JSON.text}}`,
	`{{.JSON.to | e164 | sms_segments}}`,
	`{{slice .JSON.to 8}}`,
	`{{slice .JSON.to 2 5}}`,
	`{{slice .JSON.to 0 0}}`,
	`{{slice .JSON.to 3 | e164}}`,
	`{{slice .Key 1}}`,
	`{{slice .JSON.a.b 1 40}}`,
	``,
	`{{index .Headers "x-tenant"}}`,
	`{{index .Headers "x-tenant" | e164}}`,
	`{{.Headers.tenant}}`,
	`{{.Key}}`,
	`{{e164 .Key}}`,
	`{{.Body}}`,
	`t-{{.JSON.to}}:{{index .Headers "x-tenant"}} {{.Key}}`,
	" {{- .JSON.to -}} \n",
	`{{form "To" .JSON.to "Body" .JSON.text}}`,
	`{{form "b" .JSON.to "a" .Key "b" .JSON.text "x y&=é" .Headers.tenant}}`,
	`{{form "k" .JSON.a.b}}`,
	`{{form "" .JSON}}`,
	`body={{form "k" .Body}}&{{form "To" .JSON.to}}`,
}

// TestFastPathRecognised: the simple shapes have a fast path; anything
// else (a variable, a control structure, another function or argument)
// runs as a template.
func TestFastPathRecognised(t *testing.T) {
	for _, text := range fastShapes {
		c, err := compile("key", text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if c.fast == nil {
			t.Errorf("%q: no fast path", text)
		}
	}
	for _, text := range []string{
		`{{$.JSON.to}}`,
		`{{.JSON.to | html}}`,
		`{{e164 (index .Headers "x")}}`,
		`{{index .JSON "to"}}`,
		`{{index .Headers "a" "b"}}`,
		`{{index .Headers 1}}`,
		`{{print .JSON.to}}`,
		`{{e164 .JSON.to .JSON.b}}`,
		`{{.Source.Topic}}`,
		`{{.Attempt}}`,
		`{{.Key.x}}`,
		`{{.}}`,
		`{{$x := .JSON.to}}{{$x}}`,
		`{{if .JSON.to}}{{.JSON.to}}{{end}}`,
		`{{with .JSON}}{{.to}}{{end}}`,
		`{{block "b" .}}{{.JSON.to}}{{end}}`,
		`{{(.JSON).to}}`,
		`{{"x"}}`,
		`{{slice .JSON.to -1}}`,
		`{{slice .JSON.to 1.0}}`,
		`{{slice .JSON.to 0x1}}`,
		`{{slice .JSON.to 1 2 3}}`,
		`{{slice .JSON.to}}`,
		`{{slice .JSON.to .JSON.n}}`,
		`{{.JSON.to | slice 1}}`,
		`{{form .JSON}}`,
		`{{form "a" .JSON.to | e164}}`,
		`{{form "a" (e164 .JSON.to)}}`,
		`{{form "a" "b"}}`,
		`{{form 1 .JSON.to}}`,
		`{{form "a" .JSON.to "b"}}`,
		`{{form "a" (index .Headers "x")}}`,
		`{{form}}`,
	} {
		c, err := compile("key", text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if c.fast != nil {
			t.Errorf("%q: has a fast path", text)
		}
	}
}

// checkFastPath renders text for msg both ways: by the fast path and by
// Render on NewData. The fast path must render exactly when the template
// does (but for a body too large for it, and slice of an array), and
// the same bytes; when it
// gives up, compiled.render must fail exactly as Render does.
func checkFastPath(t *testing.T, text string, msg consumer.Message) {
	t.Helper()
	c, err := compile("limit.extra[0].key", text)
	if err != nil {
		t.Fatalf("%q: %v", text, err)
	}
	want, wantErr := Render(c.t, NewData(msg))
	if errors.Is(wantErr, errRanTooLong) {
		return // MaxTime on a starved machine: nothing to compare
	}
	got, ok := c.fast.eval(msg)
	switch {
	case ok && wantErr != nil:
		t.Errorf("%q on %q: fast path rendered %q, the template failed: %v", text, short(msg.Body), got, wantErr)
	case ok && got != string(want):
		t.Errorf("%q on %q: fast path rendered %q, the template %q", text, short(msg.Body), got, want)
	case !ok && wantErr == nil && len(msg.Body) <= fastMaxBody && !slicesArray(text, want) && !strings.Contains(text, "form"):
		t.Errorf("%q on %q: the fast path gave up, the template rendered %q", text, short(msg.Body), want)
	}
	var d *Data
	s, err := c.render(msg, &d)
	if s != string(want) || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
		t.Errorf("%q on %q: render = %q, %v; Render = %q, %v", text, short(msg.Body), s, err, want, wantErr)
	}
	for _, class := range []error{ErrNoValue, ErrNotJSON, ErrLimit} {
		if errors.Is(err, class) != errors.Is(wantErr, class) {
			t.Errorf("%q on %q: render error %v, Render error %v: not the same class", text, short(msg.Body), err, wantErr)
		}
	}
}

// short is body cut for an error message.
func short(body []byte) []byte {
	if len(body) > 80 {
		return append(body[:80:80], "..."...)
	}
	return body
}

// A form call's fast path renders strings and numbers only: it gives up
// on a null, a bool, an object, an array and a body that is not JSON,
// which the template renders (form formats them by fmt.Sprint, or repeats
// the key), so checkFastPath does not ask it to render those.
// TestFastPathUsed checks that it renders the strings and numbers.

// slicesArray reports whether text slices an array (it rendered out), which
// the fast path leaves to the template: text/template's slice reads up to
// the capacity of the decoder's slice, not its length.
func slicesArray(text string, out []byte) bool {
	return strings.Contains(text, "slice") && len(out) > 0 && out[0] == '['
}

// fastBodies are bodies the fast path must read as NewData does.
var fastBodies = []string{
	`{"to":"+12125550100","text":"hello","a":{"b":"+33612345678"}}`,
	` {"to" : "+1 (212) 555-0100" , "text" : "€€€" } `,
	"\t\r\n{\"to\":\"12125550100\"}\n",
	`{"to":12125550100,"text":12345678901234567890123}`,
	`{"to":-1.5e+300,"text":0}`,
	`{"to":1e999}`,
	`{"to":true,"text":false}`,
	`{"to":null,"text":null,"a":null}`,
	`{"to":"","text":""}`,
	`{}`,
	`{"a":{}}`,
	`{"a":{"b":null}}`,
	`{"a":[1,2]}`,
	`{"a":"x"}`,
	`{"a":1}`,
	`{"to":{"x":[1,"two",null,{"y":true}],"n":1.50}}`,
	`{"to":[]}`,
	`{"to":["a",["b"],{}]}`,
	`{"to":"first","to":"last"}`,
	`{"to":null,"to":"+12125550100"}`,
	`{"to":"+12125550100","to":null}`,
	`{"a":{"b":"1"},"a":{"c":"2"}}`,
	`{"a":{"b":"1","b":"2"}}`,
	`{"\u0074o":"escaped key"}`,
	`{"t\u006f":"x","to":"y"}`,
	`{"to\u0000":"nul in key"}`,
	`{"TO":"case","To":"matters"}`,
	`{"to":"tab\there \"quoted\" \\ \/ \b\f\n\r \u00e9 \ud83d\ude00 \ud800 \udc00x"}`,
	"{\"to\":\"\xff\xfe invalid utf-8\"}",
	"{\"\xffto\":\"bad key\"}",
	`{"to":"日本語 テキスト","text":"Привет 😀"}`,
	`{"to":"}{][,:\"\\"}`,
	`{"x":"{\"to\":1}","to":"after a string with braces"}`,
	`{"x":{"to":"nested, not top"},"y":[{"to":1}]}`,
	`["to"]`,
	`"to"`,
	`12125550100`,
	`null`,
	`true`,
	``,
	`   `,
	`not json`,
	`{"to":"x"} `,
	`{"to":"x"} {}`,
	`{"to":"x"} x`,
	`{"to":"x"}]`,
	`{"to":"x"},`,
	`{"to":"x"`,
	`{"to":"x",}`,
	`{"to":01}`,
	`{"to":"x" "y"}`,
	`{'to':'x'}`,
	"{\"to\":\"x\u0001\"}",
	"{\"to\":\"line\nbreak\"}",
	"\ufeff{\"to\":\"bom\"}",
	strings.Repeat(`{"a":`, 100) + `"deep"` + strings.Repeat(`}`, 100),
}

// bigBodies are large bodies, for fewer shapes (the template decodes each
// in full, slowly under -race).
var bigBodies = []string{
	`{"to":"` + strings.Repeat("x", 70_000) + `"}`,
	`{"pad":"` + strings.Repeat("y", 200_000) + `","to":"+12125550100","text":"` + strings.Repeat("€", 1000) + `"}`,
	`{"to":"` + strings.Repeat("\\u00e9", 10_000) + `"}`,
	strings.Repeat(`{"a":`, 5000) + `{"b":"deep"}` + strings.Repeat(`}`, 5000),
	strings.Repeat(`[`, 10_001) + strings.Repeat(`]`, 10_001), // past the decoder's depth
	`{"a":` + strings.Repeat(`[`, 10_001) + strings.Repeat(`]`, 10_001) + `}`,
}

// TestFastPathMatchesTemplate: every shape over bodies of every kind, with
// and without the header, renders by the fast path as by the template.
func TestFastPathMatchesTemplate(t *testing.T) {
	for _, text := range fastShapes {
		for _, body := range fastBodies {
			checkFastPath(t, text, consumer.Message{Body: []byte(body), Key: []byte("+12125550100")})
			checkFastPath(t, text, consumer.Message{Body: []byte(body), Headers: map[string]string{"x-tenant": "acme", "tenant": "+33 6 12 34 56 78"}})
		}
	}
	for _, text := range []string{`{{.JSON.to}}`, `{{sms_segments .JSON.text}}`, `{{.JSON.a.b}}`} {
		for _, body := range bigBodies {
			checkFastPath(t, text, consumer.Message{Body: []byte(body)})
		}
	}
	// Past Render's bound on the output, by the fast path's own reckoning.
	checkFastPath(t, `{{.Body}}{{.Body}}{{.Body}}{{.Body}}`, consumer.Message{Body: []byte(strings.Repeat("b", 600_000))})
	// Past the fast path's size: the template renders it.
	checkFastPath(t, `{{.JSON.to}}`, consumer.Message{Body: []byte(`{"to":"` + strings.Repeat("z", fastMaxBody) + `"}`)})
}

// TestFastPathUsed: the common key and cost templates render by the fast
// path, as their template does.
func TestFastPathUsed(t *testing.T) {
	msg := consumer.Message{
		Body:    []byte(`{"to":"+1 (212) 555-0100","n":-1.5e3,"text":"` + strings.Repeat("€", 81) + `"}`),
		Key:     []byte("k-1"),
		Headers: map[string]string{"x-tenant": "acme", "message-id": "m-1"},
	}
	for text, want := range map[string]string{
		`{{.JSON.to}}`:                    "+1 (212) 555-0100",
		`{{e164 .JSON.to}}`:               "+12125550100",
		`{{index .Headers "x-tenant"}}`:   "acme",
		`{{index .Headers "message-id"}}`: "m-1",
		`{{index .Headers "absent"}}`:     "",
		`{{sms_segments .JSON.text}}`:     "2",
		`{{sms_encoding .JSON.text}}`:     "GSM-7", // € is in its extension table
		`{{form "To" .JSON.to "Body" .JSON.text "Id" .Key "N" .JSON.n}}`: "Body=" + strings.Repeat("%E2%82%AC", 81) +
			"&Id=k-1&N=-1.5e3&To=%2B1+%28212%29+555-0100",
	} {
		c, err := compile("key", text)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := c.fast.eval(msg)
		if !ok || got != want {
			t.Errorf("%q: fast path = %q, %v; want %q", text, got, ok, want)
		}
		checkFastPath(t, text, msg)
	}
}

// FuzzFastPathMatchesTemplate: over any body, key and header, each shape
// the fast path evaluates renders (or gives up) as its template does.
func FuzzFastPathMatchesTemplate(f *testing.F) {
	for i, body := range fastBodies {
		f.Add([]byte(body), []byte("+12125550100"), "acme", i%2 == 0)
	}
	f.Add([]byte(`{"to":"+44 20 7946 0958"}`), []byte(nil), "", true)
	f.Add([]byte(`{"to":"00 33 6 12 34 56 78","text":"{}"}`), []byte("k"), "+1 212 555 0100", true)
	f.Fuzz(func(t *testing.T, body, key []byte, header string, withHeader bool) {
		msg := consumer.Message{Body: body, Key: key}
		if withHeader {
			msg.Headers = map[string]string{"x-tenant": header, "tenant": header}
		}
		for _, text := range fastShapes {
			checkFastPath(t, text, msg)
		}
	})
}

// BenchmarkKey renders the common key and cost templates of a message,
// as a keyed layer, a fair share, dedupe or a cost does for every
// message, and a form body as an HTTP sink does: by the fast path (the key, tenant, dedupe and cost functions)
// and by the template (Render on NewData, as before it).
func BenchmarkKey(b *testing.B) {
	msg := consumer.Message{
		Body:    []byte(`{"to":"+12125550100","from":"+15550100","text":"Your code is 123456","meta":{"campaign":"c-42","tags":["otp","us"]}}`),
		Headers: map[string]string{"x-tenant": "acme", "message-id": "m-000042"},
	}
	for _, bm := range []struct{ name, text string }{
		{"JSON", `{{.JSON.to}}`},
		{"E164", `{{e164 .JSON.to}}`},
		{"Header", `{{index .Headers "x-tenant"}}`},
		{"SMSSegments", `{{sms_segments .JSON.text}}`},
		{"Slice", `{{slice .JSON.to 8}}`},
		{"Form", `{{form "To" .JSON.to "Body" .JSON.text}}`}, // a sink's form body
	} {
		c, err := compile("key", bm.text)
		if err != nil {
			b.Fatal(err)
		}
		if c.fast == nil {
			b.Fatalf("%q: no fast path", bm.text)
		}
		b.Run(bm.name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var d *Data
				if _, err := c.render(msg, &d); err != nil || d != nil {
					b.Fatal(err, d)
				}
			}
		})
		b.Run(bm.name+"/template", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Render(c.t, NewData(msg)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
