package kafka

import (
	"context"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
)

// Broker is the value of consumer.Source.Broker for Kafka messages, and
// the name of Kafka in the consumer.MessageObserver's connection events
// and in the logs (key "broker").
const Broker = "kafka"

// ToMessage converts a kafka-go message to the consumer.Message a Handler
// sees: key, body (the value), headers, time and position. Of several
// headers with the same name the last one wins. A message without a
// timestamp gets the current time. Attempt is 1, as for the first
// attempt; the retry policy numbers the later ones.
func ToMessage(m kafkago.Message) consumer.Message {
	var headers map[string]string
	if len(m.Headers) > 0 {
		headers = make(map[string]string, len(m.Headers))
		for _, h := range m.Headers {
			headers[h.Key] = string(h.Value)
		}
	}
	t := m.Time
	if t.IsZero() {
		t = time.Now()
	}
	return consumer.Message{
		Key:     m.Key,
		Body:    m.Value,
		Headers: headers,
		Time:    t,
		Attempt: 1,
		Source: consumer.Source{
			Broker:    Broker,
			Topic:     m.Topic,
			Partition: m.Partition,
			Offset:    m.Offset,
		},
	}
}

// Wait blocks until l grants the tokens that m costs, for users who keep
// their own kafka-go Reader loop: call it between FetchMessage and the
// handler. A nil cost means every message costs one token.
//
// It returns ctx's error when ctx ends first, and a consumer.Permanent error
// when the cost cannot be known or can never be granted (above the
// limiter's burst); such a message should be dead-lettered, not retried.
// Wait is safe for concurrent use when l and cost are.
func Wait(ctx context.Context, l consumer.Limiter, m kafkago.Message, cost consumer.CostFunc) error {
	pass := func(context.Context, consumer.Message) error { return nil }
	return consumer.Throttle(l, cost)(pass)(ctx, ToMessage(m))
}
