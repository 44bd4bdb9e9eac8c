package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
)

// suiteRabbitMQ is the suite's RabbitMQ broker.
type suiteRabbitMQ struct {
	url string
}

func suiteOpenRabbitMQ(t *testing.T, env suiteEnv) suiteBroker {
	return &suiteRabbitMQ{url: env.amqpURL(t)}
}

// newQueue names a queue; the replicas declare it, with its dead-letter
// exchange and queue (Config.Declare), when they connect.
func (r *suiteRabbitMQ) newQueue(t *testing.T) suiteQueue {
	t.Helper()
	q := &suiteAMQPQueue{url: r.url, name: suiteName(t, "queue")}
	t.Cleanup(func() {
		_ = q.withChannel(func(ch *amqp.Channel) error {
			_, _ = ch.QueueDelete(q.name, false, false, false)
			_, _ = ch.QueueDelete(q.name+".dlq", false, false, false)
			return ch.ExchangeDelete(q.name+".dlx", false, false)
		})
	})
	return q
}

// suiteAMQPQueue is one queue with its dead-letter exchange and queue.
type suiteAMQPQueue struct {
	url  string
	name string
}

// withChannel runs f on a new connection and channel, closed afterwards.
// A failed operation closes an AMQP channel, hence one per call.
func (q *suiteAMQPQueue) withChannel(f func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(q.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return f(ch)
}

func (q *suiteAMQPQueue) replica(t *testing.T, spec suiteReplicaSpec) suiteRunner {
	t.Helper()
	c, err := rabbitmq.New(rabbitmq.Config{
		URL:      q.url,
		Queue:    q.name,
		Declare:  true,
		Prefetch: 10,
		Options:  spec.options(t),
	}, spec.handler)
	if err != nil {
		t.Fatalf("rabbitmq.New: %v", err)
	}
	return c
}

// waitConsumers waits until the queue exists with n consumers.
func (q *suiteAMQPQueue) waitConsumers(t *testing.T, n int) {
	t.Helper()
	var consumers int
	var err error
	if !testenv.Within(30*time.Second, func() bool {
		err = q.withChannel(func(ch *amqp.Channel) error {
			st, err := ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
			consumers = st.Consumers
			return err
		})
		return err == nil && consumers == n
	}) {
		t.Fatalf("queue %s has %d consumers, want %d (last error: %v)", q.name, consumers, n, err)
	}
}

// publish publishes the bodies, persistent, with the body as message id,
// and waits for the broker's confirms.
func (q *suiteAMQPQueue) publish(t *testing.T, bodies []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := q.withChannel(func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		confirms := make([]*amqp.DeferredConfirmation, len(bodies))
		for i, b := range bodies {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.name, false, false, amqp.Publishing{
				MessageId:    b,
				DeliveryMode: amqp.Persistent,
				Body:         []byte(b),
			})
			if err != nil {
				return err
			}
			confirms[i] = dc
		}
		for i, dc := range confirms {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				t.Errorf("publishing %s: confirmed %v, %v", bodies[i], ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("publishing to %s: %v", q.name, err)
	}
}

func (q *suiteAMQPQueue) deadLettered(t *testing.T, n int) []suiteDLMessage {
	t.Helper()
	var out []suiteDLMessage
	err := q.withChannel(func(ch *amqp.Channel) error {
		var err error
		// Get does not block; the test polls.
		testenv.Within(10*time.Second, func() bool {
			for len(out) < n {
				var d amqp.Delivery
				var ok bool
				if d, ok, err = ch.Get(q.name+".dlq", true); err != nil {
					return true
				}
				if !ok {
					return false
				}
				h := map[string]string{}
				for k, v := range d.Headers {
					h[k] = fmt.Sprint(v)
				}
				out = append(out, suiteDLMessage{body: string(d.Body), headers: h})
			}
			return true
		})
		return err
	})
	if err != nil {
		t.Fatalf("reading %s.dlq: %v", q.name, err)
	}
	if len(out) < n {
		t.Fatalf("read %d of %d messages of %s.dlq", len(out), n, q.name)
	}
	return out
}

// origin names the dead-letter header that gives the queue.
func (q *suiteAMQPQueue) origin() (header, value string) { return rabbitmq.HeaderOriginalQueue, q.name }

// pending returns the messages still in the queue. The replicas stopped,
// so deliveries they did not ack are back in it.
func (q *suiteAMQPQueue) pending(t *testing.T) int {
	t.Helper()
	var n int
	err := q.withChannel(func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
		n = st.Messages
		return err
	})
	if err != nil {
		t.Fatalf("inspecting queue %s: %v", q.name, err)
	}
	return n
}
