package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/limiter"
)

// paidHeaders returns the headers of msg set aside after le:
// setaside.HeaderPaid with msg's slots of other layers than le's, which
// this refusal did not use, and le's own slot when it booked one; an empty
// value when none is left.
func paidHeaders(msg Message, le *limiter.LimitError) map[string]string {
	var slots []limiter.PaidSlot
	for _, s := range setaside.PaidSlots(msg.Headers) {
		if s.Layer != le.Layer {
			slots = append(slots, s)
		}
	}
	if le.Reserved {
		slots = append(slots, le.Slot())
	}
	v := ""
	if len(slots) > 0 {
		if b, err := json.Marshal(slots); err == nil {
			v = string(b)
		}
	}
	return map[string]string{setaside.HeaderPaid: v}
}

// paidEarly is how long before its latest slot a returned message waits
// in its handler rather than being set aside again: a set-aside is capped
// (Options.MaxSetAside) and the slot's time is on the store's clock.
const paidEarly = 100 * time.Millisecond

// awaitPaidSlots returns nil once msg's paid slots (setaside.HeaderPaid)
// are all due at now(), which it reads only when msg has one. A message more than paidEarly early is set aside
// again until its latest slot, its headers unchanged; one less early waits
// for it, until ctx ends.
func awaitPaidSlots(ctx context.Context, msg Message, now func() time.Time) error {
	var due time.Time
	for _, s := range setaside.PaidSlots(msg.Headers) {
		if s.Due.After(due) {
			due = s.Due
		}
	}
	if due.IsZero() {
		return nil // no paid slot: the clock is not read
	}
	early := due.Sub(now())
	switch {
	case early <= 0:
		return nil
	case early <= paidEarly:
		t := time.NewTimer(early)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	return SetAside(fmt.Errorf("paid slot due in %v", early.Round(time.Millisecond)), early)
}
