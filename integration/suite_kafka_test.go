package integration

import (
	"context"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/internal/testenv"
)

// suitePartitions is the number of partitions of each test topic: two for
// each of three replicas.
const suitePartitions = 6

// suiteKafka is the suite's Kafka: one set of brokers for all its tests.
type suiteKafka struct {
	brokers        []string
	sessionTimeout time.Duration
}

func suiteOpenKafka(t *testing.T, env suiteEnv) suiteBroker {
	return &suiteKafka{brokers: env.kafkaBrokers(t), sessionTimeout: env.kafkaSessionTimeout}
}

func (k *suiteKafka) newQueue(t *testing.T) suiteQueue {
	t.Helper()
	q := &suiteTopic{
		kafka: k,
		topic: suiteName(t, "topic"),
		group: suiteName(t, "group"),
		admin: kadm.NewClient(suiteKgo(t, k.brokers)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.admin.CreateTopic(ctx, suitePartitions, -1, nil, q.topic); err != nil {
		t.Fatalf("creating topic %s: %v", q.topic, err)
	}
	if _, err := q.admin.CreateTopic(ctx, 1, -1, nil, q.topic+".dlq"); err != nil {
		t.Fatalf("creating topic %s.dlq: %v", q.topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = q.admin.DeleteTopics(ctx, q.topic, q.topic+".dlq")
		_, _ = q.admin.DeleteGroup(ctx, q.group)
	})
	return q
}

// suiteTopic is one topic, its dead-letter topic and one consumer group.
type suiteTopic struct {
	kafka *suiteKafka
	topic string
	group string
	admin *kadm.Client
}

func (q *suiteTopic) replica(t *testing.T, spec suiteReplicaSpec) suiteRunner {
	t.Helper()
	opts := spec.options(t)
	opts.Concurrency = 2
	c, err := kafka.New(kafka.Config{
		Options:       opts,
		Brokers:       q.kafka.brokers,
		Topic:         q.topic,
		Group:         q.group,
		CommitTimeout: 5 * time.Second,
		ConfigureReader: func(rc *kafkago.ReaderConfig) {
			rc.HeartbeatInterval = 100 * time.Millisecond
			rc.SessionTimeout = q.kafka.sessionTimeout
			rc.RebalanceTimeout = 2 * time.Second
			rc.JoinGroupBackoff = 100 * time.Millisecond
			rc.MaxWait = 100 * time.Millisecond
			rc.ReadBackoffMin = 10 * time.Millisecond
			rc.ReadBackoffMax = 100 * time.Millisecond
		},
	}, spec.handler)
	if err != nil {
		t.Fatalf("kafka.New: %v", err)
	}
	return c
}

// waitConsumers waits until the group is stable with n members that all
// have partitions, so that no rebalance interrupts the test.
func (q *suiteTopic) waitConsumers(t *testing.T, n int) {
	t.Helper()
	testenv.WaitGroupStable(t, q.admin, q.group, n, 30*time.Second)
}

// publish writes the bodies round-robin over the partitions, so that every
// replica has work.
func (q *suiteTopic) publish(t *testing.T, bodies []string) {
	t.Helper()
	cl := suiteKgo(t, q.kafka.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, len(bodies))
	for i, b := range bodies {
		recs[i] = &kgo.Record{Topic: q.topic, Partition: int32(i % suitePartitions), Key: []byte(b), Value: []byte(b)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing to %s: %v", q.topic, err)
	}
}

func (q *suiteTopic) deadLettered(t *testing.T, n int) []suiteDLMessage {
	t.Helper()
	cl := suiteKgo(t, q.kafka.brokers, kgo.ConsumeTopics(q.topic+".dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []suiteDLMessage
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s.dlq: %v", len(out), n, q.topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			out = append(out, suiteDLMessage{body: string(r.Value), headers: h})
		})
	}
	return out
}

// origin names the dead-letter header that gives the topic.
func (q *suiteTopic) origin() (header, value string) { return kafka.HeaderOriginalTopic, q.topic }

// pending returns the group's lag: the records after its committed offsets.
func (q *suiteTopic) pending(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := q.admin.ListEndOffsets(ctx, q.topic)
	if err != nil {
		t.Fatalf("listing end offsets of %s: %v", q.topic, err)
	}
	committed, err := q.admin.FetchOffsets(ctx, q.group)
	if err != nil {
		t.Fatalf("fetching offsets of group %s: %v", q.group, err)
	}
	lag := 0
	ends.Each(func(end kadm.ListedOffset) {
		if end.Err != nil {
			t.Fatalf("end offset of %s/%d: %v", q.topic, end.Partition, end.Err)
		}
		var at int64
		if c, ok := committed.Lookup(q.topic, end.Partition); ok && c.Err == nil && c.At > 0 {
			at = c.At
		}
		lag += int(end.Offset - at)
	})
	return lag
}

// suiteKgo returns a franz-go client for the test's own producing, reading
// and administration, closed when t ends.
func suiteKgo(t testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatalf("kgo client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}
