package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// fakeReader serves queued messages of one partition.
type fakeReader struct {
	msgs chan kafkago.Message
}

func newFakeReader(msgs ...kafkago.Message) *fakeReader {
	r := &fakeReader{msgs: make(chan kafkago.Message, len(msgs)+100)}
	for _, m := range msgs {
		r.msgs <- m
	}
	return r
}

func (r *fakeReader) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	select {
	case m := <-r.msgs:
		return m, nil
	case <-ctx.Done():
		return kafkago.Message{}, ctx.Err()
	}
}

// erringReader returns errs, one per call, then blocks.
type erringReader struct {
	errs  []error
	calls atomic.Int32
}

func (r *erringReader) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	n := int(r.calls.Add(1))
	if n <= len(r.errs) {
		return kafkago.Message{}, r.errs[n-1]
	}
	<-ctx.Done()
	return kafkago.Message{}, ctx.Err()
}

// fakeGroup is one generation's partitions and the offsets committed in it.
// Commits fail while failCommits > 0.
type fakeGroup struct {
	readers map[int]partitionReader
	// skips is what the generation reads from the previous commit's
	// metadata.
	skips map[int]finishedSet
	// delayReaders are the generation's partitions of the delay topic
	// "t.delay", and delayWriter, when set, the delay topic's writer (the
	// consumer then sets aside).
	delayReaders map[int]partitionReader
	delayWriter  messageWriter
	// delaySkips is what the generation reads from the previous commit's
	// metadata for the delay topic.
	delaySkips map[int]finishedSet

	mu           sync.Mutex
	commits      map[int]int64  // partition -> next offset
	meta         map[int]string // partition -> metadata committed with it
	delayCommits map[int]int64  // partition of the delay topic -> next offset
	delayMeta    map[int]string // partition of the delay topic -> metadata committed with it
	calls        int
	failCommits  int
}

func newFakeGroup(readers map[int]partitionReader) *fakeGroup {
	return &fakeGroup{readers: readers, commits: map[int]int64{}, meta: map[int]string{}, delayCommits: map[int]int64{}, delayMeta: map[int]string{}}
}

func (f *fakeGroup) commit(offsets map[topicPartition]int64, metadata map[topicPartition]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failCommits > 0 {
		f.failCommits--
		return kafkago.NotCoordinatorForGroup
	}
	for tp, o := range offsets {
		commits := f.commits
		if tp.topic == "t.delay" {
			commits = f.delayCommits
		}
		p := tp.partition
		if o < commits[p] {
			return fmt.Errorf("commit of %s partition %d moved back from %d to %d", tp.topic, p, commits[p], o)
		}
		commits[p] = o
		if tp.topic == "t" {
			f.meta[p] = metadata[tp]
		} else {
			f.delayMeta[p] = metadata[tp]
		}
	}
	return nil
}

func (f *fakeGroup) committed() map[int]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.commits)
}

func (f *fakeGroup) delayCommitted() map[int]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.delayCommits)
}

// runningGeneration is a generation that runGeneration runs.
type runningGeneration struct {
	g      *generation
	end    context.CancelFunc // ends the generation, as a rebalance does
	stop   func()             // ends it as Run's context does
	done   chan struct{}      // closed when runGeneration returned
	closed atomic.Int32       // readers closed
}

// startGeneration runs a generation of c over f's partitions, each from
// offset 0, writing dead letters to w.
func startGeneration(t *testing.T, c *Consumer, f *fakeGroup, w messageWriter) *runningGeneration {
	t.Helper()
	gctx, end := context.WithCancel(context.Background())
	shutdown := make(chan struct{})
	rg := &runningGeneration{end: end, done: make(chan struct{})}
	var once sync.Once
	rg.stop = func() { once.Do(func() { close(shutdown) }) }
	skips := map[topicPartition]finishedSet{}
	for p, s := range f.skips {
		skips[topicPartition{"t", p}] = s
	}
	for p, s := range f.delaySkips {
		skips[topicPartition{"t.delay", p}] = s
	}
	rg.g = &generation{
		id:       1,
		commit:   f.commit,
		skips:    skips,
		shutdown: shutdown,
		drained:  make(chan struct{}),
		open: func(tp topicPartition, _ int64) (partitionReader, func()) {
			if tp.topic == "t.delay" {
				return f.delayReaders[tp.partition], func() { rg.closed.Add(1) }
			}
			return f.readers[tp.partition], func() { rg.closed.Add(1) }
		},
	}
	for p := range len(f.readers) {
		rg.g.partitions = append(rg.g.partitions, assignment{topicPartition{"t", p}, kafkago.FirstOffset})
	}
	for p := range len(f.delayReaders) {
		rg.g.partitions = append(rg.g.partitions, assignment{topicPartition{"t.delay", p}, kafkago.FirstOffset})
	}
	dl := &deadLetterer{w: w, topic: "t.dlq", log: discardLogger()}
	var delay *deadLetterer
	if f.delayWriter != nil {
		delay = &deadLetterer{w: f.delayWriter, topic: "t.delay", log: discardLogger(), delay: true}
	}
	go func() {
		defer close(rg.done)
		c.runGeneration(gctx, rg.g, dl, delay)
	}()
	t.Cleanup(func() {
		end()
		<-rg.done
	})
	return rg
}

// finish ends the generation as a rebalance (or, with shutdown, as Run's
// context) does and waits until runGeneration drained and returned.
func (rg *runningGeneration) finish(t *testing.T, shutdown bool) {
	t.Helper()
	if shutdown {
		rg.stop()
		select {
		case <-rg.g.drained:
		case <-time.After(10 * time.Second):
			t.Fatal("the generation did not drain")
		}
		select {
		case <-rg.done:
			t.Fatal("runGeneration returned while the generation was live")
		default:
		}
	}
	rg.end()
	select {
	case <-rg.done:
	case <-time.After(10 * time.Second):
		t.Fatal("runGeneration did not return")
	}
}

// waitFor waits up to 10 s for what: testenv.Eventually.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}

// within reports whether cond held within d: testenv.Within.
func within(d time.Duration, cond func() bool) bool { return testenv.Within(d, cond) }

func newTestConsumer(t *testing.T, cfg Config, h consumer.Handler) *Consumer {
	t.Helper()
	cfg.Brokers, cfg.Topic, cfg.Group = []string{"127.0.0.1:1"}, "t", "g"
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	if cfg.CommitTimeout == 0 {
		cfg.CommitTimeout = time.Second
	}
	c, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGenerationCommits drives a generation with fake readers and a fake
// writer, so the commit rules are checked without a broker, for every
// ordering and for both ways a generation ends.
func TestGenerationCommits(t *testing.T) {
	t.Parallel()
	type result struct {
		committed  map[int]int64
		deadLetter int
	}
	cases := []struct {
		name string
		// handler for message (partition, offset); block means: wait for
		// ctx (it never finishes before the drain deadline).
		handler     func(p int, o int64) (err error, block bool)
		writerFails int // -1: always
		commitFails int
		want        result
	}{
		{
			name:    "all delivered",
			handler: func(int, int64) (error, bool) { return nil, false },
			want:    result{committed: map[int]int64{0: 3, 1: 3}},
		},
		{
			name:        "commit failures are retried",
			handler:     func(int, int64) (error, bool) { return nil, false },
			commitFails: 3,
			want:        result{committed: map[int]int64{0: 3, 1: 3}},
		},
		{
			name: "never past an unfinished message of the partition",
			handler: func(p int, o int64) (error, bool) {
				return nil, p == 0 && o == 1
			},
			want: result{committed: map[int]int64{0: 1, 1: 3}},
		},
		{
			name: "dead-lettered after the write succeeds",
			handler: func(p int, o int64) (error, bool) {
				if o == 1 {
					return consumer.Permanent(errors.New("bad payload")), false
				}
				return nil, false
			},
			writerFails: 2,
			want:        result{committed: map[int]int64{0: 3, 1: 3}, deadLetter: 2},
		},
		{
			name: "not committed while the dead-letter write fails",
			handler: func(p int, o int64) (error, bool) {
				if p == 0 && o == 1 {
					return consumer.Permanent(errors.New("bad payload")), false
				}
				return nil, false
			},
			writerFails: -1,
			want:        result{committed: map[int]int64{0: 1, 1: 3}},
		},
	}
	for _, ordering := range []consumer.Ordering{consumer.OrderPartition, consumer.OrderKey, consumer.OrderNone} {
		for _, shutdown := range []bool{false, true} {
			for _, tc := range cases {
				want := tc.want
				name := fmt.Sprintf("%s/shutdown=%v/%s", ordering, shutdown, tc.name)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					var handled atomic.Int32
					h := func(ctx context.Context, m consumer.Message) error {
						err, block := tc.handler(m.Source.Partition, m.Source.Offset)
						handled.Add(1)
						if block {
							<-ctx.Done()
							return ctx.Err()
						}
						return err
					}
					c := newTestConsumer(t, Config{
						Options: consumer.Options{Concurrency: 2, Ordering: ordering, Retry: consumer.RetryPolicy{MaxAttempts: 1}, DrainTimeout: 300 * time.Millisecond},
					}, h)
					// Distinct keys, so OrderingKey runs them concurrently.
					p0, p1 := msgs(0, 0, 1, 2), msgs(1, 0, 1, 2)
					for i := range p0 {
						p0[i].Key = []byte{byte(i)}
						p1[i].Key = []byte{byte(i)}
					}
					f := newFakeGroup(map[int]partitionReader{0: newFakeReader(p0...), 1: newFakeReader(p1...)})
					f.failCommits = tc.commitFails
					w := &fakeWriter{fail: tc.writerFails}
					rg := startGeneration(t, c, f, w)
					wantHandled := int32(6)
					if ordering == consumer.OrderPartition && want.committed[0] == 1 {
						wantHandled = 5 // offset 2 waits behind the stuck offset 1
					}
					waitFor(t, "handlers called", func() bool { return handled.Load() >= wantHandled })
					waitFor(t, "commits", func() bool { return maps.Equal(f.committed(), want.committed) })
					rg.finish(t, shutdown)
					w.mu.Lock()
					got := result{committed: f.committed(), deadLetter: len(w.writes)}
					w.mu.Unlock()
					if !maps.Equal(got.committed, want.committed) || got.deadLetter != want.deadLetter {
						t.Fatalf("got %+v, want %+v", got, want)
					}
					if n := rg.closed.Load(); n != 2 {
						t.Fatalf("%d readers closed, want 2", n)
					}
				})
			}
		}
	}
}

// TestStuckPartitionLeavesOthersTheWindow: under OrderPartition, while
// one partition's message is stuck in its handler, that partition's
// fetcher may not fill the window of fetched messages (Concurrency +
// QueueSize) with messages that cannot start: the other partition's
// messages go on being fetched and handled. Then the stuck one finishes,
// and both partitions are committed to their ends.
func TestStuckPartitionLeavesOthersTheWindow(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var handled [2]atomic.Int32
	c := newTestConsumer(t, Config{
		Options: consumer.Options{Concurrency: 2, Retry: consumer.RetryPolicy{MaxAttempts: 1}, DrainTimeout: time.Second},
		// A window of 4: partition 0 may hold 2 (its share), so that
		// partition 1 always has room.
		QueueSize: 2,
	}, func(ctx context.Context, m consumer.Message) error {
		if m.Source.Partition == 0 && m.Source.Offset == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		handled[m.Source.Partition].Add(1)
		return nil
	})
	offsets := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(i)
		}
		return out
	}
	f := newFakeGroup(map[int]partitionReader{0: newFakeReader(msgs(0, offsets(20)...)...), 1: newFakeReader(msgs(1, offsets(50)...)...)})
	rg := startGeneration(t, c, f, &fakeWriter{})
	waitFor(t, "partition 1 handled while partition 0 is stuck", func() bool { return handled[1].Load() == 50 })
	if n := handled[0].Load(); n != 0 {
		t.Fatalf("partition 0 handled %d messages past its stuck first one", n)
	}
	close(release)
	want := map[int]int64{0: 20, 1: 50}
	waitFor(t, "both partitions committed", func() bool { return maps.Equal(f.committed(), want) })
	rg.finish(t, true)
}

// TestFetchStopsOnFatalError: a fetch error that retrying cannot fix stops
// Run with that error; a transient one is retried.
func TestFetchStopsOnFatalError(t *testing.T) {
	c := newTestConsumer(t, Config{}, func(context.Context, consumer.Message) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.cancel = cancel
	r := &erringReader{errs: []error{kafkago.NotCoordinatorForGroup, kafkago.GroupAuthorizationFailed}}
	f := newFakeGroup(map[int]partitionReader{0: r})
	startGeneration(t, c, f, &fakeWriter{})
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Run was not stopped")
	}
	c.mu.Lock()
	fatal := c.fatal
	c.mu.Unlock()
	if !errors.Is(fatal, kafkago.GroupAuthorizationFailed) || !errors.Is(fatal, consumer.ErrAccessRefused) {
		t.Fatalf("fatal = %v, want the authorization error, as consumer.ErrAccessRefused", fatal)
	}
	if n := r.calls.Load(); n != 2 {
		t.Fatalf("FetchMessage calls = %d, want 2 (the transient error is retried)", n)
	}
}

// revokeWatcher closes revoked when a fetch ends with its context, as at
// a revocation.
type revokeWatcher struct {
	r       partitionReader
	revoked chan struct{}
	once    sync.Once
}

func (w *revokeWatcher) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	m, err := w.r.FetchMessage(ctx)
	if err != nil && ctx.Err() != nil {
		w.once.Do(func() { close(w.revoked) })
	}
	return m, err
}

// blockingLimiter grants the first free waits at once and blocks the
// others until their context ends, counting those: a cancelled wait is
// where a real bucket gives the reserved tokens back.
type blockingLimiter struct {
	free      atomic.Int32
	waiting   atomic.Int32
	cancelled atomic.Int32
}

func (l *blockingLimiter) Wait(ctx context.Context, cost int) error {
	if l.free.Add(-1) >= 0 {
		return nil
	}
	l.waiting.Add(1)
	<-ctx.Done()
	l.waiting.Add(-1)
	l.cancelled.Add(1)
	return ctx.Err()
}

// TestRevocation ends a generation while one message is in its handler,
// some wait for tokens and others are queued: the queued and waiting ones
// are dropped and their waits cancelled, the handler in flight finishes
// within the drain timeout, and what finished is committed before
// runGeneration returns.
func TestRevocation(t *testing.T) {
	for _, ordering := range []consumer.Ordering{consumer.OrderPartition, consumer.OrderNone} {
		t.Run(string(ordering), func(t *testing.T) {
			lim := &blockingLimiter{}
			lim.free.Store(2) // two messages pass; the rest wait
			release := make(chan struct{})
			var (
				mu      sync.Mutex
				started []int64
			)
			maxInFlight := 3 // ordering none; partition has one worker
			if ordering == consumer.OrderPartition {
				maxInFlight = 0
			}
			c := newTestConsumer(t, Config{
				Options: consumer.Options{Concurrency: maxInFlight, Ordering: ordering, Limiter: lim,
					Retry: consumer.RetryPolicy{MaxAttempts: 1}, DrainTimeout: 10 * time.Second},
				// Room for all ten messages, so the fetcher waits in
				// FetchMessage when the revocation comes.
				QueueSize: 20,
			}, func(ctx context.Context, m consumer.Message) error {
				mu.Lock()
				started = append(started, m.Source.Offset)
				second := len(started) == 2
				mu.Unlock()
				if second { // held until the revocation began
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			})
			rd := &revokeWatcher{r: newFakeReader(msgs(0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)...), revoked: make(chan struct{})}
			f := newFakeGroup(map[int]partitionReader{0: rd})
			rg := startGeneration(t, c, f, &fakeWriter{})
			wantWaiting := int32(0)
			if ordering == consumer.OrderNone {
				wantWaiting = 2 // three workers: one done, one held, two wait
			}
			calls := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(started)
			}
			waitFor(t, "one message held, all fetched", func() bool {
				return calls() == 2 && lim.waiting.Load() == wantWaiting && len(rd.r.(*fakeReader).msgs) == 0
			})
			if got := c.ReaderStats().PartitionsAssigned; got != 1 {
				t.Fatalf("PartitionsAssigned = %d, want 1", got)
			}
			rg.end()
			// The revocation cancels the waits; the handler in flight
			// finishes afterwards, within the drain timeout.
			<-rd.revoked
			waitFor(t, "waits cancelled", func() bool { return lim.cancelled.Load() == wantWaiting })
			close(release)
			rg.finish(t, false)

			mu.Lock()
			done := map[int64]bool{}
			for _, o := range started {
				done[o] = true
			}
			mu.Unlock()
			var want int64 // the end of the finished prefix
			for done[want] {
				want++
			}
			if got := f.committed()[0]; got != want {
				t.Errorf("committed offset %d, want %d (started %v): the held handler finished within the drain timeout", got, want, started)
			}
			if n := calls(); n != 2 {
				t.Errorf("handler called %d times, want 2: nothing starts after the revocation", n)
			}
			if n := lim.cancelled.Load(); n != wantWaiting {
				t.Errorf("%d limiter waits cancelled, want %d", n, wantWaiting)
			}
			st := c.ReaderStats()
			if st.DroppedAtRevocation != 8 {
				t.Errorf("DroppedAtRevocation = %d, want 8: every message fetched and not started", st.DroppedAtRevocation)
			}
			if st.PartitionsAssigned != 0 {
				t.Errorf("PartitionsAssigned = %d after the revocation, want 0", st.PartitionsAssigned)
			}
		})
	}
}

// TestGenerationSkipsFinished: with OrderKey, a revocation that leaves an
// early message unfinished while later ones finished commits the early
// offset with the later ones listed in the metadata; the next generation
// handles only the unfinished message.
func TestGenerationSkipsFinished(t *testing.T) {
	var (
		mu      sync.Mutex
		handled []int64
		second  atomic.Bool // the next generation runs
	)
	c := newTestConsumer(t, Config{
		Options: consumer.Options{Ordering: consumer.OrderKey, DrainTimeout: 200 * time.Millisecond,
			Retry: consumer.RetryPolicy{MaxAttempts: 1}},
	}, func(ctx context.Context, m consumer.Message) error {
		mu.Lock()
		handled = append(handled, m.Source.Offset)
		mu.Unlock()
		if !second.Load() && m.Source.Offset == 1 {
			<-ctx.Done() // abandoned at the drain deadline
			return ctx.Err()
		}
		return nil
	})
	all := msgs(0, 0, 1, 2, 3, 4, 5)
	for i := range all {
		all[i].Key = []byte{byte(i)}
	}
	f := newFakeGroup(map[int]partitionReader{0: newFakeReader(all...)})
	rg := startGeneration(t, c, f, &fakeWriter{})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	}
	waitFor(t, "all six handled or held", func() bool { return count() == 6 })
	rg.finish(t, false)
	f.mu.Lock()
	pos, meta := f.commits[0], f.meta[0]
	f.mu.Unlock()
	if pos != 1 || meta == "" {
		t.Fatalf("committed %d with metadata %q, want 1 with the finished offsets 2-5", pos, meta)
	}

	// The next owner starts at offset 1 with what the metadata lists.
	mu.Lock()
	handled = nil
	mu.Unlock()
	second.Store(true)
	f2 := newFakeGroup(map[int]partitionReader{0: newFakeReader(all[1:]...)})
	f2.skips = map[int]finishedSet{0: parseFinished(pos, meta)}
	rg2 := startGeneration(t, c, f2, &fakeWriter{})
	waitFor(t, "offset 6 committed", func() bool { return f2.committed()[0] == 6 })
	rg2.finish(t, true)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(handled, []int64{1}) {
		t.Fatalf("the next generation handled %v, want only offset 1", handled)
	}
}

// BenchmarkGeneration measures the per-message cost of a generation's
// path, fetch to commit, with 16 partitions handled side by side
// (OrderPartition, Concurrency 16, the default QueueSize) and a handler
// that returns at once: b.N messages spread over the partitions, from
// the first fetch until every partition is committed to its end.
func BenchmarkGeneration(b *testing.B) {
	const partitions = 16
	per := max(1, b.N/partitions)
	c, err := New(Config{
		Options: consumer.Options{Concurrency: partitions, Retry: consumer.RetryPolicy{MaxAttempts: 1}, Logger: discardLogger()},
		Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g", CommitTimeout: time.Second,
	}, func(context.Context, consumer.Message) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	readers := map[int]partitionReader{}
	want := map[int]int64{}
	for p := range partitions {
		ms := make([]kafkago.Message, per)
		for i := range ms {
			ms[i] = kafkago.Message{Topic: "t", Partition: p, Offset: int64(i), Value: []byte(`{"to":"+15550000000"}`)}
		}
		readers[p] = newFakeReader(ms...)
		want[p] = int64(per)
	}
	f := newFakeGroup(readers)
	b.ReportAllocs()
	b.ResetTimer()
	gctx, end := context.WithCancel(context.Background())
	defer end()
	g := &generation{id: 1, commit: f.commit, shutdown: make(chan struct{}), drained: make(chan struct{}),
		open: func(tp topicPartition, _ int64) (partitionReader, func()) { return f.readers[tp.partition], func() {} }}
	for p := range partitions {
		g.partitions = append(g.partitions, assignment{topicPartition{"t", p}, kafkago.FirstOffset})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.runGeneration(gctx, g, &deadLetterer{w: &fakeWriter{}, topic: "t.dlq", log: discardLogger()}, nil)
	}()
	for !maps.Equal(f.committed(), want) {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	f.mu.Lock()
	b.ReportMetric(float64(f.calls)/float64(partitions*per), "commits/msg")
	f.mu.Unlock()
	end()
	<-done
}
