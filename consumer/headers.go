package consumer

// Header names of a message set aside (SetAside), the same for every
// backend. The copy carries them beside HeaderAttempts, the slot a delay
// layer booked for it (x-throttle-paid) and the backend's position headers
// (consumer/kafka's HeaderOriginalTopic..., consumer/rabbitmq's
// HeaderOriginalQueue...).
const (
	// HeaderDue is when the message is due again: RFC 3339 with
	// nanoseconds, UTC, by the clock of the replica that set it aside. A
	// copy that comes back before it waits in its handler until then, or
	// is set aside again.
	HeaderDue = "x-throttle-due"
	// HeaderSetAsideReason says why the message was set aside: the
	// handler's error, such as a layer's refusal.
	HeaderSetAsideReason = "x-throttle-set-aside-reason"
)
