package msgtmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
	"unicode/utf8"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/sms"
)

// The fast path. Most templates that run for every message before it is
// sent (a layer key, the fair tenant, a dedupe key, a cost) are one action
// that reads a field, such as {{.JSON.to}}, {{e164 .JSON.to}},
// {{index .Headers "x-tenant"}} or {{sms_segments .JSON.text}}, and so is
// the body of a form request, {{form "To" .JSON.to "Body" .JSON.text}}
// (keys that are constants, values that are fields). Decoding
// the whole body into maps and executing text/template for them costs
// several times what the rest of the message's wait does, so such a
// template is recognised when it is compiled and evaluated straight from
// the raw message: json.Valid checks that the body is one JSON value, as
// NewData's decoder does, and a scan finds the field's value, decoding
// that value alone.
//
// The fast path only ever renders what text/template renders: when it
// meets anything that would fail, or that it does not handle (a missing
// field, a null, a value that is not an object on the way down, a
// function that fails, a body that is not JSON), it gives up and the
// template runs as before, on NewData's Data, so that the errors are
// exactly those of Render.

// fastMaxBody is the largest body the fast path reads: a larger one runs
// through Render, whose execution is bounded in time (MaxTime), so that
// a function over a huge value fails as it always did.
const fastMaxBody = 1 << 20

// compiled is a template from Parse with its fast path, if it has one.
type compiled struct {
	t    *template.Template
	fast *fastTemplate // nil: not one the fast path evaluates
}

// compile parses text as Parse does and recognises its fast path.
func compile(name, text string) (*compiled, error) {
	t, err := Parse(name, text)
	if err != nil {
		return nil, err
	}
	return &compiled{t: t, fast: recognise(t)}, nil
}

// render renders c for msg: by the fast path when it can, else by Render
// on *d, built by NewData the first time it is needed, so that the
// templates rendered for one message decode it at most once.
func (c *compiled) render(msg consumer.Message, d **Data) (string, error) {
	if c.fast != nil {
		if s, ok := c.fast.eval(msg); ok {
			return s, nil
		}
	}
	if *d == nil {
		*d = NewData(msg)
	}
	b, err := Render(c.t, *d)
	return string(b), err
}

// fastTemplate is a template of text and simple actions, in order.
type fastTemplate struct {
	parts     []fastPart
	readsJSON bool
}

// srcKind is what a simple action reads.
type srcKind int

const (
	srcText   srcKind = iota // no action: the text
	srcJSON                  // .JSON.a.b: path
	srcHeader                // index .Headers "name", .Headers.name: name
	srcKey                   // .Key
	srcBody                  // .Body
	srcForm                  // form "k" source "k2" source ...: pairs
)

// fastFunc is a function a simple action may pass its value through:
// pure and cheap.
type fastFunc int

const (
	fnE164        fastFunc = iota // e164 (FuncMap)
	fnSMSSegments                 // sms_segments (FuncMap)
	fnSMSEncoding                 // sms_encoding (FuncMap)
	fnSlice                       // the builtin slice of a string, with constant indexes
)

var fastFuncs = map[string]fastFunc{"e164": fnE164, "sms_segments": fnSMSSegments, "sms_encoding": fnSMSEncoding}

// fastCall is a call of a fastFunc: for fnSlice, its indexes (to -1 for
// none, as in {{slice .JSON.to 8}}).
type fastCall struct {
	fn       fastFunc
	from, to int
}

// fastPart is a text or a simple action: a source, then the functions its
// value goes through, in order.
type fastPart struct {
	src        srcKind
	text       string
	path       []string
	header     string
	mustHeader bool // .Headers.name: a missing header fails (missingkey=error)
	calls      []fastCall
	// pairs are the keys and values of a form call (srcForm), in the
	// order Encode writes them: by key, those of one key as given.
	pairs []formPair
}

// formPair is a key of a form call, escaped, and the source of its value.
type formPair struct {
	key string
	val fastPart
}

// recognise returns the fast path of t, which comes from Parse, or nil
// when t is not text and simple actions. It reads t's tree as guard left
// it: the marks at its start and end, and valueFunc ending each action.
func recognise(t *template.Template) *fastTemplate {
	if t.Tree == nil || t.Root == nil {
		return nil
	}
	nodes := t.Root.Nodes
	if len(nodes) < 2 || !isMark(nodes[0], enterMark) || !isMark(nodes[len(nodes)-1], exitMark) {
		return nil
	}
	f := &fastTemplate{}
	for _, n := range nodes[1 : len(nodes)-1] {
		switch n := n.(type) {
		case *parse.TextNode:
			if len(n.Text) == 0 && cap(n.Text) > 0 {
				return nil // a mark: not a plain text
			}
			f.parts = append(f.parts, fastPart{src: srcText, text: string(n.Text)})
		case *parse.ActionNode:
			p, ok := simpleAction(n.Pipe)
			if !ok {
				return nil
			}
			f.readsJSON = f.readsJSON || p.src == srcJSON
			for _, fp := range p.pairs {
				f.readsJSON = f.readsJSON || fp.val.src == srcJSON
			}
			f.parts = append(f.parts, p)
		default:
			return nil
		}
	}
	return f
}

func isMark(n parse.Node, m []byte) bool {
	t, ok := n.(*parse.TextNode)
	return ok && len(t.Text) == 0 && cap(t.Text) > 0 && &t.Text[:1][0] == &m[:1][0]
}

// simpleAction recognises the pipeline of a printing action as guard left
// it: a source, called by a function ({{e164 .JSON.to}}) or not, then
// functions it is piped to ({{.JSON.to | e164}}), then valueFunc.
func simpleAction(p *parse.PipeNode) (fastPart, bool) {
	var part fastPart
	if p == nil || p.IsAssign || len(p.Decl) > 0 || len(p.Cmds) < 2 {
		return part, false
	}
	last := p.Cmds[len(p.Cmds)-1]
	if id, ok := last.Args[0].(*parse.IdentifierNode); !ok || id.Ident != valueFunc || len(last.Args) != 3 {
		return part, false
	}
	cmds := p.Cmds[:len(p.Cmds)-1]
	args := cmds[0].Args
	if id, ok := args[0].(*parse.IdentifierNode); ok && id.Ident == "form" {
		if len(cmds) != 1 {
			return part, false
		}
		return formAction(args[1:])
	}
	// A function called with the source: {{e164 .JSON.to}},
	// {{slice .JSON.to 8}}.
	if id, ok := args[0].(*parse.IdentifierNode); ok && id.Ident == "slice" && (len(args) == 3 || len(args) == 4) {
		call := fastCall{fn: fnSlice, to: -1}
		if call.from, ok = constIndex(args[2]); !ok {
			return part, false
		}
		if len(args) == 4 {
			if call.to, ok = constIndex(args[3]); !ok {
				return part, false
			}
		}
		part.calls = append(part.calls, call)
		args = args[1:2]
	} else if ok && len(args) == 2 {
		fn, ok := fastFuncs[id.Ident]
		if !ok {
			return part, false
		}
		part.calls = append(part.calls, fastCall{fn: fn})
		args = args[1:]
	}
	if !source(&part, args) {
		return part, false
	}
	for _, c := range cmds[1:] {
		if len(c.Args) != 1 {
			return part, false
		}
		id, ok := c.Args[0].(*parse.IdentifierNode)
		if !ok {
			return part, false
		}
		fn, ok := fastFuncs[id.Ident]
		if !ok {
			return part, false
		}
		part.calls = append(part.calls, fastCall{fn: fn})
	}
	return part, true
}

// formAction recognises the arguments of a form call that are constant
// keys and simple sources in turn, {{form "To" .JSON.to "Body"
// .JSON.text}}, as a srcForm part. The pairs are sorted by key once here,
// stably, as url.Values.Encode writes them.
func formAction(args []parse.Node) (fastPart, bool) {
	part := fastPart{src: srcForm}
	if len(args) == 0 || len(args)%2 != 0 {
		return part, false
	}
	for i := 0; i < len(args); i += 2 {
		k, ok := args[i].(*parse.StringNode)
		if !ok {
			return part, false
		}
		var v fastPart
		if !source(&v, args[i+1:i+2]) {
			return part, false
		}
		part.pairs = append(part.pairs, formPair{key: k.Text, val: v})
	}
	slices.SortStableFunc(part.pairs, func(a, b formPair) int { return strings.Compare(a.key, b.key) })
	for i := range part.pairs {
		part.pairs[i].key = url.QueryEscape(part.pairs[i].key)
	}
	return part, true
}

// constIndex returns the index n is, a decimal integer constant.
func constIndex(n parse.Node) (int, bool) {
	c, ok := n.(*parse.NumberNode)
	if !ok || !c.IsInt || c.Text == "" || strings.Trim(c.Text, "0123456789") != "" || c.Int64 > 1<<30 {
		return 0, false
	}
	return int(c.Int64), true
}

// source recognises the arguments of a command that yields a value of the
// message: .JSON.a.b, .Key, .Body, .Headers.name or index .Headers "name".
func source(part *fastPart, args []parse.Node) bool {
	switch len(args) {
	case 1:
		f, ok := args[0].(*parse.FieldNode)
		if !ok {
			return false
		}
		switch {
		case f.Ident[0] == "JSON":
			part.src, part.path = srcJSON, f.Ident[1:]
		case f.Ident[0] == "Key" && len(f.Ident) == 1:
			part.src = srcKey
		case f.Ident[0] == "Body" && len(f.Ident) == 1:
			part.src = srcBody
		case f.Ident[0] == "Headers" && len(f.Ident) == 2:
			part.src, part.header, part.mustHeader = srcHeader, f.Ident[1], true
		default:
			return false
		}
		return true
	case 3:
		id, ok := args[0].(*parse.IdentifierNode)
		if !ok || id.Ident != "index" {
			return false
		}
		f, ok := args[1].(*parse.FieldNode)
		if !ok || len(f.Ident) != 1 || f.Ident[0] != "Headers" {
			return false
		}
		s, ok := args[2].(*parse.StringNode)
		if !ok {
			return false
		}
		part.src, part.header = srcHeader, s.Text
		return true
	}
	return false
}

// eval renders f for msg, or returns false when the template must run.
func (f *fastTemplate) eval(msg consumer.Message) (string, bool) {
	if len(msg.Body) > fastMaxBody || f.readsJSON && !json.Valid(msg.Body) {
		return "", false
	}
	var out string
	if len(f.parts) == 1 {
		var ok bool
		if out, ok = f.parts[0].eval(msg); !ok {
			return "", false
		}
	} else {
		var b strings.Builder
		for i := range f.parts {
			s, ok := f.parts[i].eval(msg)
			if !ok {
				return "", false
			}
			b.WriteString(s)
		}
		out = b.String()
	}
	// Render's bound on the output, which actions that repeat the body
	// can pass ({{.Body}}{{.Body}}{{.Body}}{{.Body}}).
	if len(out) > MaxOutputBase+2*len(msg.Body) {
		return "", false
	}
	return out, true
}

// valueKind is what a simple action's value is, as the fast path carries
// it.
type valueKind int

const (
	kindText  valueKind = iota // a string or a JSON number (json.Number), its text
	kindInt                    // an int (sms_segments), its decimal text
	kindOther                  // anything else: a bool, a map or a slice
)

// eval returns what the part prints for msg, whose body (if the part
// reads it as JSON) is valid JSON, or false when it may fail. A string
// and a JSON number are the same to it: every function it calls takes a
// json.Number as its text, and prints it so.
func (p *fastPart) eval(msg consumer.Message) (string, bool) {
	var s string
	var other any
	kind := kindText
	switch p.src {
	case srcText:
		return p.text, true
	case srcForm:
		return p.evalForm(msg)
	case srcKey:
		s = string(msg.Key)
	case srcBody:
		s = string(msg.Body)
	case srcHeader:
		h, ok := msg.Headers[p.header]
		if !ok && p.mustHeader {
			return "", false
		}
		s = h
	case srcJSON:
		raw, ok := jsonLookup(msg.Body, p.path)
		if !ok {
			return "", false
		}
		if s, other, ok = jsonValue(raw); !ok {
			return "", false // a null, which valueFunc fails
		}
		if other != nil {
			kind = kindOther
		}
	}
	for _, c := range p.calls {
		if kind != kindText {
			return "", false // each fails on anything else, or is left to the template
		}
		var err error
		switch c.fn {
		case fnE164:
			s, err = e164String(s)
		case fnSMSSegments: // smsSegments
			s, kind = strconv.Itoa(sms.Segments(s)), kindInt
		case fnSMSEncoding: // smsEncoding
			s = sms.Detect(s).String()
		case fnSlice:
			if c.to < 0 {
				c.to = len(s)
			}
			if c.from > c.to || c.to > len(s) {
				return "", false
			}
			s = s[c.from:c.to]
		}
		if err != nil {
			return "", false
		}
	}
	if kind != kindOther {
		return s, true
	}
	if b, ok := other.(bool); ok {
		return strconv.FormatBool(b), true
	}
	return fmt.Sprint(other), true // as text/template prints it
}

// evalForm returns what form prints for the pairs of p, a srcForm part,
// as formFunc encodes them, or false when a value is not a string or a
// number (form formats those by fmt.Sprint, and a slice value repeats its
// key: the template renders them).
func (p *fastPart) evalForm(msg consumer.Message) (string, bool) {
	var b strings.Builder
	for i := range p.pairs {
		fp := &p.pairs[i]
		var v string
		switch fp.val.src {
		case srcJSON:
			raw, ok := jsonLookup(msg.Body, fp.val.path)
			if !ok || (raw[0] != '"' && raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
				return "", false
			}
			if v, _, ok = jsonValue(raw); !ok {
				return "", false
			}
		default:
			var ok bool
			if v, ok = fp.val.eval(msg); !ok {
				return "", false
			}
		}
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(fp.key)
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(v))
	}
	return b.String(), true
}

// jsonLookup returns the raw value at path in body, valid JSON: the
// value of the last member named path[0] of the object body, and so on,
// as decoding into maps keeps the last of duplicate names. It returns
// false when a value on the way is not an object or lacks the member.
func jsonLookup(body []byte, path []string) ([]byte, bool) {
	v := trimSpace(body)
	for _, name := range path {
		if len(v) == 0 || v[0] != '{' {
			return nil, false
		}
		var found []byte
		i := skipSpace(v, 1)
		if v[i] == '}' {
			return nil, false
		}
		for {
			// "key" ws : ws value ws (, or })
			end := stringEnd(v, i)
			key := v[i:end]
			i = skipSpace(v, end)
			i = skipSpace(v, i+1) // the colon
			vend := valueEnd(v, i)
			if keyIs(key, name) {
				found = v[i:vend]
			}
			i = skipSpace(v, vend)
			if v[i] == '}' {
				break
			}
			i = skipSpace(v, i+1) // the comma
		}
		if found == nil {
			return nil, false
		}
		v = found
	}
	return v, true
}

// jsonValue returns raw, one valid JSON value, as NewData decodes it: a
// string or a number as its text, anything else as other; false for a
// null.
func jsonValue(raw []byte) (text string, other any, ok bool) {
	switch raw[0] {
	case 'n':
		return "", nil, false
	case 't':
		return "", true, true
	case 'f':
		return "", false, true
	case '"':
		text, ok = jsonString(raw)
		return text, nil, ok
	case '{', '[':
		other, ok = decode(raw)
		return "", other, ok
	}
	return string(raw), nil, true // json.Number's text
}

// decode decodes raw as NewData decodes a body.
func decode(raw []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	return v, true
}

// jsonString returns the JSON string raw (quotes included) unescaped as
// encoding/json does: as it is when it has no escape and is valid UTF-8,
// by encoding/json otherwise.
func jsonString(raw []byte) (string, bool) {
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// keyIs reports whether the JSON string key (quotes included) decodes to
// name, a template identifier.
func keyIs(key []byte, name string) bool {
	in := key[1 : len(key)-1]
	if bytes.IndexByte(in, '\\') < 0 {
		// Invalid UTF-8 decodes to U+FFFD, which no identifier holds;
		// otherwise the text is the key.
		return string(in) == name
	}
	s, ok := jsonString(key)
	return ok && s == name
}

// The scanning functions below read valid JSON (json.Valid) only: they
// find where things end, not whether they are well formed.

func trimSpace(b []byte) []byte {
	i := skipSpace(b, 0)
	j := len(b)
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// stringEnd returns the index after the string that starts at b[i].
func stringEnd(b []byte, i int) int {
	for i++; ; i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// valueEnd returns the index after the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
		i++
	}
	return i
}

// Template is a message template compiled for rendering message after
// message, such as a sink's request body: a template of text and simple
// actions (see the fast path above: fields, e164, sms_segments, a form
// of fields, ...) renders straight from the raw message, any other by
// Render on NewData. Both render the same bytes and fail alike. Compile
// makes one; it is safe for concurrent use.
type Template struct{ c *compiled }

// Compile parses text as Parse does, as a template called name, and
// recognises its fast path.
func Compile(name, text string) (*Template, error) {
	c, err := compile(name, text)
	if err != nil {
		return nil, err
	}
	return &Template{c: c}, nil
}

// Execute renders t for msg, as Render renders t's template on
// NewData(msg), with Render's errors. data holds the message's Data for
// the templates rendered on it: point it at a nil *Data for the first
// one; it is built (once) only when a template cannot take the fast path.
func (t *Template) Execute(msg consumer.Message, data **Data) (string, error) {
	return t.c.render(msg, data)
}
