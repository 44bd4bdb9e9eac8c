package consumer

import "time"

// MessageObserver receives the events of message processing, for metrics
// and logs (Options.Observer; a limiter.Bucket's events go to a
// limiter.Observer). Every field is optional; a nil *MessageObserver
// observes nothing. The functions may be called from many goroutines at
// once and must be safe for that.
type MessageObserver struct {
	// Received is called once for each message taken from the broker.
	Received func(msg Message)
	// Delivered is called when the handler succeeded.
	Delivered func(msg Message)
	// Failed is called for every failed handler attempt.
	Failed func(msg Message, err error)
	// Retried is called when a failed attempt will be retried after delay.
	Retried func(msg Message, err error, delay time.Duration)
	// DeadLettered is called after a message was handed to the dead-letter
	// destination.
	DeadLettered func(msg Message, err error)
	// Deduplicated is called for a message acked or committed without a
	// handler call because its dedupe key was already marked sent
	// (Options.Dedupe).
	Deduplicated func(msg Message)
	// DedupeSkipped is called for a message handled without dedupe under
	// Options.Dedupe, with the reason: DedupeSkipNoKey or
	// DedupeSkipStoreError.
	DedupeSkipped func(msg Message, reason string)
	// DedupeStoreError is called for every failed call of the dedupe
	// store (Options.Dedupe); Dedupe.OnStoreError says what follows.
	DedupeStoreError func(err error)
	// SetAside is called when a backend set a message aside for d, as
	// its handler asked with SetAside (a RabbitMQ delay queue, a Kafka
	// delay topic).
	SetAside func(msg Message, d time.Duration)
	// Reconnected is called each time a backend re-established its broker
	// connection after losing it; err is why the previous session ended.
	Reconnected func(broker string, err error)
	// ReconnectAttempt is called after every attempt to connect that
	// follows a failure (a lost session, or a failed attempt, at start
	// too), with the attempt's error, nil when it succeeded. A healthy
	// start calls it never; a broker that refuses a replica for a minute
	// calls it once per attempt. A successful one is followed by
	// Reconnected when a session had been lost before.
	ReconnectAttempt func(broker string, err error)
	// Disconnected is called when a live broker session ends, other than
	// by Run returning; err says why.
	Disconnected func(broker string, err error)
}
