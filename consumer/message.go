package consumer

import (
	"context"
	"time"
)

// Message is one message from a broker, as seen by a Handler.
//
// A Message is a plain value. Handlers may read it from several goroutines
// but must not modify the Headers map they receive.
type Message struct {
	// Key is the Kafka message key or, for RabbitMQ, the routing key.
	Key []byte
	// Body is the payload, unchanged.
	Body []byte
	// Headers holds the message headers as strings. Kafka headers with the
	// same name keep the last value. AMQP header values that are not strings
	// are formatted with fmt.Sprint.
	Headers map[string]string
	// Attempt is 1 for the first delivery attempt and grows with each retry
	// inside this process. For a RabbitMQ redelivery it restarts at 1.
	Attempt int
	// Time is when the broker stamped the message (Kafka) or the AMQP
	// timestamp, or the time it was received when the broker gave none.
	Time time.Time
	// Source says where the message came from.
	Source Source
}

// Source is the position of a message in its broker.
//
// The Kafka fields are set for Kafka messages and the AMQP fields for
// RabbitMQ deliveries; the others are zero.
type Source struct {
	// Broker is "kafka" or "rabbitmq".
	Broker string

	Topic     string
	Partition int
	Offset    int64

	Queue       string
	Exchange    string
	DeliveryTag uint64
	// MessageID is the AMQP message-id property, when the publisher set one.
	MessageID string
	// Redelivered is the AMQP redelivered flag.
	Redelivered bool
}

// Handler handles one message. Returning nil means the message was delivered
// and may be committed or acked. A non-nil error is classified with
// IsPermanent: permanent errors dead-letter the message at once, other errors
// are retried under the RetryPolicy.
type Handler func(ctx context.Context, msg Message) error

// Middleware wraps a Handler with extra behaviour, such as throttling.
type Middleware func(Handler) Handler

// Chain wraps h with the middleware in order, so that mw[0] runs first.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}
