package msgtmpl

import (
	"bytes"
	"errors"
	"fmt"
	"text/template"
	"text/template/parse"
	"time"
)

// The limits of one execution of a message template ([Render]). An
// execution that reaches one stops at once, in the calling goroutine, with
// an error that matches [ErrLimit] and says which limit it reached: a
// template that loops or recurses without end, or over a huge message,
// fails that message instead of holding the consumer. A template that
// renders a message key or a cost takes microseconds, far below them.
const (
	// MaxSteps bounds the loop iterations ({{range}}) and template calls
	// ({{template}}) of one execution, counted together. 100,000 empty
	// iterations take about 8 ms.
	MaxSteps = 100_000
	// MaxDepth bounds the template calls nested in one another.
	MaxDepth = 1000
	// MaxTime bounds the time of one execution, read at every step and
	// every write of output: it stops the steps that each take long
	// (such as encoding a large body again and again). It is wall-clock
	// time, which a process starved of CPU (a loaded machine, a long GC
	// pause) can pass on a template of microseconds: an execution stopped
	// by MaxTime alone runs again, MaxTimeRuns times in all, before Render
	// fails. The other limits are the template's own and fail at once.
	MaxTime = 250 * time.Millisecond
	// MaxTimeRuns is how many executions MaxTime may stop in a row
	// before Render fails.
	MaxTimeRuns = 3
	// MaxOutputBase is the output one execution may write besides twice
	// the message body: at most MaxOutputBase + 2*len(Body) bytes.
	MaxOutputBase = 1 << 20
)

var (
	// ErrLimit is matched (errors.Is) by the error of an execution that
	// reached one of the limits above.
	ErrLimit = errors.New("message template stopped")
	// ErrNoValue is matched by the error of an execution that printed a
	// JSON null or a missing value.
	ErrNoValue = errors.New("no value")
	// ErrNotJSON is matched by the error of a template that reads .JSON of
	// a message whose body is not one JSON value.
	ErrNotJSON = errors.New("message body is not JSON")
)

// errRanTooLong is the error of an execution stopped by MaxTime.
var errRanTooLong = fmt.Errorf("%w: ran for more than %v", ErrLimit, MaxTime)

// now is the clock of MaxTime; tests replace it.
var now = time.Now

// The marks that guard inserts as empty text into a parsed template: the
// executor writes each as it passes, and limitedWriter tells them from
// output by their backing array. Each has a capacity of one so that it has
// an address of its own; a copy of the tree (parse.Tree.Copy) would write
// an ordinary empty text instead, which changes nothing.
var (
	stepMark  = make([]byte, 0, 1) // an iteration of a range
	enterMark = make([]byte, 0, 1) // the start of a template
	exitMark  = make([]byte, 0, 1) // its end
)

// valueFunc is the name of the function guard appends to each printing
// action: it passes its last argument on, or fails on a nil one, which
// text/template would print as "<no value>".
const valueFunc = "_msgtmpl_value"

// noValue is the function valueFunc: loc and action say where the action
// is and what it reads.
func noValue(loc, action string, v any) (any, error) {
	if v == nil {
		return nil, &noValueError{loc: loc, action: action}
	}
	return v, nil
}

// noValueError reports a printed nil: a JSON null, or a missing value
// that index or a range yields.
type noValueError struct{ loc, action string }

func (e *noValueError) Error() string {
	return e.loc + ": " + e.action + " has no value (a JSON null or a missing field)"
}

func (e *noValueError) Is(target error) bool { return target == ErrNoValue }

// guard rewrites the trees of t, as parsed, for [Render]: a mark at the
// start and end of each template and at the start of each range
// iteration, and valueFunc at the end of each action that prints. It runs
// once, before t is executed.
func guard(t *template.Template) {
	seen := make(map[*parse.Tree]bool)
	for _, tt := range append(t.Templates(), t) {
		tree := tt.Tree
		if tree == nil || tree.Root == nil || seen[tree] {
			continue
		}
		seen[tree] = true
		inspect(tree.Root, func(n parse.Node) {
			switch n := n.(type) {
			case *parse.RangeNode:
				n.List.Nodes = append([]parse.Node{mark(n.Position(), stepMark)}, n.List.Nodes...)
			case *parse.ActionNode:
				if len(n.Pipe.Decl) > 0 {
					return // {{$x := ...}} prints nothing
				}
				loc, _ := tree.ErrorContext(n)
				check := &parse.CommandNode{NodeType: parse.NodeCommand, Pos: n.Position(), Args: []parse.Node{
					parse.NewIdentifier(valueFunc).SetTree(tree).SetPos(n.Position()),
					str(n.Position(), loc), str(n.Position(), n.String()),
				}}
				n.Pipe.Cmds = append(n.Pipe.Cmds, check)
			}
		})
		root := tree.Root
		root.Nodes = append(append([]parse.Node{mark(root.Position(), enterMark)}, root.Nodes...), mark(root.Position(), exitMark))
	}
}

func mark(pos parse.Pos, m []byte) *parse.TextNode {
	return &parse.TextNode{NodeType: parse.NodeText, Pos: pos, Text: m}
}

func str(pos parse.Pos, s string) *parse.StringNode {
	return &parse.StringNode{NodeType: parse.NodeString, Pos: pos, Quoted: fmt.Sprintf("%q", s), Text: s}
}

// inspect calls f for n and every node under it, parents first.
func inspect(n parse.Node, f func(parse.Node)) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		f(n)
		for _, c := range n.Nodes {
			inspect(c, f)
		}
		return
	case *parse.PipeNode:
		if n == nil {
			return
		}
		f(n)
		for _, c := range n.Cmds {
			inspect(c, f)
		}
		return
	}
	f(n)
	switch n := n.(type) {
	case *parse.ActionNode:
		inspect(n.Pipe, f)
	case *parse.CommandNode:
		for _, a := range n.Args {
			inspect(a, f)
		}
	case *parse.ChainNode:
		inspect(n.Node, f)
	case *parse.IfNode:
		inspect(n.Pipe, f)
		inspect(n.List, f)
		inspect(n.ElseList, f)
	case *parse.RangeNode:
		inspect(n.Pipe, f)
		inspect(n.List, f)
		inspect(n.ElseList, f)
	case *parse.WithNode:
		inspect(n.Pipe, f)
		inspect(n.List, f)
		inspect(n.ElseList, f)
	case *parse.TemplateNode:
		inspect(n.Pipe, f)
	}
}

// readsJSON reports whether a template of t reads .JSON (or $.JSON) of the
// data.
func readsJSON(t *template.Template) bool {
	found := false
	for _, tt := range append(t.Templates(), t) {
		if tt.Tree == nil || found {
			continue
		}
		inspect(tt.Tree.Root, func(n parse.Node) {
			switch n := n.(type) {
			case *parse.FieldNode:
				found = found || n.Ident[0] == "JSON"
			case *parse.VariableNode:
				found = found || len(n.Ident) > 1 && n.Ident[0] == "$" && n.Ident[1] == "JSON"
			case *parse.ChainNode:
				found = found || n.Field[0] == "JSON"
			}
		})
	}
	return found
}

// limitedWriter is the output of one execution: it counts the marks and
// the bytes written and fails the write that passes a limit, which stops
// the execution. It is not safe for concurrent use.
type limitedWriter struct {
	buf       bytes.Buffer
	steps     int
	depth     int
	maxOutput int
	deadline  time.Time
}

func newLimitedWriter(body int) *limitedWriter {
	return &limitedWriter{maxOutput: MaxOutputBase + 2*body, deadline: now().Add(MaxTime)}
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if len(p) == 0 && cap(p) > 0 {
		switch &p[:1][0] {
		case &stepMark[:1][0]:
			w.steps++
		case &enterMark[:1][0]:
			w.steps++
			w.depth++
		case &exitMark[:1][0]:
			w.depth--
		}
		switch {
		case w.steps > MaxSteps:
			return 0, fmt.Errorf("%w: more than %d loop iterations and template calls", ErrLimit, MaxSteps)
		case w.depth > MaxDepth:
			return 0, fmt.Errorf("%w: more than %d nested template calls", ErrLimit, MaxDepth)
		}
	}
	if w.buf.Len()+len(p) > w.maxOutput {
		return 0, fmt.Errorf("%w: more than %d bytes of output", ErrLimit, w.maxOutput)
	}
	if now().After(w.deadline) {
		return 0, errRanTooLong
	}
	return w.buf.Write(p)
}
