package campaign

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// QueueState returns a queue's ready messages and consumers, zeros when
// the queue does not exist.
func QueueState(conn *amqp.Connection, name string) amqp.Queue {
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Queue{}
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return amqp.Queue{}
	}
	return q
}

// queueExists reports whether a queue is declared (a passive declare
// closes the channel it fails on, so each probe has its own).
func queueExists(conn *amqp.Connection, name string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return err == nil
}

// DelayQueues returns the queues where the RabbitMQ consumer sets aside
// the messages of queue that exist: "<queue>.delay", one queue with a TTL
// per message, and "<queue>.delay.NN", the levels of a cascade of queues
// with fixed TTLs, numbered from 00 up without holes. Both shapes are
// probed so that a campaign outlives a change between them.
func DelayQueues(conn *amqp.Connection, queue string) []string {
	var out []string
	if queueExists(conn, queue+".delay") {
		out = append(out, queue+".delay")
	}
	for n := 0; n < 100; n++ {
		name := fmt.Sprintf("%s.delay.%02d", queue, n)
		if !queueExists(conn, name) {
			break
		}
		out = append(out, name)
	}
	return out
}

// SetAside returns the messages waiting in queue's delay queues.
func SetAside(conn *amqp.Connection, queue string) int {
	n := 0
	for _, q := range DelayQueues(conn, queue) {
		n += QueueState(conn, q).Messages
	}
	return n
}

// DeleteQueues deletes queue, its dead-letter queue and exchange, and
// its delay queues with their exchanges (a cascade's levels each have an
// exchange of the queue's name), ignoring what does not exist.
func DeleteQueues(conn *amqp.Connection, queue string) {
	delay := DelayQueues(conn, queue)
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for _, q := range append([]string{queue, queue + ".dlq"}, delay...) {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range append([]string{queue + ".dlx"}, delay...) {
		_ = ch.ExchangeDelete(x, false, false)
	}
}

// ReadQueued empties the delay queues of queue and queue itself, in turns
// until all are empty (reading a delay queue dead-letters its expired
// messages back to the queue), and counts their messages by id; left
// describes each, for logs.
func ReadQueued(conn *amqp.Connection, queue string) (ids map[int]int, left []string, err error) {
	ids = map[int]int{}
	for {
		n := 0
		for _, q := range append(DelayQueues(conn, queue), queue) {
			got, msgs, err := Read(conn, q)
			if err != nil {
				return nil, nil, err
			}
			for id, k := range got {
				ids[id] += k
				n += k
			}
			for _, d := range msgs {
				left = append(left, fmt.Sprintf("left in %s: %s, expiration %q, headers %v", q, d.Body, d.Expiration, d.Headers))
			}
		}
		if n == 0 {
			return ids, left, nil
		}
		time.Sleep(100 * time.Millisecond) // let the broker move what expired
	}
}

// Read empties a queue, counting its messages by id; a queue that does
// not exist is empty. It returns the deliveries too.
func Read(conn *amqp.Connection, queue string) (map[int]int, []amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("campaign: reading %s: %w", queue, err)
	}
	defer ch.Close()
	ids := map[int]int{}
	var msgs []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return ids, msgs, nil
			}
			return nil, nil, fmt.Errorf("campaign: reading %s: %w", queue, err)
		}
		if !ok {
			return ids, msgs, nil
		}
		var m Message
		if err := json.Unmarshal(d.Body, &m); err != nil {
			return nil, nil, fmt.Errorf("campaign: %s holds a message that is not the campaign's: %q", queue, d.Body)
		}
		ids[m.ID]++
		msgs = append(msgs, d)
	}
}
