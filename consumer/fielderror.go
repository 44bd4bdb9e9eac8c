package consumer

import "strconv"

// FieldError is one bad field of a library's Config, as the Validate
// methods of the consumers (and, through an alias, the sinks) return it.
// Field is the Go field name, such as "Prefetch" or "Retry.MaxAttempts";
// for an entry of a map field, Key names the entry. Callers that read the
// configuration from a file (the config package) translate Field into
// their own key names. A FieldError is a plain value and safe for
// concurrent use.
type FieldError struct {
	// Field is the Go name of the Config field at fault.
	Field string
	// Key names the map entry at fault, or is empty.
	Key string
	// Err says what is wrong. It never quotes a secret.
	Err error
}

func (e *FieldError) Error() string {
	if e.Key != "" {
		return e.Field + "[" + strconv.Quote(e.Key) + "]: " + e.Err.Error()
	}
	return e.Field + ": " + e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// FieldErrors returns every *FieldError in err's tree (errors joined with
// errors.Join or wrapped with %w), in order.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}
