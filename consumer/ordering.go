package consumer

import "fmt"

// Ordering says which messages a consumer handles in order. It is a plain
// string, safe for concurrent use.
//
// With classes (Options.Priority), a message of a higher class goes ahead
// of lower-class messages only where the ordering lets it start first:
//
//   - OrderPartition on Kafka: never within its partition, whose
//     messages start one at a time in order; among partitions, the one
//     whose next message has the highest class starts first.
//     OrderPartition on RabbitMQ starts deliveries in the broker's order
//     and ignores classes.
//   - OrderKey: ahead of every message of other keys that waits for a
//     handler, never ahead of an earlier message of its own key.
//   - OrderNone: ahead of every message that waits for a handler.
//
// Each class also leaves a reserve of the handler slots
// (Options.Concurrency) free per class above it, about a twentieth of them, so
// that a higher-class message finds one at once while lower-class
// messages wait for tokens in the others; and a class with messages
// waiting and no slot gets the next free one (higher classes first among
// those), so that with at least as many slots as classes waiting none is
// shut out (its share of the tokens is then the limiter's MinShare); with
// a single slot, a lower class waits while a higher one has messages
// ready. Only
// messages the consumer holds are reordered: on Kafka those fetched, at
// most the handler slots plus QueueSize (the lower classes leave the
// same reserve of that window); on RabbitMQ those within Prefetch.
type Ordering string

// The orderings.
const (
	// OrderPartition, the default, keeps the broker's order as far as the
	// broker has one. Kafka handles each partition in order, one message
	// at a time. A RabbitMQ queue has no partitions: its deliveries are
	// started in the order the broker sends them, up to Concurrency at
	// once, so with Concurrency 1 the queue is handled strictly in order.
	OrderPartition Ordering = "partition"
	// OrderKey handles the messages of one key (Options.OrderingKey)
	// strictly in order, one at a time, while messages of other keys
	// proceed: a key that waits, on its own limit or a slow sink, holds
	// only its own messages.
	OrderKey Ordering = "key"
	// OrderNone promises no order: any message may be handled beside any
	// other, up to the backend's concurrency.
	OrderNone Ordering = "none"
)

// validate returns an error unless o is one of the orderings or empty (the
// default).
func (o Ordering) validate() error {
	switch o {
	case "", OrderPartition, OrderKey, OrderNone:
		return nil
	}
	return fmt.Errorf("%q is not %q, %q or %q", string(o), OrderPartition, OrderKey, OrderNone)
}

// KeyFunc returns the ordering key of a message (Options.OrderingKey). An
// error is permanent for the message: it is dead-lettered with that error.
// The empty string is a key like any other.
type KeyFunc func(Message) (string, error)
