package kafka

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// queuedStore is a DedupeStore with the queued operations of
// redisdedupe.Store (ClaimLater, MarkSentLater, ReleaseLater, Flush), in
// memory and without TTLs: claims and releases are decided at once; marks
// wait in a queue while holdMarks is set, until runMarks.
type queuedStore struct {
	mu        sync.Mutex
	claims    map[string]string // key: the token holding its claim
	sent      map[string]bool
	holdMarks bool
	marks     []func()
	direct    int // Claim calls (not ahead)
}

func newQueuedStore() *queuedStore {
	return &queuedStore{claims: map[string]string{}, sent: map[string]bool{}}
}

func (s *queuedStore) try(key, token string) consumer.DedupeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch h, held := s.claims[key]; {
	case s.sent[key]:
		return consumer.DedupeSent
	case !held || h == token:
		s.claims[key] = token
		return consumer.DedupeClaimed
	}
	return 0
}

func (s *queuedStore) Claim(ctx context.Context, key, token string, _ time.Duration) (consumer.DedupeState, error) {
	s.mu.Lock()
	s.direct++
	s.mu.Unlock()
	for {
		if st := s.try(key, token); st != 0 {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func (s *queuedStore) mark(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.claims, key)
	s.sent[key] = true
}

func (s *queuedStore) MarkSent(_ context.Context, key, _ string, _ time.Duration) error {
	s.mark(key)
	return nil
}

func (s *queuedStore) Release(_ context.Context, key, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claims[key] == token {
		delete(s.claims, key)
	}
	return nil
}

func (s *queuedStore) ClaimLater(key, token string, _ time.Duration, done func(consumer.DedupeState, error)) {
	done(s.try(key, token), nil)
}

func (s *queuedStore) MarkSentLater(key, _ string, _ time.Duration, done func(error)) {
	run := func() {
		s.mark(key)
		done(nil)
	}
	s.mu.Lock()
	if s.holdMarks {
		s.marks = append(s.marks, run)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	run()
}

func (s *queuedStore) ReleaseLater(key, token string, done func(error)) {
	done(s.Release(context.Background(), key, token))
}

func (s *queuedStore) Flush() {}

// runMarks runs the marks held, and the later ones at once.
func (s *queuedStore) runMarks() {
	s.mu.Lock()
	marks := s.marks
	s.marks, s.holdMarks = nil, false
	s.mu.Unlock()
	for _, run := range marks {
		run()
	}
}

func (s *queuedStore) state() (claims, sent, direct int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.claims), len(s.sent), s.direct
}

func dedupeRecord(topic string, partition int32, id string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: partition, Value: []byte(id)}
	if id != "" {
		r.Headers = []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}
	}
	return r
}

// TestDedupeMarkBeforeCommit: with Options.Dedupe on a store that queues
// its operations, and a worker per partition, each message is claimed
// ahead as it is fetched (no claim call at its turn), and its offset is
// committed only once its mark is written, while the worker goes on: three
// messages sent with their marks held stay uncommitted, though a later
// message of another partition (without a key, nothing to mark) is
// committed; once the marks run, the three are committed.
func TestDedupeMarkBeforeCommit(t *testing.T) {
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, 2, topic)
	store := newQueuedStore()
	store.holdMarks = true
	sent := make(chan string, 10)
	c, err := New(Config{
		Options: consumer.Options{Logger: testLogger(t), Concurrency: 2, Dedupe: &consumer.Dedupe{
			Store: store,
			Key:   func(m consumer.Message) (string, error) { return m.Headers["message-id"], nil },
		}},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}, func(_ context.Context, m consumer.Message) error {
		sent <- string(m.Body)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, dedupeRecord(topic, 0, "a"), dedupeRecord(topic, 0, "b"), dedupeRecord(topic, 0, "c"))
	stop := runConsumer(t, c)
	defer stop()
	defer store.runMarks() // the drain waits for them
	recv := func() string {
		t.Helper()
		select {
		case b := <-sent:
			return b
		case <-time.After(20 * time.Second):
			t.Fatal("no message sent")
		}
		return ""
	}
	for range 3 {
		recv()
	}
	produce(t, brokers, dedupeRecord(topic, 1, ""))
	if b := recv(); b != "" {
		t.Fatalf("sent %q, want the message without a key", b)
	}
	waitFor(t, "partition 1 committed", func() bool { return committed(t, brokers, group, topic)[1] == 1 })
	if off, ok := committed(t, brokers, group, topic)[0]; ok {
		t.Fatalf("partition 0 committed at %d before its marks were written", off)
	}
	if _, _, direct := store.state(); direct != 0 {
		t.Fatalf("%d claims at the messages' turn, want 0 (each claimed ahead)", direct)
	}
	store.runMarks()
	waitFor(t, "partition 0 committed after the marks", func() bool { return committed(t, brokers, group, topic)[0] == 3 })
	if claims, marked, _ := store.state(); claims != 0 || marked != 3 {
		t.Fatalf("%d claims left, %d keys marked; want 0 and 3", claims, marked)
	}
}

// TestDedupeDroppedReleasesAhead: the messages fetched and claimed ahead
// but not started when the consumer stops give their claims back, so that
// the next owner sends them at once instead of after the claims' TTL.
func TestDedupeDroppedReleasesAhead(t *testing.T) {
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, 1, topic)
	store := newQueuedStore()
	started := make(chan struct{})
	var once sync.Once
	c, err := New(Config{
		Options: consumer.Options{Logger: testLogger(t), Dedupe: &consumer.Dedupe{
			Store: store,
			Key:   func(m consumer.Message) (string, error) { return m.Headers["message-id"], nil },
		}},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}, func(_ context.Context, m consumer.Message) error {
		once.Do(func() { close(started) })
		// The first message is sent while the consumer stops (as in
		// TestGracefulShutdown); the queued ones are not started.
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	produce(t, brokers, dedupeRecord(topic, 0, "a"), dedupeRecord(topic, 0, "b"), dedupeRecord(topic, 0, "c"))
	stop := runConsumer(t, c)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler was not called")
	}
	waitFor(t, "the queued messages claimed ahead", func() bool { claims, _, _ := store.state(); return claims == 3 })
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if claims, marked, _ := store.state(); claims != 0 || marked != 1 {
		t.Fatalf("after the stop: %d claims left, %d keys marked; want 0 (the dropped released theirs) and 1", claims, marked)
	}
	if got := committed(t, brokers, group, topic)[0]; got != 1 {
		t.Fatalf("committed %d, want 1", got)
	}
}

// TestAheadSafe: claims are made ahead only where every lane's next
// message always gets a worker.
func TestAheadSafe(t *testing.T) {
	cases := []struct {
		ordering                   consumer.Ordering
		workers, queue, partitions int
		classes                    bool
		want                       bool
	}{
		{consumer.OrderPartition, 16, 32, 16, false, true},
		{consumer.OrderPartition, 1, 32, 2, false, false}, // the default concurrency, two partitions
		{consumer.OrderPartition, 1, 32, 1, false, true},
		{consumer.OrderPartition, 16, 32, 16, true, false},
		{consumer.OrderKey, 1000, 32, 1, false, false},
		{consumer.OrderKey, 1000, 0, 1, false, true},
		{consumer.OrderNone, 10, 0, 4, false, true},
	}
	for _, tc := range cases {
		if got := aheadSafe(tc.ordering, tc.workers, tc.queue, tc.partitions, tc.classes); got != tc.want {
			t.Errorf("aheadSafe(%v, %d workers, queue %d, %d partitions, classes %v) = %v, want %v",
				tc.ordering, tc.workers, tc.queue, tc.partitions, tc.classes, got, tc.want)
		}
	}
}
