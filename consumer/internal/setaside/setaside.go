// Package setaside holds what package consumer and its backends share about
// a message set aside (consumer.SetAside): the error that asks for it, with
// the headers the message must come back with, and the paid-slot header
// (HeaderPaid) that a delay layer's booked slot travels in. It sits below
// package consumer, which imports it, so that the backends' kit and the
// public middleware read the same error and header.
package setaside

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// HeaderPaid names the header of a message set aside by a layer of
// limit.extra with on_exceed delay that booked the message's slot
// (limiter.LimitError.Reserved). Its value is a JSON array of
// limiter.PaidSlot objects, such as
//
//	[{"layer":"per-recipient","key":"+15550100","due":"2026-12-01T10:00:02.05Z","sig":"..."}]
//
// When the message comes back, its first limiter wait passes those layers
// without taking from them again (limiter.Request.Paid; a slot back more
// than a little late is forfeit, see limiter.PaidSlot); a later attempt,
// after a failure, pays again. consumer.Throttle writes it, every backend
// carries it with the message it sets aside, and an empty value names no
// slot. A slot passes only with the signature (sig) that the limiter gave
// it with the bucket's secret (see limiter.PaidSlot): a producer cannot
// make one. The backends also drop the header from a message that they did
// not read back from their delay topic or queue.
const HeaderPaid = "x-throttle-paid"

// PaidSlots returns the slots that headers' HeaderPaid names. A missing,
// empty or malformed header names none.
func PaidSlots(headers map[string]string) []limiter.PaidSlot {
	v := headers[HeaderPaid]
	if v == "" {
		return nil
	}
	var all []limiter.PaidSlot
	if json.Unmarshal([]byte(v), &all) != nil {
		return nil
	}
	out := all[:0]
	for _, s := range all {
		if s.Layer != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Error is a handler error that asks for its message to be set aside for
// After, and to come back with Headers set (an empty value: removed).
type Error struct {
	Err     error
	After   time.Duration
	Headers map[string]string
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// With marks err as set aside for d (at least a millisecond), the message
// to come back with the headers h. With(nil, ...) returns nil.
func With(err error, d time.Duration, h map[string]string) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, After: max(d, time.Millisecond), Headers: h}
}

// Of returns the set-aside error in err's tree, or nil. It does not check
// whether err is also permanent (see kit.SetAsideOf).
func Of(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// PaidLead is how long before its due time (consumer.HeaderDue) a backend
// hands on a message that comes back with a paid slot (HeaderPaid): the
// limiter waits out the rest itself, asks the store one round trip before
// the slot and lets the message go at the slot, not before
// (limiter.Bucket.WaitN). Handed on at its due time, its store call was
// answered past the slot by the call's own round trip, which under load
// was more than the slot's lateness (25 ms for a 5/s layer): the slot was
// lost and the message set aside again.
const PaidLead = 100 * time.Millisecond

// HandOnAt returns when a backend hands on a message due at due (its
// consumer.HeaderDue) whose HeaderPaid value is paid: PaidLead before due
// with a paid slot, else due.
func HandOnAt(due time.Time, paid string) time.Time {
	if paid != "" {
		return due.Add(-PaidLead)
	}
	return due
}
