package sinks

import "github.com/throttlehq/throttle/consumer"

// FieldError is one bad field of a sink's Config, as the sinks' Validate
// methods and constructors return it: Field is the Go field name, such as
// "BodyTemplate", and for an entry of a map field Key names the entry, such
// as the header name of "Headers". It is consumer.FieldError, the one type
// every library of this module uses for this, so that the config package
// translates all of them the same way.
type FieldError = consumer.FieldError

// FieldErrors returns every *FieldError in err's tree (errors joined with
// errors.Join or wrapped with %w), in order.
func FieldErrors(err error) []*FieldError {
	return consumer.FieldErrors(err)
}
