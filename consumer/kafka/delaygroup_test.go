package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestSetAsideLastOffsetRestart runs a group with StartOffset LastOffset
// that has consumed the topic before (its offset 0 is committed): a
// first consumer sets aside 3 of 4 messages for a minute (MaxSetAside)
// and stops before they are due, so the delay partition has no committed
// offset. A second consumer of the group, whose clock is 2 minutes ahead,
// must read the delay partition from its first offset, not from its end
// as StartOffset says for the topic, and deliver the 3 copies.
func TestSetAsideLastOffsetRestart(t *testing.T) {
	const n = 4
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	cluster := newDelayCluster(t, 1, topic)
	brokers := cluster.ListenAddrs()
	var start kadm.Offsets
	start.AddOffset(topic, 0, 0, -1)
	if err := newAdmin(t, brokers).CommitAllOffsets(testenv.Context(t, 10*time.Second), group, start); err != nil {
		t.Fatalf("committing offset 0: %v", err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(strconv.Itoa(i))}
	}
	produce(t, brokers, recs...)

	rec := newRecorder()
	newReplica := func(lim consumer.Limiter) *Consumer {
		c, err := New(Config{
			Brokers: brokers, Topic: topic, Group: group, StartOffset: kafkago.LastOffset,
			Options:         consumer.Options{SetAside: true, Limiter: lim, Observer: rec.observer(), Logger: testLogger(t)},
			ConfigureReader: fastGroup,
		}, rec.handle)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// One message of the key an hour: the others are set aside for
	// MaxSetAside, a minute.
	stop1 := runConsumer(t, newReplica(newKeySpacing(time.Hour)))
	waitFor(t, "one message delivered and the others set aside", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.count) == 1 && len(rec.stays) == n-1
	})
	if err := stop1(); err != nil {
		t.Fatalf("Run of the first consumer: %v", err)
	}
	if got := committed(t, brokers, group, topic); got[0] != n {
		t.Fatalf("topic committed %v, want %d: the originals set aside are committed", got, n)
	}
	if got := committed(t, brokers, group, topic+".delay"); len(got) != 0 {
		t.Fatalf("delay topic committed %v, want nothing: no copy was due", got)
	}

	c2 := newReplica(newKeySpacing(0))
	c2.clock = newFakeClock(time.Now().Add(2 * time.Minute)) // the copies are due
	stop2 := runConsumer(t, c2)
	rec.waitDistinct(t, n)
	waitFor(t, "the delay topic committed to its end", func() bool {
		return committed(t, brokers, group, topic+".delay")[0] == n-1
	})
	if err := stop2(); err != nil {
		t.Fatalf("Run of the second consumer: %v", err)
	}
	rec.checkOnce(t, "")
}

// TestSetAsideTwoGroups runs two groups, A and B, on one topic, each with
// its own limit of one message per key every 150 ms that sets the others
// aside in the shared default delay topic: each group delivers every
// message exactly once, never handles a copy the other group set aside,
// and counts those it skipped (ReaderStats.SkippedOtherGroup). A copy
// without HeaderGroup, as an older version wrote, is handled by both.
func TestSetAsideTwoGroups(t *testing.T) {
	const (
		keys   = 2
		perKey = 4
		n      = keys * perKey
	)
	topic := testenv.Name(t, "t")
	cluster := newDelayCluster(t, 1, topic)
	brokers := cluster.ListenAddrs()
	ctx := testenv.Context(t, 10*time.Second)
	if _, err := newAdmin(t, brokers).CreateTopic(ctx, 1, -1, nil, topic+".delay"); err != nil {
		t.Fatalf("creating the delay topic: %v", err)
	}
	legacy := &kgo.Record{Topic: topic + ".delay", Key: []byte("legacy"), Value: []byte("legacy"), Headers: []kgo.RecordHeader{
		{Key: consumer.HeaderDue, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		{Key: HeaderOriginalTopic, Value: []byte(topic)},
		{Key: HeaderOriginalPartition, Value: []byte("0")},
		{Key: HeaderOriginalOffset, Value: []byte("0")},
	}}
	recs := []*kgo.Record{legacy}
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%keys)), Value: []byte(strconv.Itoa(i))})
	}
	produce(t, brokers, recs...)

	type groupRun struct {
		name    string
		c       *Consumer
		rec     *recorder
		foreign []string // bodies of copies handled that another group set aside; under rec.mu
		stop    func() error
	}
	runs := []*groupRun{{name: testenv.Name(t, "a")}, {name: testenv.Name(t, "b")}}
	for _, g := range runs {
		g.rec = newRecorder()
		g.rec.also = func(m consumer.Message) {
			if by, ok := m.Headers[HeaderGroup]; ok && by != g.name {
				g.foreign = append(g.foreign, string(m.Body))
			}
		}
		c, err := New(Config{
			Brokers: brokers, Topic: topic, Group: g.name,
			Options:         consumer.Options{SetAside: true, Limiter: newKeySpacing(150 * time.Millisecond), Observer: g.rec.observer(), Logger: testLogger(t)},
			ConfigureReader: fastGroup,
		}, g.rec.handle)
		if err != nil {
			t.Fatal(err)
		}
		g.c = c
	}
	for _, g := range runs {
		g.stop = runConsumer(t, g.c)
	}
	// Each group has delivered every message and committed both topics to
	// their ends, so it has read every copy of either group.
	for _, g := range runs {
		g.rec.waitDistinct(t, n+1)
	}
	for _, g := range runs {
		// Not fatal: the checks below tell why, such as copies that go
		// back and forth between the groups.
		if !within(10*time.Second, func() bool {
			return equalOffsets(committed(t, brokers, g.name, topic), endOffsets(t, brokers, topic)) &&
				equalOffsets(committed(t, brokers, g.name, topic+".delay"), endOffsets(t, brokers, topic+".delay"))
		}) {
			t.Errorf("group %s did not commit both topics to their ends within 10s: delay topic committed %v, ends %v",
				g.name, committed(t, brokers, g.name, topic+".delay"), endOffsets(t, brokers, topic+".delay"))
		}
	}
	for _, g := range runs {
		if err := g.stop(); err != nil {
			t.Fatalf("Run of group %s: %v", g.name, err)
		}
	}
	for i, g := range runs {
		g.rec.checkOnce(t, "group "+g.name+": ")
		other := runs[1-i]
		g.rec.mu.Lock()
		other.rec.mu.Lock()
		setAside, otherSetAside := len(g.rec.stays), len(other.rec.stays)
		t.Logf("group %s: %d set aside, %d copies of the other group skipped; deliveries %v",
			g.name, setAside, g.c.ReaderStats().SkippedOtherGroup, g.rec.count)
		if len(g.foreign) > 0 {
			t.Errorf("group %s handled copies the other group set aside: %v", g.name, g.foreign)
		}
		other.rec.mu.Unlock()
		g.rec.mu.Unlock()
		if setAside == 0 {
			t.Errorf("group %s set nothing aside", g.name)
		}
		if got, want := g.c.ReaderStats().SkippedOtherGroup, int64(otherSetAside); got != want {
			t.Errorf("group %s skipped %d copies of the other group, want the %d it set aside", g.name, got, want)
		}
	}
}

// TestDelaySkipsOtherGroup feeds two delay partitions copies set aside by
// this group ("g"), by another group, and without HeaderGroup (an older
// version): the other group's copies are committed past at once, not
// waited for though their due time is an hour ahead, and not handled; the
// others are handled. Each skipped copy is logged at debug level and the
// first of each partition at info level, and ReaderStats counts them.
func TestDelaySkipsOtherGroup(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	by := func(g string) kafkago.Header { return kafkago.Header{Key: HeaderGroup, Value: []byte(g)} }
	var mu sync.Mutex
	var handled []string
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, fmt.Sprintf("%d/%d", m.Source.Partition, m.Source.Offset))
		return nil
	}
	logs := &testenv.Buffer{}
	c := newTestConsumer(t, Config{Options: consumer.Options{
		SetAside: true, Concurrency: 2,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}}, h)
	c.clock = newFakeClock(t0)
	f := newFakeGroup(map[int]partitionReader{})
	f.delayReaders = map[int]partitionReader{
		0: newFakeReader(
			delayMsg(0, 0, t0.Add(time.Hour), by("other")),
			delayMsg(0, 1, t0, by("g")),
			delayMsg(0, 2, t0.Add(time.Hour), by("other")),
			delayMsg(0, 3, t0),
			delayMsg(0, 4, t0, by("g"), by("other")), // the last header counts
		),
		1: newFakeReader(delayMsg(1, 0, t0.Add(time.Hour), by("other"))),
	}
	f.delayWriter = &fakeWriter{}
	rg := startGeneration(t, c, f, &fakeWriter{})
	waitFor(t, "both delay partitions committed to their ends", func() bool {
		got := f.delayCommitted()
		return got[0] == 5 && got[1] == 1
	})
	rg.finish(t, true)
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(handled)
	if want := []string{"0/1", "0/3"}; !slices.Equal(handled, want) {
		t.Errorf("handled %v, want %v", handled, want)
	}
	if got := c.ReaderStats().SkippedOtherGroup; got != 4 {
		t.Errorf("ReaderStats.SkippedOtherGroup = %d, want 4", got)
	}
	out := logs.String()
	if n := strings.Count(out, "level=INFO msg=\"skipping the copies another consumer group"); n != 2 {
		t.Errorf("%d info lines about another group's copies, want 2 (one per partition):\n%s", n, out)
	}
	if n := strings.Count(out, "level=DEBUG msg=\"delay copy of another consumer group skipped\""); n != 4 {
		t.Errorf("%d debug lines about a skipped copy, want 4:\n%s", n, out)
	}
}
