package kafka

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// keySpacing is a consumer.MessageLimiter that lets one message of a key
// (the Kafka key) through every interval and refuses the others as a
// layer with on_exceed delay does (a *limiter.LimitError with
// ActionDelay), so that consumer.Throttle sets them aside until the key
// has room. It records its grants.
type keySpacing struct {
	interval time.Duration

	mu     sync.Mutex
	next   map[string]time.Time
	grants map[string][]time.Time
}

func newKeySpacing(interval time.Duration) *keySpacing {
	return &keySpacing{interval: interval, next: map[string]time.Time{}, grants: map[string][]time.Time{}}
}

func (k *keySpacing) Wait(context.Context, int) error { return nil }

func (k *keySpacing) WaitMessage(_ context.Context, msg consumer.Message, _ int) error {
	key := string(msg.Key)
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if next := k.next[key]; now.Before(next) {
		return &limiter.LimitError{Layer: "per-key", Action: limiter.ActionDelay,
			Reason: fmt.Sprintf("1 per %v", k.interval), Wait: next.Sub(now)}
	}
	k.next[key] = now.Add(k.interval)
	k.grants[key] = append(k.grants[key], now)
	return nil
}

// closestGrants returns the shortest time between two grants of one key.
func (k *keySpacing) closestGrants() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	closest := time.Duration(1<<63 - 1)
	for _, gs := range k.grants {
		for i := 1; i < len(gs); i++ {
			closest = min(closest, gs[i].Sub(gs[i-1]))
		}
	}
	return closest
}

// newDelayCluster starts a kfake cluster with topic (and no delay topic:
// the consumer creates it) for a test that needs the cluster's controls.
func newDelayCluster(t *testing.T, partitions int32, topic string) *kfake.Cluster {
	t.Helper()
	if realBrokers() {
		t.Skip("needs kfake's request controls")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// commitLog records, in a sequence shared with the set-aside events, every
// offset commit the cluster receives, and can refuse them.
type commitLog struct {
	seq    *atomic.Int64
	refuse atomic.Bool

	mu      sync.Mutex
	commits []commitEvent
}

type commitEvent struct {
	seq       int64
	topic     string
	partition int32
	offset    int64
}

// watch installs the log on c's OffsetCommit requests. While refuse is set,
// it answers each with REQUEST_TIMED_OUT (retriable) and commits nothing.
func (l *commitLog) watch(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.OffsetCommitRequest)
		if !l.refuse.Load() {
			l.mu.Lock()
			n := l.seq.Add(1)
			for _, tp := range req.Topics {
				for _, p := range tp.Partitions {
					l.commits = append(l.commits, commitEvent{n, tp.Topic, p.Partition, p.Offset})
				}
			}
			l.mu.Unlock()
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, tp := range req.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic = tp.Topic
			for _, p := range tp.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.RequestTimedOut.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
}

// firstCommitPast returns the sequence number of the first commit of
// topic/partition past offset, or 0.
func (l *commitLog) firstCommitPast(topic string, partition int, offset int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.commits {
		if e.topic == topic && int(e.partition) == partition && e.offset > offset {
			return e.seq
		}
	}
	return 0
}

// TestSetAsideKafka runs a consumer on kfake with a limit of one message
// per key every 100 ms that sets the others aside: every message is
// delivered exactly once, none is dead-lettered, the grants of a key are
// never closer than the limit, the delay topic (created by the consumer)
// is consumed and committed to its end, and each original was committed
// only after its copy was written to the delay topic.
func TestSetAsideKafka(t *testing.T) {
	const (
		keys       = 4
		perKey     = 8
		n          = keys * perKey
		interval   = 100 * time.Millisecond
		partitions = 4
	)
	for _, ordering := range []consumer.Ordering{consumer.OrderPartition, consumer.OrderKey} {
		t.Run(string(ordering), func(t *testing.T) {
			topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
			cluster := newDelayCluster(t, partitions, topic)
			brokers := cluster.ListenAddrs()
			var seq atomic.Int64
			commits := &commitLog{seq: &seq}
			commits.watch(cluster)

			recs := make([]*kgo.Record, n)
			for i := range recs {
				recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions),
					Key: []byte("k" + strconv.Itoa(i%keys)), Value: []byte(strconv.Itoa(i))}
			}
			produce(t, brokers, recs...)

			type setAsideEvent struct {
				seq       int64
				partition int
				offset    int64
			}
			var (
				mu        sync.Mutex
				delivered = map[string]int{}
				setAside  []setAsideEvent
				all       = make(chan struct{})
			)
			obs := &consumer.MessageObserver{SetAside: func(m consumer.Message, _ time.Duration) {
				if m.Source.Topic != topic {
					return // set aside again from the delay topic
				}
				mu.Lock()
				defer mu.Unlock()
				setAside = append(setAside, setAsideEvent{seq.Add(1), m.Source.Partition, m.Source.Offset})
			}}
			h := func(_ context.Context, m consumer.Message) error {
				mu.Lock()
				defer mu.Unlock()
				delivered[string(m.Body)]++
				if len(delivered) == n {
					select {
					case <-all:
					default:
						close(all)
					}
				}
				return nil
			}
			lim := newKeySpacing(interval)
			c, err := New(Config{
				Brokers: brokers, Topic: topic, Group: group,
				Options:         consumer.Options{SetAside: true, Concurrency: partitions, Limiter: lim, Ordering: ordering, Observer: obs, Logger: testLogger(t)},
				ConfigureReader: fastGroup,
			}, h)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			select {
			case <-all:
			case <-time.After(30 * time.Second):
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("delivered %d of %d messages", len(delivered), n)
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			mu.Lock()
			defer mu.Unlock()
			for id, k := range delivered {
				if k != 1 {
					t.Errorf("message %s delivered %d times", id, k)
				}
			}
			if len(setAside) == 0 {
				t.Fatal("no message was set aside")
			}
			if d := lim.closestGrants(); d < interval {
				t.Errorf("two grants of one key %v apart, want >= %v", d, interval)
			}
			for _, e := range setAside {
				if cs := commits.firstCommitPast(topic, e.partition, e.offset); cs != 0 && cs < e.seq {
					t.Errorf("offset %d of partition %d committed (event %d) before its delay copy was written (event %d)", e.offset, e.partition, cs, e.seq)
				}
			}
			// The delay topic was created with the topic's partitions, and
			// the group committed both topics to their ends.
			ends := endOffsets(t, brokers, topic+".delay")
			if len(ends) != partitions {
				t.Errorf("delay topic has %d partitions, want %d", len(ends), partitions)
			}
			var copies int64
			for _, e := range ends {
				copies += e
			}
			if got := committed(t, brokers, group, topic+".delay"); !equalOffsets(got, ends) {
				t.Errorf("delay topic committed %v, want its ends %v", got, ends)
			}
			if got, want := committed(t, brokers, group, topic), endOffsets(t, brokers, topic); !equalOffsets(got, want) {
				t.Errorf("topic committed %v, want its ends %v", got, want)
			}
			if dl := endOffsets(t, brokers, topic+".dlq"); len(dl) != 0 {
				t.Errorf("dead-letter topic exists: %v", dl)
			}
			t.Logf("%d messages over %d keys at 1 per %v: %d set aside from the topic, %d copies in the delay topic, all delivered once",
				n, keys, interval, len(setAside), copies)
		})
	}
}

// TestSetAsideCrashBeforeCommit stops a replica between the write of a
// message to the delay topic and the commit of the original (the brokers
// refuse every commit from the moment the copy is written, as if the
// replica had crashed): the next replica of the group handles the
// original again and the copy too, a duplicate, and no message is lost.
func TestSetAsideCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	cluster := newDelayCluster(t, 1, topic)
	brokers := cluster.ListenAddrs()
	var seq atomic.Int64
	commits := &commitLog{seq: &seq}
	commits.watch(cluster)
	const n = 3
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
	}
	produce(t, brokers, recs...)

	var (
		mu        sync.Mutex
		delivered = map[string]int{}
		original  = int64(-1) // offset of the first message set aside
	)
	published := make(chan struct{})
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		delivered[string(m.Body)]++
		return nil
	}
	lim := newKeySpacing(300 * time.Millisecond)
	newReplica := func(obs *consumer.MessageObserver) *Consumer {
		c, err := New(Config{
			Brokers: brokers, Topic: topic, Group: group, CommitTimeout: time.Second,
			Options:         consumer.Options{SetAside: true, Limiter: lim, Observer: obs, Logger: testLogger(t)},
			ConfigureReader: fastGroup,
		}, h)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Called once the copy is written, before the original finishes.
	crash := &consumer.MessageObserver{SetAside: func(m consumer.Message, _ time.Duration) {
		if commits.refuse.Swap(true) {
			return
		}
		mu.Lock()
		original = m.Source.Offset
		mu.Unlock()
		close(published)
	}}
	stop1 := runConsumer(t, newReplica(crash))
	select {
	case <-published:
	case <-time.After(20 * time.Second):
		t.Fatal("no message was set aside")
	}
	if err := stop1(); err != nil {
		t.Fatalf("Run of the first replica: %v", err)
	}
	mu.Lock()
	off := original
	mu.Unlock()
	if got := committed(t, brokers, group, topic)[0]; got > off {
		t.Fatalf("offset %d committed past the message set aside at %d", got, off)
	}
	commits.refuse.Store(false)

	stop2 := runConsumer(t, newReplica(nil))
	id := strconv.FormatInt(off, 10) // the bodies are the offsets
	waitFor(t, "every message delivered, and the one set aside twice", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) == n && delivered[id] >= 2
	})
	if err := stop2(); err != nil {
		t.Fatalf("Run of the second replica: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("crash after the delay write of offset %d: deliveries by message %v", off, delivered)
}

// endOffsets returns the end offsets of topic by partition (none when the
// topic does not exist).
func endOffsets(t testing.TB, brokers []string, topic string) map[int32]int64 {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	ends, err := newAdmin(t, brokers).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			out[o.Partition] = o.Offset
		}
	})
	return out
}

func equalOffsets(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for p, o := range a {
		if b[p] != o {
			return false
		}
	}
	return true
}
