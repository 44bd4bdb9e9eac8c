package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/internal/envexpand"
	"github.com/throttlehq/throttle/limiter"
)

// maxWalkSteps bounds the work done on one document, so that nested aliases
// cannot make loading explode.
const maxWalkSteps = 100_000

// expandState records what expansion did to a scalar node; alias targets are
// visited more than once but must be expanded only once.
type expandState int

const (
	expandedPlain expandState = iota + 1 // no ${...} reference
	expandedRefs                         // at least one ${...} reference
	expandFailed                         // an error was already reported
)

// walker checks a YAML tree against the shape of Config before it is
// decoded. It expands variables in scalars, reports unknown and duplicate
// keys and values of the wrong type under their dotted key path, and
// prepares scalars so that the final Node.Decode does what the schema means.
// It removes or resets what it rejects, so that the tree can still be
// decoded and validated and every problem reported at once.
//
// yaml.Decoder.KnownFields cannot be used here: Node.Decode, which must run
// after expansion, ignores it, and its messages name neither the key path
// nor anything but the innermost key.
type walker struct {
	lookup   func(string) (string, bool)
	problems []Problem
	lines    map[string]int // the line of each key path met, for Parse
	merging  int            // > 0 while walking the value of a merge key
	expanded map[*yaml.Node]expandState
	original map[*yaml.Node]string // text before expansion, for nodes with references
	active   map[*yaml.Node]bool
	steps    int
	fatal    bool // the tree cannot be decoded at all
}

func newWalker(lookup func(string) (string, bool)) *walker {
	return &walker{
		lookup:   lookup,
		expanded: make(map[*yaml.Node]expandState),
		original: make(map[*yaml.Node]string),
		active:   make(map[*yaml.Node]bool),
		lines:    make(map[string]int),
	}
}

// add records a problem at key, found at line of the document.
func (w *walker) add(line int, key, format string, args ...any) {
	w.problems = append(w.problems, Problem{Key: key, Message: fmt.Sprintf(format, args...), Line: line})
}

// line records the line of the key at path. A key set explicitly wins
// over one a merge key (<<) brings in, whichever comes first.
func (w *walker) line(path string, line int) {
	if _, ok := w.lines[path]; ok && w.merging > 0 {
		return
	}
	w.lines[path] = line
}

// walk checks n, which is to be decoded into a value of type t at path.
func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	w.steps++
	if w.steps > maxWalkSteps {
		if !w.fatal {
			w.fatal = true
			w.add(n.Line, path, "document too complex (too many nested aliases)")
		}
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			w.walk(c, t, path)
		}
		return
	case yaml.AliasNode:
		target := n.Alias
		if target == nil {
			return
		}
		if w.active[target] {
			w.fatal = true
			w.add(n.Line, path, "alias *%s refers to a value that contains it", n.Value)
			return
		}
		w.active[target] = true
		w.walk(target, t, path)
		delete(w.active, target)
		return
	case yaml.ScalarNode:
		if !w.expand(n, t, path) {
			return
		}
	}

	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	switch base.Kind() {
	case reflect.Struct:
		if isNull(n) {
			if t.Kind() == reflect.Pointer {
				// A present but empty choice, such as "stdout:", selects
				// it: make it decode to a non-nil pointer.
				*n = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column}
			}
			return
		}
		if n.Kind != yaml.MappingNode {
			w.reject(n, t, path, "expected a mapping, got %s", describeNode(n))
			return
		}
		w.walkStruct(n, base, path)
	case reflect.Map:
		if isNull(n) {
			return
		}
		if n.Kind != yaml.MappingNode {
			w.reject(n, t, path, "expected a mapping, got %s", describeNode(n))
			return
		}
		seen := make(map[string]int)
		w.filterPairs(n, func(k, v *yaml.Node) bool {
			name, ok := w.key(k, path)
			if !ok || w.duplicate(seen, k, name, path) {
				return false
			}
			w.line(join(path, name), k.Line)
			w.walk(v, base.Elem(), join(path, name))
			return true
		})
	case reflect.Slice:
		if isNull(n) {
			return
		}
		if n.Kind == yaml.ScalarNode && base == reflect.TypeFor[StringList]() {
			// A StringList may be written as one scalar: status: 429.
			item := *n
			*n = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: n.Line, Column: n.Column, Content: []*yaml.Node{&item}}
		}
		if n.Kind != yaml.SequenceNode {
			w.reject(n, t, path, "expected a list, got %s", describeNode(n))
			return
		}
		for i, item := range n.Content {
			w.line(fmt.Sprintf("%s[%d]", path, i), item.Line)
			w.walk(item, base.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		w.walkLeaf(n, t, base, path)
	}
}

// walkStruct checks a mapping destined for the struct type t.
func (w *walker) walkStruct(n *yaml.Node, t reflect.Type, path string) {
	fields := yamlFields(t)
	seen := make(map[string]int)
	w.filterPairs(n, func(k, v *yaml.Node) bool {
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			if !isMergeable(v) {
				w.add(v.Line, path, "the value of a merge key (<<) must be a mapping or a list of mappings")
				return false
			}
			w.walkMerge(v, t, path)
			return true
		}
		name, ok := w.key(k, path)
		if !ok || w.duplicate(seen, k, name, path) {
			return false
		}
		f, ok := fields[name]
		if !ok {
			w.add(k.Line, join(path, name), "unknown key%s", suggest(name, fields))
			return false
		}
		w.line(join(path, name), k.Line)
		checks := strings.Split(f.Tag.Get("check"), ",")
		if slices.Contains(checks, "rate") {
			w.walkRate(v, f.Type, join(path, name))
		} else {
			w.walk(v, f.Type, join(path, name))
		}
		if slices.Contains(checks, "nonzero") {
			w.checkNonZero(v, f.Type, join(path, name))
		}
		return true
	})
}

// walkRate checks a rate: a number per second, or a string such as "5/h"
// that limiter.ParseRate understands, which it rewrites as the number per
// second for decoding.
func (w *walker) walkRate(n *yaml.Node, t reflect.Type, path string) {
	target := n
	if target.Kind == yaml.AliasNode && target.Alias != nil {
		target = target.Alias
	}
	if target.Kind != yaml.ScalarNode || !w.expand(target, t, path) || isNull(target) {
		w.walk(n, t, path)
		return
	}
	rate, err := limiter.ParseRate(target.Value)
	if err != nil {
		msg := paramMessage(err)
		if w.expanded[target] == expandedRefs {
			// Do not echo what came from the environment.
			msg = fmt.Sprintf("%q does not expand to a rate: %s", w.original[target], strings.SplitN(msg, ", got", 2)[0])
		}
		w.reject(target, t, path, "%s", msg)
		w.expanded[target] = expandFailed
		return
	}
	target.Value = strconv.FormatFloat(rate, 'g', -1, 64)
	target.Tag = "!!float"
	target.Style = 0
	w.expanded[target] = expandedPlain
}

// checkNonZero reports a value that was given but is zero, for a key whose
// zero means "the default": writing 0 there is a mistake (burst: 0 is not
// a bucket that never refills, nor silently the default). Omitting the key,
// or a value that expands to nothing, gives the default.
func (w *walker) checkNonZero(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode || isNull(n) || w.expanded[n] == expandFailed {
		return
	}
	v := reflect.New(t)
	if err := n.Decode(v.Interface()); err != nil || !v.Elem().IsZero() {
		return
	}
	w.reject(n, t, path, "must not be 0; omit the key for the default")
}

// filterPairs calls keep for each key and value of the mapping n, and drops
// the pairs for which it returns false.
func (w *walker) filterPairs(n *yaml.Node, keep func(k, v *yaml.Node) bool) {
	kept := n.Content[:0:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		if keep(n.Content[i], n.Content[i+1]) {
			kept = append(kept, n.Content[i], n.Content[i+1])
		}
	}
	n.Content = kept
}

// isMergeable reports whether v can be the value of a "<<" merge key.
func isMergeable(v *yaml.Node) bool {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	switch v.Kind {
	case yaml.MappingNode:
		return true
	case yaml.SequenceNode:
		for _, item := range v.Content {
			if item.Kind == yaml.AliasNode && item.Alias != nil {
				item = item.Alias
			}
			if item.Kind != yaml.MappingNode {
				return false
			}
		}
		return true
	default:
		return false
	}
}

// walkMerge checks the value of a "<<" merge key, which isMergeable accepted.
func (w *walker) walkMerge(v *yaml.Node, t reflect.Type, path string) {
	w.merging++
	defer func() { w.merging-- }()
	target := v
	if target.Kind == yaml.AliasNode && target.Alias != nil {
		target = target.Alias
	}
	if target.Kind == yaml.SequenceNode {
		for _, item := range target.Content {
			w.walk(item, t, path)
		}
		return
	}
	w.walk(v, t, path)
}

// walkLeaf checks a scalar destined for type t, whose pointers dereference
// to base.
func (w *walker) walkLeaf(n *yaml.Node, t, base reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		w.reject(n, t, path, "expected a single value, got %s", describeNode(n))
		return
	}
	if w.expanded[n] == expandedRefs && n.Style&yaml.TaggedStyle == 0 {
		// Type the expanded text by what the key expects: a string stays a
		// string even if it reads "true" or "null", and anything else is
		// resolved like a plain scalar even if it was quoted.
		if base.Kind() == reflect.String {
			n.Tag = "!!str"
		} else {
			n.Tag = ""
			n.Style = 0
		}
	}
	err := n.Decode(reflect.New(t).Interface())
	if err == nil && isInt(base) && n.ShortTag() == "!!float" {
		// yaml.v3 would silently truncate 1.5 to 1.
		err = &yaml.TypeError{}
	}
	if err != nil {
		var te *yaml.TypeError
		msg := err.Error()
		switch {
		case w.expanded[n] == expandedRefs:
			// Do not echo what came from the environment: it may be a
			// secret set for another key.
			msg = fmt.Sprintf("%q does not expand to %s", w.original[n], describeType(base))
		case errors.As(err, &te):
			msg = fmt.Sprintf("cannot use %q as %s", n.Value, describeType(base))
		}
		w.reject(n, t, path, "%s", msg)
	}
}

// reject records a problem with n, at its line, and replaces n with a
// value that decodes to the default, so that the rest of the tree can still
// be decoded and validated.
func (w *walker) reject(n *yaml.Node, t reflect.Type, path, format string, args ...any) {
	w.add(n.Line, path, format, args...)
	if t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		*n = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column}
		return
	}
	*n = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
}

// expand expands the variables in the scalar n, destined for type t, once
// and reports whether walking may go on.
func (w *walker) expand(n *yaml.Node, t reflect.Type, path string) bool {
	switch w.expanded[n] {
	case expandFailed:
		return false
	case expandedPlain, expandedRefs:
		return true
	}
	v, refs, err := envexpand.Expand(n.Value, w.lookup)
	if err != nil {
		w.reject(n, t, path, "%v", err)
		w.expanded[n] = expandFailed
		return false
	}
	w.expanded[n] = expandedPlain
	if refs {
		w.expanded[n] = expandedRefs
		w.original[n] = n.Value
	}
	n.Value = v
	return true
}

// key returns the name of the mapping key k.
func (w *walker) key(k *yaml.Node, path string) (string, bool) {
	if k.Kind != yaml.ScalarNode {
		w.add(k.Line, path, "keys must be plain strings, got %s", describeNode(k))
		return "", false
	}
	return k.Value, true
}

// duplicate reports, and records, whether name was already a key of the
// mapping at path.
func (w *walker) duplicate(seen map[string]int, k *yaml.Node, name, path string) bool {
	if line, ok := seen[name]; ok {
		w.add(k.Line, join(path, name), "duplicate key, first at line %d", line)
		return true
	}
	seen[name] = k.Line
	return false
}

// covers reports whether the problem at key is likely a consequence of a
// problem already reported by the walker: it is at the same key or below.
func (w *walker) covers(key string) bool {
	for _, p := range w.problems {
		if p.Key == "" || key == p.Key || strings.HasPrefix(key, p.Key+".") || strings.HasPrefix(key, p.Key+"[") {
			return true
		}
	}
	return false
}

// yamlFields maps the YAML names of the fields of struct type t to the
// fields.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	fields := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f
	}
	return fields
}

// suggest returns a hint naming the known key closest to name, if any is
// close enough to be a likely typo.
func suggest(name string, fields map[string]reflect.StructField) string {
	best, bestDist := "", 3
	for known := range fields {
		if d := editDistance(strings.ToLower(name), known); d < bestDist || d == bestDist && known < best {
			best, bestDist = known, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %s?", best)
}

// editDistance returns the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// describeNode names the kind of n for error messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if isNull(n) {
			return "an empty value"
		}
		return "a single value"
	default:
		return "a document"
	}
}

// describeType names what a scalar of kind t must look like.
func describeType(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[Duration]():
		return "a duration such as 250ms or 5s"
	case t.Kind() == reflect.Bool:
		return "a boolean (true or false)"
	case isInt(t):
		return "an integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	default:
		return "a " + t.String()
	}
}

func isInt(t reflect.Type) bool {
	return slices.Contains([]reflect.Kind{reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64}, t.Kind())
}
