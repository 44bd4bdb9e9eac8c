package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// newIdleConsumer returns a consumer that is never run, to read Backlog,
// closed when the test ends.
func newIdleConsumer(t *testing.T, cfg Config) *Consumer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c, err := New(cfg, func(context.Context, consumer.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readBacklog calls read (Backlog or BacklogParts) with a deadline and
// fails the test on an error.
func readBacklog[T any](t *testing.T, read func(context.Context) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := read(ctx)
	if err != nil {
		t.Fatalf("reading the backlog: %v", err)
	}
	return v
}

// backlog calls c.Backlog with a deadline and fails the test on an error.
func backlog(t *testing.T, c *Consumer) int64 {
	t.Helper()
	return readBacklog(t, c.Backlog)
}

// backlogParts calls c.BacklogParts with a deadline and fails the test on
// an error.
func backlogParts(t *testing.T, c *Consumer) consumer.Backlog {
	t.Helper()
	return readBacklog(t, c.BacklogParts)
}

// waitForBacklog polls read (Backlog or BacklogParts) until it returns
// want. Commits are asynchronous, so a value is only reached some time
// after the handler returned.
func waitForBacklog[T comparable](t *testing.T, read func(context.Context) (T, error), want T) {
	t.Helper()
	var got T
	if !testenv.Within(30*time.Second, func() bool {
		got = readBacklog(t, read)
		return got == want
	}) {
		t.Fatalf("backlog = %+v, want %+v within 30s", got, want)
	}
}

// waitBacklog polls c.Backlog until it returns want.
func waitBacklog(t *testing.T, c *Consumer, want int64) {
	t.Helper()
	waitForBacklog(t, c.Backlog, want)
}

// waitBacklogParts polls c.BacklogParts until it returns want.
func waitBacklogParts(t *testing.T, c *Consumer, want consumer.Backlog) {
	t.Helper()
	waitForBacklog(t, c.BacklogParts, want)
}

// TestBacklog follows the backlog of a group through a run: all of the
// topic before anything is committed, the unhandled rest once a gate in
// the handler stops it after k messages, and nothing once everything is
// handled. Another consumer of the group that never runs reads the same
// values, and Backlog keeps working after Run returned.
func TestBacklog(t *testing.T) {
	const (
		partitions = 3
		n          = 30
		k          = 12
	)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, partitions, topic)
	produce(t, brokers, records(topic, partitions, n)...)

	var (
		mu      sync.Mutex
		handled = map[pos]bool{}
		gate    = make(chan struct{})
		all     = make(chan struct{})
	)
	var openGate sync.Once
	t.Cleanup(func() { openGate.Do(func() { close(gate) }) })
	cfg := Config{
		Options: consumer.Options{Concurrency: partitions, Logger: testLogger(t), DrainTimeout: 5 * time.Second},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}
	c, err := New(cfg, func(ctx context.Context, m consumer.Message) error {
		p := pos{m.Source.Partition, m.Source.Offset}
		mu.Lock()
		if !handled[p] && len(handled) >= k {
			// The gate holds the (k+1)-th distinct message and
			// those after it. A redelivered one passes: it was
			// counted.
			mu.Unlock()
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
		}
		if !handled[p] {
			handled[p] = true
			if len(handled) == n {
				close(all)
			}
		}
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Another replica's view: it never runs.
	other := newIdleConsumer(t, Config{Brokers: brokers, Topic: topic, Group: group})

	// Nothing is committed yet: the group would start at the first offset.
	if got := backlog(t, c); got != n {
		t.Fatalf("Backlog before Run = %d, want %d", got, n)
	}

	stop := runConsumer(t, c)
	waitBacklog(t, c, n-k)
	// Until the gate opens nothing more is handled, so nothing more is
	// committed: the value stays, and every replica and concurrent call
	// reads it.
	sum := int64(0)
	for _, o := range committed(t, brokers, group, topic) {
		sum += o
	}
	if sum != k {
		t.Fatalf("committed offsets sum to %d, want %d", sum, k)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				got, err := c.Backlog(ctx)
				cancel()
				if err != nil || got != n-k {
					errs <- fmt.Errorf("concurrent Backlog = %d, %v", got, err)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("while gated, want %d: %v", n-k, err)
	}
	if got := backlog(t, other); got != n-k {
		t.Errorf("Backlog of another replica = %d, want %d", got, n-k)
	}

	openGate.Do(func() { close(gate) })
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatal("not every message was handled")
	}
	waitBacklog(t, c, 0)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}

	// After Run returned, Backlog still reads the group: new messages
	// are its backlog.
	produce(t, brokers, records(topic, partitions, 5)...)
	if got := backlog(t, c); got != 5 {
		t.Errorf("Backlog after Run returned and 5 new messages = %d, want 5", got)
	}
	if got := backlog(t, other); got != 5 {
		t.Errorf("Backlog of another replica = %d, want 5", got)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Backlog(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Errorf("Backlog after Close = %v, want consumer.ErrStopped", err)
	}
}

// TestBacklogCountsSetAside follows the backlog of a group that sets
// messages aside: before the delay topic exists, while the messages set
// aside wait in it (not due on the consumer's clock), and once they are
// due and handled. The messages set aside are still to be delivered, so
// Backlog counts them and BacklogParts reports them apart; a consumer of
// the group without SetAside counts the topic alone.
func TestBacklogCountsSetAside(t *testing.T) {
	t.Parallel()
	const (
		partitions = 2
		n          = 12
		setAside   = n / 3 // keys 0, 3, 6 and 9
	)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, partitions, topic)
	produce(t, brokers, records(topic, partitions, n)...)

	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	clk := newFakeClock(t0)
	var handled atomic.Int64
	cfg := Config{
		Options: consumer.Options{Concurrency: partitions, SetAside: true, Logger: testLogger(t), DrainTimeout: 5 * time.Second},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}
	c, err := New(cfg, func(_ context.Context, m consumer.Message) error {
		// A key divisible by 3 is set aside for an hour (a stay capped
		// at Options.MaxSetAside, a minute on the fake clock) when it
		// first comes from the topic.
		if i, _ := strconv.Atoi(string(m.Key)); m.Source.Topic == topic && i%3 == 0 {
			return consumer.SetAside(errors.New("over the per-key limit"), time.Hour)
		}
		handled.Add(1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.clock = clk
	t.Cleanup(func() { _ = c.Close() })
	other := newIdleConsumer(t, Config{Brokers: brokers, Topic: topic, Group: group, Options: consumer.Options{SetAside: true}})
	topicOnly := newIdleConsumer(t, Config{Brokers: brokers, Topic: topic, Group: group})

	// The delay topic does not exist yet: Run creates it.
	if got, want := backlogParts(t, c), (consumer.Backlog{Ready: n}); got != want {
		t.Fatalf("BacklogParts before Run = %+v, want %+v", got, want)
	}

	stop := runConsumer(t, c)
	// Once the topic is committed to its end, the state holds still: the
	// messages set aside were written before the commit passed them, and
	// they are not due before the clock moves.
	adm := newAdmin(t, brokers)
	waitFor(t, "the topic committed to its end", func() bool {
		// The group exists once it joined.
		resp, err := adm.FetchOffsets(testenv.Context(t, 10*time.Second), group)
		sum := int64(0)
		for _, o := range resp[topic] {
			sum += o.At
		}
		return err == nil && sum == n
	})
	// The consumers see the delay topic that Run created once their
	// cached metadata is refreshed, a few seconds later at most.
	waitBacklog(t, c, setAside)
	want := consumer.Backlog{SetAside: setAside}
	if got := backlogParts(t, c); got != want {
		t.Errorf("BacklogParts with the topic committed = %+v, want %+v", got, want)
	}
	waitBacklogParts(t, other, want)
	if got := backlog(t, topicOnly); got != 0 {
		t.Errorf("Backlog of a replica without SetAside = %d, want 0: it does not read the delay topic", got)
	}
	if h := handled.Load(); h != n-setAside {
		t.Errorf("%d messages handled before the delay, want %d", h, n-setAside)
	}

	clk.set(t0.Add(time.Hour))
	waitBacklog(t, c, 0)
	waitBacklogParts(t, other, consumer.Backlog{})
	if h := handled.Load(); h != n {
		t.Errorf("%d messages handled, want %d", h, n)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// TestBacklogStartOffset checks how partitions without a commit, with a
// commit below the first offset and with a commit past the last offset
// count, under both start offsets.
func TestBacklogStartOffset(t *testing.T) {
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, 2, topic)
	var recs []*kgo.Record
	for range 10 {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Value: []byte("p0")})
	}
	for range 6 {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 1, Value: []byte("p1")})
	}
	produce(t, brokers, recs...)

	base := Config{Brokers: brokers, Topic: topic, Group: group}
	withStart := func(start int64) *Consumer {
		cfg := base
		cfg.StartOffset = start
		return newIdleConsumer(t, cfg)
	}
	byDefault := newIdleConsumer(t, base)
	first := withStart(kafkago.FirstOffset)
	last := withStart(kafkago.LastOffset)
	cfg := base
	cfg.ConfigureReader = func(rc *kafkago.ReaderConfig) { rc.StartOffset = kafkago.LastOffset }
	lastByHook := newIdleConsumer(t, cfg)

	check := func(step string, wantFirst, wantLast int64) {
		t.Helper()
		for _, tc := range []struct {
			name string
			c    *Consumer
			want int64
		}{
			{"default", byDefault, wantFirst},
			{"FirstOffset", first, wantFirst},
			{"LastOffset", last, wantLast},
			{"LastOffset by ConfigureReader", lastByHook, wantLast},
		} {
			if got := backlog(t, tc.c); got != tc.want {
				t.Errorf("%s: Backlog with %s = %d, want %d", step, tc.name, got, tc.want)
			}
		}
	}
	adm := newAdmin(t, brokers)
	commit := func(partition int32, at int64) {
		t.Helper()
		var os kadm.Offsets
		os.AddOffset(topic, partition, at, -1)
		if err := adm.CommitAllOffsets(testenv.Context(t, 10*time.Second), group, os); err != nil {
			t.Fatalf("committing %d on partition %d: %v", at, partition, err)
		}
	}

	check("no commits", 16, 0)
	commit(0, 3)
	check("partition 0 committed at 3", 7+6, 7)
	var del kadm.Offsets
	del.AddOffset(topic, 0, 5, -1)
	resp, err := adm.DeleteRecords(testenv.Context(t, 10*time.Second), del)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("deleting records: %v", err)
	}
	check("partition 0 committed at 3, first offset 5", 5+6, 5)
	commit(1, 100)
	check("partition 1 committed past its end", 5, 5)
}

func TestPartitionLag(t *testing.T) {
	const first, last = kafkago.FirstOffset, kafkago.LastOffset
	cases := []struct {
		first, last, committed, start, want int64
	}{
		{0, 10, -1, first, 10},
		{0, 10, -1, last, 0},
		{4, 10, -1, first, 6},
		{0, 10, 3, first, 7},
		{0, 10, 3, last, 7},
		{5, 10, 3, first, 5},
		{5, 10, 3, last, 5},
		{0, 10, 10, first, 0},
		{0, 10, 12, first, 0},
		{0, 0, -1, first, 0},
		{7, 7, 2, last, 0},
	}
	for _, tc := range cases {
		if got := partitionLag(tc.first, tc.last, tc.committed, tc.start); got != tc.want {
			t.Errorf("partitionLag(first %d, last %d, committed %d, start %d) = %d, want %d",
				tc.first, tc.last, tc.committed, tc.start, got, tc.want)
		}
	}
}

// TestBacklogErrors checks that Backlog fails promptly, with an error that
// names the group and topic, when it cannot read the lag.
func TestBacklogErrors(t *testing.T) {
	const group, topic = "lag-group", "lag-topic"
	wantNamed := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("Backlog succeeded")
		}
		if !strings.Contains(err.Error(), `group "`+group+`"`) || !strings.Contains(err.Error(), `topic "`+topic+`"`) {
			t.Errorf("error %q does not name the group and topic", err)
		}
	}
	// call runs Backlog with a ctx of timeout, and fails when it takes
	// far longer than its bound.
	call := func(t *testing.T, c *Consumer, ctx context.Context, bound time.Duration) error {
		t.Helper()
		begin := time.Now()
		_, err := c.Backlog(ctx)
		if took := time.Since(begin); took > bound {
			t.Errorf("Backlog took %v to fail, want at most %v", took, bound)
		}
		return err
	}

	t.Run("broker refuses connections", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		c := newIdleConsumer(t, Config{Brokers: []string{addr}, Topic: topic, Group: group})
		for range 2 { // the second call reads the failure the client cached
			err := call(t, c, testenv.Context(t, 30*time.Second), 10*time.Second)
			wantNamed(t, err)
		}
	})

	t.Run("broker does not answer", func(t *testing.T) {
		addr := silentBroker(t)
		c := newIdleConsumer(t, Config{Brokers: []string{addr}, Topic: topic, Group: group})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err := call(t, c, ctx, 10*time.Second)
		wantNamed(t, err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Backlog = %v, want context.DeadlineExceeded", err)
		}
	})

	t.Run("context cancelled", func(t *testing.T) {
		addr := silentBroker(t)
		c := newIdleConsumer(t, Config{Brokers: []string{addr}, Topic: topic, Group: group})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := call(t, c, ctx, 5*time.Second)
		wantNamed(t, err)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Backlog = %v, want context.Canceled", err)
		}
	})

	t.Run("closed", func(t *testing.T) {
		c := newIdleConsumer(t, Config{Brokers: []string{"127.0.0.1:9"}, Topic: topic, Group: group})
		_ = c.Close()
		_, err := c.Backlog(context.Background())
		wantNamed(t, err)
		if !errors.Is(err, consumer.ErrStopped) {
			t.Errorf("Backlog after Close = %v, want consumer.ErrStopped", err)
		}
	})

	t.Run("unknown topic", func(t *testing.T) {
		cluster := newFakeCluster(t, "other")
		c := newIdleConsumer(t, Config{Brokers: cluster.ListenAddrs(), Topic: topic, Group: group})
		err := call(t, c, testenv.Context(t, 30*time.Second), 20*time.Second)
		wantNamed(t, err)
		if !errors.Is(err, kafkago.UnknownTopicOrPartition) {
			t.Errorf("Backlog = %v, want UnknownTopicOrPartition", err)
		}
	})

	delay := topic + ".delay"
	for _, tc := range []struct {
		name      string
		setAside  bool
		topic     string
		partition int32
		named     string
	}{
		{"partition error listing offsets", false, topic, 1, "partition 1"},
		{"partition error on the delay topic", true, delay, 2, `partition 2 of "` + delay + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topics := []string{topic}
			if tc.setAside {
				topics = append(topics, delay)
			}
			cluster := newFakeCluster(t, topics...)
			c := newIdleConsumer(t, Config{Brokers: cluster.ListenAddrs(), Topic: topic, Group: group, Options: consumer.Options{SetAside: tc.setAside}})
			backlog(t, c) // connected, so that the control sees only Backlog's requests
			refuseListOffsets(cluster, tc.topic, tc.partition)
			err := call(t, c, testenv.Context(t, 30*time.Second), 20*time.Second)
			wantNamed(t, err)
			if !errors.Is(err, kafkago.NotLeaderForPartition) || !strings.Contains(err.Error(), tc.named) {
				t.Errorf("Backlog = %v, want NotLeaderForPartition naming %s", err, tc.named)
			}
			if got := backlog(t, c); got != 0 {
				t.Errorf("Backlog once the error is gone = %d, want 0", got)
			}
		})
	}

	t.Run("partition error fetching committed offsets", func(t *testing.T) {
		cluster := newFakeCluster(t, topic)
		c := newIdleConsumer(t, Config{Brokers: cluster.ListenAddrs(), Topic: topic, Group: group})
		backlog(t, c)
		cluster.ControlKey(int16(kmsg.OffsetFetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
			r := req.(*kmsg.OffsetFetchRequest)
			resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
			for _, t := range r.Topics {
				rt := kmsg.NewOffsetFetchResponseTopic()
				rt.Topic = t.Topic
				for _, p := range t.Partitions {
					rp := kmsg.NewOffsetFetchResponseTopicPartition()
					rp.Partition = p
					rp.Offset = -1
					if p == 2 {
						rp.ErrorCode = int16(kafkago.UnstableOffsetCommit)
					}
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, nil, true
		})
		err := call(t, c, testenv.Context(t, 30*time.Second), 20*time.Second)
		wantNamed(t, err)
		if !errors.Is(err, kafkago.UnstableOffsetCommit) || !strings.Contains(err.Error(), "partition 2") {
			t.Errorf("Backlog = %v, want UnstableOffsetCommit naming partition 2", err)
		}
		if got := backlog(t, c); got != 0 {
			t.Errorf("Backlog once the error is gone = %d, want 0", got)
		}
	})
}

// refuseListOffsets makes cluster answer NOT_LEADER_FOR_PARTITION to the
// next ListOffsets request for partition of topic alone, as Backlog sends
// them (kafka-go splits its request by partition).
func refuseListOffsets(cluster *kfake.Cluster, topic string, partition int32) {
	cluster.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.ListOffsetsRequest)
		if len(r.Topics) != 1 || r.Topics[0].Topic != topic || len(r.Topics[0].Partitions) != 1 || r.Topics[0].Partitions[0].Partition != partition {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = topic
		rp := kmsg.NewListOffsetsResponseTopicPartition()
		rp.Partition = partition
		rp.ErrorCode = int16(kafkago.NotLeaderForPartition)
		rp.Offset = -1
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
}

// newFakeCluster starts a kfake cluster with topics of 3 partitions, for
// tests that inject broker errors, closed when the test ends.
func newFakeCluster(t *testing.T, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topics...))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// silentBroker returns the address of a listener that accepts connections
// and never answers, closing them when the test ends.
func silentBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
