package rabbitmq_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/consumertest"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestConformance runs the consumer backends' conformance suite against
// the RabbitMQ consumer, on the broker of AMQP_URL: one queue with its
// dead-letter exchange and queue per behaviour.
func TestConformance(t *testing.T) {
	consumertest.Run(t, consumertest.Backend{Name: "rabbitmq", NewSource: newConformanceSource})
}

// conformanceSource is a queue of its own. The consumers connect through
// a proxy that Cut resets and makes refuse new connections.
type conformanceSource struct {
	b       *broker
	q       string
	proxy   *proxy
	proxied string

	mu   sync.Mutex
	dead []consumer.Message // read from the dead-letter queue so far
}

func newConformanceSource(t *testing.T) consumertest.Source {
	b := newBroker(t)
	q := b.declareQueue(t)
	p, proxied := newProxy(t, b.url)
	return &conformanceSource{b: b, q: q, proxy: p, proxied: proxied}
}

func (s *conformanceSource) Publish(t testing.TB, msgs ...consumer.Message) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		h := amqp.Table{}
		for k, v := range m.Headers {
			h[k] = v
		}
		dc, err := s.b.ch.PublishWithDeferredConfirmWithContext(ctx, "", s.q, false, false, amqp.Publishing{
			Headers: h, DeliveryMode: amqp.Persistent, Body: m.Body,
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
		confirms[i] = dc
	}
	for i, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publishing message %d: confirmed %v, %v", i, ok, err)
		}
	}
}

func (s *conformanceSource) NewConsumer(t testing.TB, opts consumer.Options, h consumer.Handler) consumer.Consumer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	c, err := rabbitmq.New(rabbitmq.Config{
		URL: s.proxied, Queue: s.q, DeadLetterExchange: s.q + ".dlx",
		Prefetch:         opts.Concurrency, // the suite's bound on what a consumer holds
		ReconnectBackoff: 20 * time.Millisecond, MaxReconnectBackoff: 200 * time.Millisecond,
		Options: opts,
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *conformanceSource) DeadLetters(t testing.TB, n int) []consumer.Message {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d dead letters", n), func() bool {
		for {
			d, ok, err := s.b.ch.Get(s.q+".dlq", true)
			if err != nil {
				t.Fatalf("reading the dead-letter queue: %v", err)
			}
			if !ok {
				return len(s.dead) >= n
			}
			m := consumer.Message{Key: []byte(d.RoutingKey), Body: d.Body, Headers: map[string]string{}}
			for k, v := range d.Headers {
				m.Headers[k] = fmt.Sprint(v)
			}
			s.dead = append(s.dead, m)
		}
	})
	return append([]consumer.Message(nil), s.dead...)
}

func (s *conformanceSource) Cut(testing.TB) {
	s.proxy.refuseNew(true)
	s.proxy.cut()
}

func (s *conformanceSource) Restore(testing.TB) { s.proxy.refuseNew(false) }
