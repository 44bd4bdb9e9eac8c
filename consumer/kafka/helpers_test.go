package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// realBrokers reports whether the tests run against the brokers named by
// KAFKA_BROKERS instead of the in-process kfake cluster.
func realBrokers() bool { return len(testenv.KafkaBrokers()) > 0 }

// newTopics returns brokers on which topics exist with the given number of
// partitions: the real brokers when KAFKA_BROKERS is set, else a new
// in-process kfake cluster that is closed when the test ends.
func newTopics(t testing.TB, partitions int32, topics ...string) []string {
	t.Helper()
	if brokers := testenv.KafkaBrokers(); len(brokers) > 0 {
		adm := newAdmin(t, brokers)
		ctx := testenv.Context(t, 30*time.Second)
		for _, topic := range topics {
			if _, err := adm.CreateTopic(ctx, partitions, -1, nil, topic); err != nil {
				t.Fatalf("creating topic %s: %v", topic, err)
			}
		}
		return brokers
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topics...),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(1),
		// Lets the tests use a short session timeout, so that a crashed
		// member leaves the group quickly.
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// fastGroup tunes the reader for tests: quick joins, heartbeats and fetches.
// A real broker's default minimum session timeout is 6s.
func fastGroup(rc *kafkago.ReaderConfig) {
	rc.HeartbeatInterval = 100 * time.Millisecond
	rc.SessionTimeout = time.Second
	if realBrokers() {
		rc.SessionTimeout = 6 * time.Second
	}
	rc.RebalanceTimeout = 2 * time.Second
	rc.JoinGroupBackoff = 100 * time.Millisecond
	rc.MaxWait = 250 * time.Millisecond
	rc.ReadBackoffMin = 10 * time.Millisecond
	rc.ReadBackoffMax = 100 * time.Millisecond
}

func newClient(t testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatalf("kgo client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func newAdmin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	return kadm.NewClient(newClient(t, brokers))
}

// produce writes records in order, each to its Partition.
func produce(t testing.TB, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl := newClient(t, brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := testenv.Context(t, 30*time.Second)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

// committed returns the group's committed offsets of topic by partition.
func committed(t testing.TB, brokers []string, group, topic string) map[int32]int64 {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	resp, err := newAdmin(t, brokers).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetching offsets of group %s: %v", group, err)
	}
	out := map[int32]int64{}
	for p, o := range resp[topic] {
		if o.Err != nil {
			t.Fatalf("offset of %s/%d: %v", topic, p, o.Err)
		}
		out[p] = o.At
	}
	return out
}

// consumeAll reads n records of topic from the start, without a group.
func consumeAll(t testing.TB, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, brokers, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx := testenv.Context(t, 10*time.Second)
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s: %v", len(recs), n, topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs
}

// testLogger logs warnings and errors to t until the test ends.
func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t, slog.LevelWarn) }

// runConsumer starts c.Run and returns a function that stops it and
// returns Run's result.
func runConsumer(t testing.TB, c *Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-errc
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// recorder records what a test consumer handled and set aside. Its
// handle and observer may be shared by several consumers; read its fields
// under mu.
type recorder struct {
	mu sync.Mutex
	// bodies are the bodies handled, in order, at the instants at.
	bodies []string
	at     []time.Time
	// count is the deliveries of each body.
	count map[string]int
	// stays are the set-asides, each for how long.
	stays []time.Duration
	// also, when set, sees each message handled, under mu.
	also func(consumer.Message)
}

func newRecorder() *recorder { return &recorder{count: map[string]int{}} }

// handle is a consumer.Handler that records m and succeeds.
func (r *recorder) handle(_ context.Context, m consumer.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bodies = append(r.bodies, string(m.Body))
	r.at = append(r.at, time.Now())
	r.count[string(m.Body)]++
	if r.also != nil {
		r.also(m)
	}
	return nil
}

// observer returns an Observer that records the set-asides.
func (r *recorder) observer() *consumer.MessageObserver {
	return &consumer.MessageObserver{SetAside: func(_ consumer.Message, d time.Duration) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.stays = append(r.stays, d)
	}}
}

// waitDistinct waits until n distinct bodies were handled.
func (r *recorder) waitDistinct(t *testing.T, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d distinct messages handled", n), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.count) >= n
	})
}

// checkOnce reports every body handled more than once; name prefixes the
// errors ("" for none).
func (r *recorder) checkOnce(t testing.TB, name string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, k := range r.count {
		if k != 1 {
			t.Errorf("%smessage %s delivered %d times, want once", name, id, k)
		}
	}
}
