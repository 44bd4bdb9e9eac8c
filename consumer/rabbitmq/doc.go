// Package rabbitmq consumes a RabbitMQ queue with throttled, at-least-once
// handling, on top of github.com/rabbitmq/amqp091-go.
//
// The guide in the repository (docs/library.md, RabbitMQ) shows it in use.
//
// # Acknowledgements
//
// A Consumer sets the channel's QoS prefetch, consumes with manual
// acknowledgement, and for each delivery waits on the limiter for the
// message's cost, calls the handler under the retry policy, and only then
// acks. Every delivery it takes gets exactly one Ack or Nack:
//
//   - delivered: Ack;
//   - failed for good (a permanent error, or out of attempts): published to
//     Config.DeadLetterExchange with the reason headers
//     (consumer.HeaderError, consumer.HeaderAttempts) and its original
//     queue, exchange and routing key, under a publisher confirm, then
//     Ack. When no dead-letter exchange is known (no Declare and no
//     DeadLetterExchange), Nack without requeue instead, so that the
//     queue's own dead-letter exchange takes it with RabbitMQ's x-death
//     header only;
//   - set aside, with Options.SetAside (the handler returned a
//     consumer.SetAside error, as a layered limit with on_exceed delay
//     does): published, under a publisher confirm, to the delay queues
//     "<Queue>.delay.NN" (see DelayQueues), levels of fixed TTLs that
//     RabbitMQ dead-letters from one to the next and back to the queue
//     when it is due (consumer.HeaderDue), then Ack. The handler is free
//     meanwhile. Each level's TTL is the same for all its messages, so
//     none waits behind a longer delay; the message comes back a little
//     early and its handler waits the rest. Without Options.SetAside the
//     handler waits out the delay itself and is called again;
//   - not finished (shutdown past the drain deadline, or the limiter
//     closed): Nack with requeue, so that the broker delivers it again.
//
// Acks go to the channel the delivery came from. When that channel has
// closed they fail, and the broker redelivers the message anyway. They go
// out in batches (Config.AckDelay, default 1ms): the acks of deliveries
// settled within about a millisecond of one another are one Ack with
// multiple set, up to the highest delivery tag below which every delivery
// is settled; nothing is acked before it is settled. An ack waits only
// while it holds back no delivery a handler could take: when the prefetch
// is all in the consumer and no delivery waits for a handler (a slow
// sink), each ack goes out as its delivery settles.
//
// # Connection
//
// amqp091 does not reconnect by itself; the Consumer does, and it reports
// whether it is connected (Connected) and every reconnect attempt
// (consumer.MessageObserver). Deliveries not acked when a connection broke are
// redelivered by the broker, to this or another replica, so no message is
// lost, but one may be handled twice: handlers must be idempotent, as
// always with at-least-once delivery.
//
// # Your own delivery loop
//
// Users with their own delivery loop throttle it with one call per delivery,
// Wait, or with the middleware form, consumer.Throttle, over ToMessage.
package rabbitmq
