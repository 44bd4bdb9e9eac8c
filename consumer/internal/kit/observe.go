package kit

import (
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// The Observe functions report one event to o, which may be nil, as may
// each of its fields.

// ObserveReceived reports a message taken from the broker.
func ObserveReceived(o *consumer.MessageObserver, m consumer.Message) {
	if o != nil && o.Received != nil {
		o.Received(m)
	}
}

// ObserveDeadLettered reports a dead-lettered message.
func ObserveDeadLettered(o *consumer.MessageObserver, m consumer.Message, err error) {
	if o != nil && o.DeadLettered != nil {
		o.DeadLettered(m, err)
	}
}

// ObserveSetAside reports a message set aside for d.
func ObserveSetAside(o *consumer.MessageObserver, m consumer.Message, d time.Duration) {
	if o != nil && o.SetAside != nil {
		o.SetAside(m, d)
	}
}

// ObserveReconnected reports a reconnect.
func ObserveReconnected(o *consumer.MessageObserver, broker string, err error) {
	if o != nil && o.Reconnected != nil {
		o.Reconnected(broker, err)
	}
}

// ObserveReconnectAttempt reports a reconnect attempt.
func ObserveReconnectAttempt(o *consumer.MessageObserver, broker string, err error) {
	if o != nil && o.ReconnectAttempt != nil {
		o.ReconnectAttempt(broker, err)
	}
}

// ObserveDisconnected reports a lost session.
func ObserveDisconnected(o *consumer.MessageObserver, broker string, err error) {
	if o != nil && o.Disconnected != nil {
		o.Disconnected(broker, err)
	}
}

func observeDelivered(o *consumer.MessageObserver, m consumer.Message) {
	if o != nil && o.Delivered != nil {
		o.Delivered(m)
	}
}

func observeFailed(o *consumer.MessageObserver, m consumer.Message, err error) {
	if o != nil && o.Failed != nil {
		o.Failed(m, err)
	}
}

func observeRetried(o *consumer.MessageObserver, m consumer.Message, err error, d time.Duration) {
	if o != nil && o.Retried != nil {
		o.Retried(m, err, d)
	}
}
