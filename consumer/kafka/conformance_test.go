package kafka

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/consumertest"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestConformance runs the consumer backends' conformance suite against
// the Kafka consumer, on kfake (or KAFKA_BROKERS): one topic of three
// partitions and one group per behaviour.
func TestConformance(t *testing.T) {
	consumertest.Run(t, consumertest.Backend{Name: "kafka", NewSource: newConformanceSource})
}

// conformanceSource is a topic of its own, with its consumer group. The
// consumers dial through net, which Cut closes and refuses.
type conformanceSource struct {
	brokers []string
	topic   string
	group   string
	net     *cuttableNet
}

func newConformanceSource(t *testing.T) consumertest.Source {
	topic := testenv.Name(t, "conformance")
	return &conformanceSource{
		brokers: newTopics(t, 3, topic),
		topic:   topic,
		group:   topic + "-group",
		net:     &cuttableNet{},
	}
}

func (s *conformanceSource) Publish(t testing.TB, msgs ...consumer.Message) {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: s.topic, Key: m.Key, Value: m.Body}
		for k, v := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		recs[i] = r
	}
	cl := newClient(t, s.brokers)
	ctx := testenv.Context(t, 30*time.Second)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

func (s *conformanceSource) NewConsumer(t testing.TB, opts consumer.Options, h consumer.Handler) consumer.Consumer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	c, err := New(Config{
		Options: opts,
		Brokers: s.brokers, Topic: s.topic, Group: s.group,
		CommitTimeout:   2 * time.Second,
		ConfigureReader: fastGroup,
		Dialer:          &kafkago.Dialer{DialFunc: s.net.dial, Timeout: time.Second},
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *conformanceSource) DeadLetters(t testing.TB, n int) []consumer.Message {
	t.Helper()
	var out []consumer.Message
	for _, r := range consumeAll(t, s.brokers, s.topic+".dlq", n) {
		m := consumer.Message{Key: r.Key, Body: r.Value, Headers: map[string]string{}}
		for _, h := range r.Headers {
			m.Headers[h.Key] = string(h.Value)
		}
		out = append(out, m)
	}
	return out
}

func (s *conformanceSource) Cut(testing.TB)     { s.net.cut() }
func (s *conformanceSource) Restore(testing.TB) { s.net.restore() }

// cuttableNet is the consumers' network: cut closes every connection it
// made and fails new dials until restore.
type cuttableNet struct {
	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func (n *cuttableNet) dial(ctx context.Context, network, address string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return nil, errors.New("network cut by the test")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

func (n *cuttableNet) cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down = true
	for _, c := range n.conns {
		_ = c.Close()
	}
	n.conns = nil
}

func (n *cuttableNet) restore() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down = false
}
