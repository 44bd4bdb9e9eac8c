package consumer

// Backlog is what waits at the broker for a consumer, in two parts: the
// messages of its topic or queue, and those that a delay layer set aside
// (SetAside) in the delay topic or queue, which come back when they are
// due. Both are still to be delivered; a backend's Backlog method returns
// their sum.
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
