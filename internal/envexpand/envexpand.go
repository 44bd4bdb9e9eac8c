// Package envexpand expands ${NAME} and ${NAME:-default} references in the
// values of the config file. The config package is its one caller: values
// are expanded there, once, and every library takes them as given, so a
// value holding "$" is never expanded twice.
package envexpand

import (
	"errors"
	"fmt"
	"strings"
)

// Expand replaces ${NAME} and ${NAME:-default} references in s with values
// from lookup, and $$ with $; any other $ is kept. A default applies when the
// variable is unset or empty. Expand reports whether s held any reference.
// The error names unset variables but never quotes s or a value, since
// either may hold a secret.
func Expand(s string, lookup func(string) (string, bool)) (string, bool, error) {
	if !strings.Contains(s, "$") {
		return s, false, nil
	}
	var (
		b       strings.Builder
		refs    bool
		missing []string
	)
	for i := 0; i < len(s); {
		if s[i] != '$' {
			b.WriteByte(s[i])
			i++
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i += 2
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			b.WriteByte('$')
			i++
			continue
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return "", false, errors.New(`unterminated "${" (missing "}")`)
		}
		expr := s[i+2 : i+2+end]
		i += 2 + end + 1
		name, def, hasDef := strings.Cut(expr, ":-")
		if !validVarName(name) {
			return "", false, errors.New("invalid variable reference: use ${NAME} or ${NAME:-default}, and $$ for a literal $")
		}
		refs = true
		v, ok := lookup(name)
		switch {
		case hasDef && (!ok || v == ""):
			v = def
		case !ok:
			missing = append(missing, name)
			continue
		}
		b.WriteString(v)
	}
	switch len(missing) {
	case 0:
		return b.String(), refs, nil
	case 1:
		return "", false, fmt.Errorf("environment variable %s is not set", missing[0])
	default:
		return "", false, fmt.Errorf("environment variables %s are not set", strings.Join(missing, ", "))
	}
}

// validVarName reports whether name matches [A-Za-z_][A-Za-z0-9_]*.
func validVarName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range name {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
