package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/faultproxy"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// faultPermanentEvery makes every n-th message fail permanently, so that the
// dead-letter path runs during the fault too.
const faultPermanentEvery = 25

// faultMessageIDs returns the bodies (and ids) of n test messages.
func faultMessageIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%04d", i)
	}
	return ids
}

// faultIsPermanent reports whether the test handler rejects message id.
func faultIsPermanent(id string) bool {
	var i int
	fmt.Sscanf(id, "m-%d", &i)
	return i%faultPermanentEvery == faultPermanentEvery-1
}

// faultTracker records where each message ended: delivered by the handler,
// or dead-lettered by the consumer. A message may be delivered more than
// once (at least once), but must end somewhere.
type faultTracker struct {
	mu           sync.Mutex
	delivered    map[string]int
	deadLettered map[string]int
	reconnects   atomic.Int64
	failed       atomic.Int64
}

func newFaultTracker() *faultTracker {
	return &faultTracker{delivered: map[string]int{}, deadLettered: map[string]int{}}
}

// Handler is the test sink: it rejects the permanent ids and records the
// others as delivered. sink, when not nil, is called first, and its error
// fails the attempt.
func (f *faultTracker) Handler(sink consumer.Handler) consumer.Handler {
	return func(ctx context.Context, msg consumer.Message) error {
		id := string(msg.Body)
		if faultIsPermanent(id) {
			return consumer.Permanent(errors.New("the test sink rejects " + id))
		}
		if sink != nil {
			if err := sink(ctx, msg); err != nil {
				return err
			}
		}
		f.mu.Lock()
		f.delivered[id]++
		f.mu.Unlock()
		return nil
	}
}

// Observer counts dead letters and reconnects.
func (f *faultTracker) Observer() *consumer.MessageObserver {
	return &consumer.MessageObserver{
		DeadLettered: func(msg consumer.Message, _ error) {
			f.mu.Lock()
			f.deadLettered[string(msg.Body)]++
			f.mu.Unlock()
		},
		Reconnected: func(string, error) { f.reconnects.Add(1) },
		Failed:      func(consumer.Message, error) { f.failed.Add(1) },
	}
}

// Delivered returns how many distinct messages were delivered.
func (f *faultTracker) Delivered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.delivered)
}

// Missing returns the ids that ended nowhere, and the ids that ended in the
// wrong place.
func (f *faultTracker) Missing(ids []string) (missing, wrong []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		d, dl := f.delivered[id] > 0, f.deadLettered[id] > 0
		switch {
		case !d && !dl:
			missing = append(missing, id)
		case d == faultIsPermanent(id) || dl != faultIsPermanent(id):
			wrong = append(wrong, id)
		}
	}
	return missing, wrong
}

// Summary describes the counts for the log.
func (f *faultTracker) Summary(n int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	dup := 0
	for _, c := range f.delivered {
		dup += c - 1
	}
	return fmt.Sprintf("%d messages: %d delivered (+%d duplicates), %d dead-lettered, %d failed attempts, %d reconnects",
		n, len(f.delivered), dup, len(f.deadLettered), f.failed.Load(), f.reconnects.Load())
}

// faultWaitAccounted waits until every message ended somewhere, failing
// the test with the missing ones after d.
func faultWaitAccounted(t *testing.T, f *faultTracker, ids []string, d time.Duration) {
	t.Helper()
	var missing []string
	if !testenv.Within(d, func() bool {
		var wrong []string
		missing, wrong = f.Missing(ids)
		if len(wrong) > 0 {
			t.Fatalf("messages ended in the wrong place: %v", wrong)
		}
		return len(missing) == 0
	}) {
		t.Fatalf("after %v, %d messages were neither delivered nor dead-lettered: %v (%s)", d, len(missing), faultHead(missing), f.Summary(len(ids)))
	}
}

func faultHead(s []string) []string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

// faultRabbitQueue declares queue as rabbitmq.Config.Declare does, publishes
// the messages with confirms, and deletes the topology when the test ends.
// It returns a channel for the test's own checks.
func faultRabbitQueue(t *testing.T, rawURL, queue string, ids []string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		t.Fatalf("connecting to RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	dlx, dlq := queue+".dlx", queue+".dlq"
	t.Cleanup(func() {
		ch.QueueDelete(queue, false, false, false)
		ch.QueueDelete(dlq, false, false, false)
		ch.ExchangeDelete(dlx, false, false)
	})
	if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(dlq, "", dlx, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 30*time.Second)
	var confirms []*amqp.DeferredConfirmation
	for _, id := range ids {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatalf("publishing %s: %v", id, err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v, %v", ok, err)
		}
	}
	return ch
}

// faultQueueDepth returns the ready messages in queue.
func faultQueueDepth(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting %s: %v", queue, err)
	}
	return q.Messages
}

// TestFaultRabbitMQConnectionCut cuts the consumer's connection to the
// broker mid-run with a proxy: the consumer reconnects, the unacked
// deliveries come back, and every message is delivered or dead-lettered.
func TestFaultRabbitMQConnectionCut(t *testing.T) {
	t.Parallel()
	raw := testenv.AMQPURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5672")
	}
	proxy, err := faultproxy.New(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxied := *u
	proxied.Host = proxy.Addr()

	queue := faultName(t)
	ids := faultMessageIDs(400)
	ch := faultRabbitQueue(t, raw, queue, ids)
	bucket, err := limiter.NewLocal(200, 10)
	if err != nil {
		t.Fatal(err)
	}
	tr := newFaultTracker()
	c, err := rabbitmq.New(rabbitmq.Config{
		URL:                 proxied.String(),
		Queue:               queue,
		Declare:             true,
		Prefetch:            20,
		ReconnectBackoff:    50 * time.Millisecond,
		MaxReconnectBackoff: 500 * time.Millisecond,
		Options: consumer.Options{
			Limiter:      bucket,
			Observer:     tr.Observer(),
			Logger:       faultLogger(t),
			Retry:        consumer.RetryPolicy{MaxAttempts: 3, Backoff: 10 * time.Millisecond},
			DrainTimeout: 5 * time.Second,
		},
	}, tr.Handler(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	testenv.Eventually(t, 20*time.Second, "a third of the messages delivered", func() bool { return tr.Delivered() > len(ids)/3 })
	proxy.Cut()
	cutAt := tr.Delivered()
	faultWaitAccounted(t, tr, ids, 30*time.Second)
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if tr.reconnects.Load() == 0 || proxy.Accepted() < 2 {
		t.Errorf("reconnects %d, proxy connections %d: the cut did not force a reconnect", tr.reconnects.Load(), proxy.Accepted())
	}
	wantDead := 0
	for _, id := range ids {
		if faultIsPermanent(id) {
			wantDead++
		}
	}
	// Every rejected message reaches the dead-letter queue, and nothing
	// else. A dead letter is published, confirmed and then its delivery
	// acked: one whose ack the cut lost comes back and is dead-lettered
	// again, so a rejected message may be there twice (at-least-once), at
	// most one copy per delivery in flight at the cut (the prefetch).
	dead := map[string]int{}
	copies := 0
	testenv.Eventually(t, 10*time.Second, "every rejected message in the dead-letter queue", func() bool {
		for {
			d, ok, err := ch.Get(queue+".dlq", true)
			if err != nil {
				t.Fatalf("reading %s.dlq: %v", queue, err)
			}
			if !ok {
				return len(dead) >= wantDead
			}
			dead[string(d.Body)]++
			copies++
		}
	})
	for id := range dead {
		if !faultIsPermanent(id) {
			t.Errorf("%s dead-lettered, but the handler never rejected it", id)
		}
	}
	if extra := copies - len(dead); extra > 20 {
		t.Errorf("%d copies of %d rejected messages in the dead-letter queue: %d more than the 20 deliveries in flight at the cut", copies, len(dead), extra)
	}
	if n := faultQueueDepth(t, ch, queue); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
	t.Logf("RabbitMQ cut after %d deliveries: %s; %d rejected messages in the DLQ (%d copies), 0 left in the queue", cutAt, tr.Summary(len(ids)), len(dead), copies)
}

// faultAdvertisedListener makes kfake advertise the proxy's address in its
// metadata, so that every connection a Kafka client opens, not only the
// bootstrap one, goes through the proxy.
type faultAdvertisedListener struct {
	net.Listener
	addr net.Addr
}

func (l faultAdvertisedListener) Addr() net.Addr { return l.addr }

// faultKafkaBehindProxy starts a one-broker kfake cluster whose clients all
// connect through a faultproxy, with topic seeded with partitions.
func faultKafkaBehindProxy(t *testing.T, partitions int32, topic string) (*kfake.Cluster, *faultproxy.Proxy) {
	t.Helper()
	var proxy *faultproxy.Proxy
	listen := func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		proxy, err = faultproxy.New(ln.Addr().String())
		if err != nil {
			ln.Close()
			return nil, err
		}
		pa, err := net.ResolveTCPAddr("tcp", proxy.Addr())
		if err != nil {
			ln.Close()
			return nil, err
		}
		return faultAdvertisedListener{Listener: ln, addr: pa}, nil
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.ListenFn(listen),
		kfake.SeedTopics(partitions, topic),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(1),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		proxy.Close()
	})
	if got := c.ListenAddrs(); len(got) != 1 || got[0] != proxy.Addr() {
		t.Fatalf("kfake advertises %v, want the proxy %s", got, proxy.Addr())
	}
	return c, proxy
}

// faultProduce writes one record per id, spread over the partitions.
func faultProduce(t *testing.T, brokers []string, topic string, ids []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, id := range ids {
		recs = append(recs, &kgo.Record{Key: []byte(id), Value: []byte(id)})
	}
	ctx := testenv.Context(t, 30*time.Second)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

// faultKafkaFastGroup makes group changes quick in tests.
func faultKafkaFastGroup(rc *kafkago.ReaderConfig) {
	rc.HeartbeatInterval = 100 * time.Millisecond
	rc.SessionTimeout = time.Second
	rc.RebalanceTimeout = 2 * time.Second
	rc.JoinGroupBackoff = 100 * time.Millisecond
	rc.MaxWait = 100 * time.Millisecond
	rc.ReadBackoffMin = 10 * time.Millisecond
	rc.ReadBackoffMax = 100 * time.Millisecond
}

// faultKafkaLag returns the messages of topic not yet committed by group.
func faultKafkaLag(ctx context.Context, brokers []string, group, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return 0, err
	}
	var lag int64
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := offs.Lookup(topic, o.Partition)
		if !ok || c.At < 0 {
			lag += o.Offset
			return
		}
		lag += o.Offset - c.At
	})
	return lag, nil
}

// faultKafkaDistinct reads topic from the start and returns the distinct
// values, waiting up to d for want of them.
func faultKafkaDistinct(t *testing.T, brokers []string, topic string, want int, d time.Duration) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testenv.Context(t, d)
	seen := map[string]bool{}
	for len(seen) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
	var out []string
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// faultKafkaRun runs one Kafka consumer on brokers until ctx ends.
func faultKafkaRun(t *testing.T, ctx context.Context, cfg kafka.Config, h consumer.Handler) <-chan error {
	t.Helper()
	c, err := kafka.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return done
}

// TestFaultKafkaConnectionCut cuts every connection between the consumer
// and the broker mid-run: the consumer reconnects and rejoins its group,
// and every message is delivered or dead-lettered, and committed.
func TestFaultKafkaConnectionCut(t *testing.T) {
	t.Parallel()
	topic, group := faultName(t), faultName(t)
	_, proxy := faultKafkaBehindProxy(t, 4, topic)
	brokers := []string{proxy.Addr()}
	ids := faultMessageIDs(400)
	faultProduce(t, brokers, topic, ids)
	bucket, err := limiter.NewLocal(200, 10)
	if err != nil {
		t.Fatal(err)
	}
	tr := newFaultTracker()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := faultKafkaRun(t, ctx, kafka.Config{
		Options: consumer.Options{Concurrency: 4, Limiter: bucket, Observer: tr.Observer(), Logger: faultLogger(t), Retry: consumer.RetryPolicy{MaxAttempts: 3, Backoff: 10 * time.Millisecond}, DrainTimeout: 5 * time.Second},
		Brokers: brokers, Topic: topic, Group: group,
		ConfigureReader: faultKafkaFastGroup,
	}, tr.Handler(nil))

	testenv.Eventually(t, 30*time.Second, "a third of the messages delivered", func() bool { return tr.Delivered() > len(ids)/3 })
	before := proxy.Accepted()
	proxy.Cut()
	cutAt := tr.Delivered()
	faultWaitAccounted(t, tr, ids, 60*time.Second)
	testenv.Eventually(t, 20*time.Second, "the group committing every message", func() bool {
		lag, err := faultKafkaLag(context.Background(), brokers, group, topic)
		return err == nil && lag == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if proxy.Accepted() <= before {
		t.Errorf("no connection after the cut (%d before, %d after): the consumer did not reconnect", before, proxy.Accepted())
	}
	var wantDead []string
	for _, id := range ids {
		if faultIsPermanent(id) {
			wantDead = append(wantDead, id)
		}
	}
	gotDead := faultKafkaDistinct(t, brokers, topic+".dlq", len(wantDead), 10*time.Second)
	if strings.Join(gotDead, ",") != strings.Join(wantDead, ",") {
		t.Errorf("dead-letter topic holds %v, want %v", gotDead, wantDead)
	}
	t.Logf("Kafka cut after %d deliveries (%d broker connections before, %d after): %s; %d distinct in the DLQ, lag 0",
		cutAt, before, proxy.Accepted(), tr.Summary(len(ids)), len(gotDead))
}
