package consumer

// Backlog is what waits at the broker for a consumer, in two parts: the
// messages of its topic or queue, and those that a delay layer set aside
// (SetAside) in the delay topic or queue, which come back when they are
// due. Both are still to be delivered.
type Backlog struct {
	// Ready counts the messages of the topic or queue itself: the
	// consumer group's lag on the topic (Kafka), the queue's ready
	// messages (RabbitMQ).
	Ready int64
	// SetAside counts the messages waiting in the delay topic or queue:
	// the group's lag on the delay topic (Kafka), the delay queue's
	// messages (RabbitMQ). It is 0 where there is none.
	SetAside int64
}

// Total returns every message of the backlog, ready or set aside.
func (b Backlog) Total() int64 { return b.Ready + b.SetAside }

// BacklogTotal returns the Total of b, or 0 and err when err is not nil:
// a consumer's Backlog from its BacklogParts.
func BacklogTotal(b Backlog, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return b.Total(), nil
}
