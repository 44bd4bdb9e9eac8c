// Package msgjson holds the JSON shapes that several sinks share, so that a
// message looks the same on stdout and in a database row.
package msgjson

import (
	"encoding/json"

	"github.com/throttlehq/throttle/consumer"
)

// Source is the JSON form of a consumer.Source. Only the fields of the
// message's broker are set, so a Kafka partition 0 is kept while the AMQP
// fields are left out.
type Source struct {
	Broker string `json:"broker,omitempty"`

	Topic     string `json:"topic,omitempty"`
	Partition *int   `json:"partition,omitempty"`
	Offset    *int64 `json:"offset,omitempty"`

	Queue       string  `json:"queue,omitempty"`
	Exchange    string  `json:"exchange,omitempty"`
	DeliveryTag *uint64 `json:"delivery_tag,omitempty"`
	MessageID   string  `json:"message_id,omitempty"`
	Redelivered bool    `json:"redelivered,omitempty"`
}

// FromSource converts s.
func FromSource(s consumer.Source) Source {
	out := Source{Broker: s.Broker}
	switch s.Broker {
	case "kafka":
		out.Topic = s.Topic
		out.Partition = &s.Partition
		out.Offset = &s.Offset
	case "rabbitmq":
		out.Queue = s.Queue
		out.Exchange = s.Exchange
		out.DeliveryTag = &s.DeliveryTag
		out.MessageID = s.MessageID
		out.Redelivered = s.Redelivered
	default:
		out.Topic = s.Topic
		out.Queue = s.Queue
		out.MessageID = s.MessageID
	}
	return out
}

// IsJSON reports whether body is one valid JSON value. Surrounding white
// space is allowed; an empty body is not JSON.
func IsJSON(body []byte) bool {
	return json.Valid(body)
}
