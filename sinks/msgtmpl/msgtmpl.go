package msgtmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/template"

	"github.com/throttlehq/throttle/consumer"
)

// Data is what a message template sees for one message. Build it with
// [NewData]; it is a plain value and may be shared by the templates run on
// the same message.
type Data struct {
	// JSON is the body decoded as JSON (numbers as json.Number, so they
	// keep their exact text), or nil when the body is not one valid JSON
	// value. For a JSON object, {{.JSON.field}} reads a field.
	JSON any
	// notJSON says why the body is not JSON (wrapping ErrNotJSON), nil
	// when it is.
	notJSON error
	// Body is the raw body as a string.
	Body string
	// Key is the message key as a string.
	Key string
	// Headers are the message headers, never nil.
	Headers map[string]string
	// Source is where the message came from.
	Source consumer.Source
	// Attempt is the delivery attempt, 1 for the first.
	Attempt int
}

// NewData builds the Data of msg. It decodes the body once; a body that is
// not exactly one JSON value leaves JSON nil, and a template that reads
// .JSON then fails with ErrNotJSON and the reason.
func NewData(msg consumer.Message) *Data {
	d := &Data{
		Body:    string(msg.Body),
		Key:     string(msg.Key),
		Headers: msg.Headers,
		Source:  msg.Source,
		Attempt: msg.Attempt,
	}
	if d.Headers == nil {
		d.Headers = map[string]string{}
	}
	dec := json.NewDecoder(bytes.NewReader(msg.Body))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	if err == nil {
		// Only a body that is one JSON value and nothing else.
		if _, err = dec.Token(); err == nil {
			err = errors.New("more than one JSON value")
		}
	} else if err == io.EOF {
		err = errors.New("empty")
	}
	if err == io.EOF {
		d.JSON = v
	} else {
		d.notJSON = fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	return d
}

// FuncMap returns the functions a message template may call besides the
// text/template builtins, in a new map the caller may modify. To add a
// function for every message template, add it to funcs in funcs.go.
func FuncMap() template.FuncMap {
	m := make(template.FuncMap, len(funcs))
	for name, f := range funcs {
		m[name] = f
	}
	return m
}

// Parse parses text as a message template called name, with [FuncMap] and
// missingkey=error. Its error names the template (name) and the line, such
// as `template: body_template:1: function "jsn" not defined`. The template
// it returns is prepared for [Render], which checks what it prints and
// bounds its execution; do not add to it with its Parse or AddParseTree.
func Parse(name, text string) (*template.Template, error) {
	t, err := template.New(name).Funcs(FuncMap()).Funcs(template.FuncMap{valueFunc: noValue}).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, err
	}
	guard(t)
	return t, nil
}

// Render executes t, which should come from [Parse], on data and returns
// the output. It runs in the calling goroutine and stops at the first
// limit reached (see MaxSteps), running again an execution that only
// MaxTime stopped (see MaxTimeRuns). Its error names the template; it
// matches ErrNoValue for a printed null or missing value, ErrNotJSON when
// the template reads .JSON of a body that is not JSON, and ErrLimit for a
// limit reached.
func Render(t *template.Template, data *Data) ([]byte, error) {
	var w *limitedWriter
	var err error
	for range MaxTimeRuns {
		w = newLimitedWriter(len(data.Body))
		if err = t.Execute(w, data); !errors.Is(err, errRanTooLong) {
			break
		}
	}
	if err == nil {
		return w.buf.Bytes(), nil
	}
	var nv *noValueError
	switch {
	case data.notJSON != nil && readsJSON(t):
		return nil, fmt.Errorf("rendering %s: %w; %w", t.Name(), data.notJSON, err)
	case errors.As(err, &nv):
		return nil, fmt.Errorf("rendering %s: %w", t.Name(), nv)
	}
	return nil, fmt.Errorf("rendering %s: %w", t.Name(), err)
}
