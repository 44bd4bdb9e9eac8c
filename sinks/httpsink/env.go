package httpsink

import (
	"errors"
	"fmt"
	"strings"
)

// expandEnv replaces ${NAME} and ${NAME:-default} in s with values from
// lookup, and $$ with $. Any other $ is kept. The syntax is the config
// package's, so a value reads the same in a config file and in code. The
// error names the variables but never a value.
func expandEnv(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var (
		b       strings.Builder
		missing []string
	)
	for i := 0; i < len(s); {
		switch {
		case s[i] != '$':
			b.WriteByte(s[i])
			i++
			continue
		case strings.HasPrefix(s[i:], "$$"):
			b.WriteByte('$')
			i += 2
			continue
		case !strings.HasPrefix(s[i:], "${"):
			b.WriteByte('$')
			i++
			continue
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return "", errors.New(`unterminated "${" (missing "}")`)
		}
		expr := s[i+2 : i+2+end]
		i += 2 + end + 1
		name, def, hasDef := strings.Cut(expr, ":-")
		if !validVarName(name) {
			// The reference is not quoted: it may be part of a secret.
			return "", errors.New("invalid variable reference: use ${NAME} or ${NAME:-default}, and $$ for a literal $")
		}
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
		return b.String(), nil
	case 1:
		return "", fmt.Errorf("environment variable %s is not set", missing[0])
	default:
		return "", fmt.Errorf("environment variables %s are not set", strings.Join(missing, ", "))
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
