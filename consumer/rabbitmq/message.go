package rabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
)

// Broker is the value of consumer.Source.Broker for RabbitMQ deliveries.
const Broker = "rabbitmq"

// ToMessage converts a delivery from queue into a consumer.Message with
// Attempt 1. The routing key becomes the Key (nil when empty); header
// values that are not strings or byte slices are formatted with fmt.Sprint.
// Time is the AMQP timestamp, or now when the publisher set none. The Body
// is shared with d, not copied.
func ToMessage(d amqp.Delivery, queue string) consumer.Message {
	var headers map[string]string
	if len(d.Headers) > 0 {
		headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			switch v := v.(type) {
			case string:
				headers[k] = v
			case []byte:
				headers[k] = string(v)
			default:
				headers[k] = fmt.Sprint(v)
			}
		}
	}
	ts := d.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	var key []byte
	if d.RoutingKey != "" {
		key = []byte(d.RoutingKey)
	}
	return consumer.Message{
		Key:     key,
		Body:    d.Body,
		Headers: headers,
		Attempt: 1,
		Time:    ts,
		Source: consumer.Source{
			Broker:      Broker,
			Queue:       queue,
			Exchange:    d.Exchange,
			DeliveryTag: d.DeliveryTag,
			MessageID:   d.MessageId,
			Redelivered: d.Redelivered,
		},
	}
}

// Wait is the one call that throttles an existing delivery loop: it blocks
// until l grants the delivery's cost (one token when cost is nil), or
// ctx ends.
//
// On nil, handle the delivery and ack it. When the error is permanent
// (consumer.IsPermanent: the cost header is malformed or the cost exceeds
// the bucket's burst), the delivery can never be granted: Nack it without
// requeue so that the queue's dead-letter exchange takes it. On any other
// error, such as ctx ending, leave the delivery unacknowledged; the broker
// redelivers it when the channel closes.
//
// Wait is safe for concurrent use if l is.
func Wait(ctx context.Context, l consumer.Limiter, d amqp.Delivery, cost consumer.CostFunc) error {
	granted := consumer.Throttle(l, cost)(func(context.Context, consumer.Message) error { return nil })
	return granted(ctx, ToMessage(d, ""))
}
