package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// fakeClock is a clock that moves only when the test sets it. It counts
// the calls to SleepUntil and lists the sleepers, so a test can see that a
// fetcher is parked on its head's due time.
type fakeClock struct {
	mu       sync.Mutex
	now      time.Time
	calls    int
	sleepers map[*fakeSleeper]bool
}

type fakeSleeper struct {
	until time.Time
	wake  chan struct{}
}

func newFakeClock(now time.Time) *fakeClock {
	return &fakeClock{now: now, sleepers: map[*fakeSleeper]bool{}}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) SleepUntil(ctx context.Context, t time.Time) error {
	f.mu.Lock()
	f.calls++
	if !t.After(f.now) {
		f.mu.Unlock()
		return ctx.Err()
	}
	s := &fakeSleeper{until: t, wake: make(chan struct{})}
	f.sleepers[s] = true
	f.mu.Unlock()
	select {
	case <-s.wake:
		return ctx.Err()
	case <-ctx.Done():
		f.mu.Lock()
		delete(f.sleepers, s)
		f.mu.Unlock()
		return ctx.Err()
	}
}

// set moves the clock to now and wakes the sleepers that are due.
func (f *fakeClock) set(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
	for s := range f.sleepers {
		if !s.until.After(now) {
			delete(f.sleepers, s)
			close(s.wake)
		}
	}
}

// sleeping returns the instants the sleepers wait for, sorted.
func (f *fakeClock) sleeping() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Time
	for s := range f.sleepers {
		out = append(out, s.until)
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

func (f *fakeClock) sleepCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// delayMsg returns a message of partition p of the delay topic "t.delay"
// at offset off, due at due (no due header when due is zero).
func delayMsg(p int, off int64, due time.Time, headers ...kafkago.Header) kafkago.Message {
	m := kafkago.Message{Topic: "t.delay", Partition: p, Offset: off, Key: []byte(fmt.Sprint(off)), Value: []byte("v"), Headers: headers}
	if !due.IsZero() {
		m.Headers = append(m.Headers, kafkago.Header{Key: consumer.HeaderDue, Value: []byte(due.Format(time.RFC3339Nano))})
	}
	return m
}

// originHeaders are the headers of a message set aside from partition p
// of topic "t" at offset off.
func originHeaders(p, off string) []kafkago.Header {
	return []kafkago.Header{
		{Key: HeaderOriginalTopic, Value: []byte("t")},
		{Key: HeaderOriginalPartition, Value: []byte(p)},
		{Key: HeaderOriginalOffset, Value: []byte(off)},
	}
}

// headerMap returns headers by key.
func headerMap(headers []kafkago.Header) map[string]string {
	m := map[string]string{}
	for _, h := range headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

// handleDelayMessage consumes msg, of partition 0 of the delay topic, with
// h at the instant t0, waits until its delay-topic offset is committed and
// the generation has finished, and returns what was written to the delay
// topic and to the dead-letter topic meanwhile.
func handleDelayMessage(t *testing.T, t0 time.Time, msg kafkago.Message, h consumer.Handler) (delayed, deadLetters []kafkago.Message) {
	t.Helper()
	c := newTestConsumer(t, Config{Options: consumer.Options{SetAside: true}}, h)
	c.clock = newFakeClock(t0)
	f := newFakeGroup(map[int]partitionReader{})
	f.delayReaders = map[int]partitionReader{0: newFakeReader(msg)}
	dw, dl := &fakeWriter{}, &fakeWriter{}
	f.delayWriter = dw
	rg := startGeneration(t, c, f, dl)
	waitFor(t, "the delay partition committed", func() bool { return f.delayCommitted()[0] == msg.Offset+1 })
	rg.finish(t, true)
	dw.mu.Lock()
	defer dw.mu.Unlock()
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return slices.Clone(dw.writes), slices.Clone(dl.writes)
}

func TestDueOf(t *testing.T) {
	at := time.Date(2026, 12, 1, 6, 0, 0, 123456789, time.UTC)
	h := func(v string) kafkago.Header { return kafkago.Header{Key: consumer.HeaderDue, Value: []byte(v)} }
	cases := []struct {
		name    string
		headers []kafkago.Header
		want    time.Time
		ok      bool
	}{
		{"none", nil, time.Time{}, false},
		{"RFC 3339 with nanoseconds", []kafkago.Header{h(at.Format(time.RFC3339Nano))}, at, true},
		{"another zone", []kafkago.Header{h("2026-12-01T01:00:00.5-05:00")}, time.Date(2026, 12, 1, 6, 0, 0, 5e8, time.UTC), true},
		{"the last of several", []kafkago.Header{h("2020-01-01T00:00:00Z"), h(at.Format(time.RFC3339Nano))}, at, true},
		{"not a time", []kafkago.Header{h("soon")}, time.Time{}, false},
		{"unix seconds", []kafkago.Header{h("1796104800")}, time.Time{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := dueOf(kafkago.Message{Headers: tc.headers})
			if ok != tc.ok || !got.Equal(tc.want) {
				t.Fatalf("dueOf = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestHandOnAt: a copy of the delay topic is handed on when it is due,
// or setaside.PaidLead before with a paid slot (the limiter waits for the
// slot itself and asks the store a round trip ahead of it); it used to be
// handed on at its due time alone, and its store call answered past the
// slot lost it under load.
func TestHandOnAt(t *testing.T) {
	at := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	due := kafkago.Header{Key: consumer.HeaderDue, Value: []byte(at.Format(time.RFC3339Nano))}
	paid := kafkago.Header{Key: setaside.HeaderPaid, Value: []byte(`[{"layer":"per-recipient","key":"a","due":"2026-12-01T06:00:00Z"}]`)}
	for _, tc := range []struct {
		name    string
		headers []kafkago.Header
		want    time.Time
		ok      bool
	}{
		{"due", []kafkago.Header{due}, at, true},
		{"due with a paid slot", []kafkago.Header{due, paid}, at.Add(-setaside.PaidLead), true},
		{"an empty paid header", []kafkago.Header{due, {Key: setaside.HeaderPaid}}, at, true},
		{"no due time", []kafkago.Header{paid}, time.Time{}, false},
	} {
		got, ok := handOnAt(kafkago.Message{Headers: tc.headers})
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("%s: handOnAt = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestDelayDueTiming steps a fake clock through fixed instants over two
// partitions of the delay topic and checks, at each, which messages were
// handled, which due time each partition's reader waits for, and what was
// committed. A partition's copies go in the order they are due, each when
// it is due: one due earlier behind a later one does not wait for it (it
// did, the head of a partition blocking it, so that a copy came back up
// to the longest delay set aside before it late). A past-due or undated
// copy goes at once. The commit stays before the first unfinished copy.
func TestDelayDueTiming(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type hpos struct {
		partition int
		offset    int64
	}
	steps := []struct {
		at        time.Duration
		handled   []hpos
		sleeping  []time.Duration
		committed map[int]int64
	}{
		// Partition 1's messages are past due and undated: handled at once.
		// Partition 0's first due copies are due at +1s.
		{0, []hpos{{1, 0}, {1, 1}}, []time.Duration{time.Second}, map[int]int64{1: 2}},
		{500 * time.Millisecond, []hpos{{1, 0}, {1, 1}}, []time.Duration{time.Second}, map[int]int64{1: 2}},
		// Offsets 0 and 1 are due; offset 3 (+2s) is the next due.
		{time.Second, []hpos{{0, 0}, {0, 1}, {1, 0}, {1, 1}}, []time.Duration{2 * time.Second}, map[int]int64{0: 2, 1: 2}},
		// Offset 3, due at +2s, goes before offset 2 (+3s); the commit
		// stays at offset 2.
		{2 * time.Second, []hpos{{0, 0}, {0, 1}, {0, 3}, {1, 0}, {1, 1}}, []time.Duration{3 * time.Second}, map[int]int64{0: 2, 1: 2}},
		{3 * time.Second, []hpos{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}}, nil, map[int]int64{0: 4, 1: 2}},
	}
	for _, ordering := range []consumer.Ordering{consumer.OrderPartition, consumer.OrderKey, consumer.OrderNone} {
		t.Run(string(ordering), func(t *testing.T) {
			var mu sync.Mutex
			var handled []hpos
			h := func(_ context.Context, m consumer.Message) error {
				if m.Source.Topic != "t.delay" {
					t.Errorf("handled a message of topic %q", m.Source.Topic)
				}
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, hpos{m.Source.Partition, m.Source.Offset})
				return nil
			}
			c := newTestConsumer(t, Config{Options: consumer.Options{SetAside: true, Concurrency: 2, Ordering: ordering}}, h)
			clk := newFakeClock(t0)
			c.clock = clk
			f := newFakeGroup(map[int]partitionReader{})
			f.delayReaders = map[int]partitionReader{
				0: newFakeReader(
					delayMsg(0, 0, at(time.Second)),
					delayMsg(0, 1, at(time.Second)),
					delayMsg(0, 2, at(3*time.Second)),
					delayMsg(0, 3, at(2*time.Second)),
				),
				1: newFakeReader(
					delayMsg(1, 0, at(-time.Second)),
					delayMsg(1, 1, time.Time{}),
				),
			}
			f.delayWriter = &fakeWriter{}
			rg := startGeneration(t, c, f, &fakeWriter{})
			for _, st := range steps {
				clk.set(at(st.at))
				var wantSleeping []time.Time
				for _, d := range st.sleeping {
					wantSleeping = append(wantSleeping, at(d))
				}
				state := func() string {
					mu.Lock()
					got := slices.Clone(handled)
					mu.Unlock()
					slices.SortFunc(got, func(a, b hpos) int {
						if a.partition != b.partition {
							return a.partition - b.partition
						}
						return int(a.offset - b.offset)
					})
					return fmt.Sprintf("handled %v, sleeping until %v, committed %v", got, clk.sleeping(), f.delayCommitted())
				}
				want := fmt.Sprintf("handled %v, sleeping until %v, committed %v", st.handled, wantSleeping, st.committed)
				deadline := time.Now().Add(10 * time.Second)
				for state() != want {
					if time.Now().After(deadline) {
						t.Fatalf("at +%v: %s; want %s", st.at, state(), want)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			// No polling: partition 0's reader waits for the copy due first
			// while it reads each of the 3 after the first, and once for
			// each of the 2 due times after +1s.
			if n := clk.sleepCalls(); n > 6 {
				t.Errorf("SleepUntil called %d times, want at most 6", n)
			}
			rg.finish(t, true)
			if got := f.delayCommitted(); !maps.Equal(got, steps[len(steps)-1].committed) {
				t.Errorf("committed %v at the end", got)
			}
		})
	}
}

// TestDelayWaitEndsAtRevocation: a reader waiting for a copy that is not
// due returns when the partition is revoked; the copy is neither handled
// nor committed, so the next owner reads it again.
func TestDelayWaitEndsAtRevocation(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	c := newTestConsumer(t, Config{Options: consumer.Options{SetAside: true}}, func(context.Context, consumer.Message) error {
		t.Error("handled a message that was not due")
		return nil
	})
	clk := newFakeClock(t0)
	c.clock = clk
	f := newFakeGroup(map[int]partitionReader{})
	f.delayReaders = map[int]partitionReader{0: newFakeReader(delayMsg(0, 0, t0.Add(time.Hour)))}
	f.delayWriter = &fakeWriter{}
	rg := startGeneration(t, c, f, &fakeWriter{})
	waitFor(t, "the reader waiting for the copy", func() bool { return len(clk.sleeping()) == 1 })
	rg.finish(t, false)
	if n := len(clk.sleeping()); n != 0 {
		t.Errorf("%d sleepers left after the revocation", n)
	}
	if got := f.delayCommitted(); len(got) != 0 {
		t.Errorf("committed %v, want nothing", got)
	}
}

// TestDelayRevocationSkipsFinished: under OrderPartition too, the copies
// of a delay partition finish in the order they are due, so a revocation
// while an early copy waits commits its offset with the later, finished
// ones listed in the metadata; the next owner handles only the one that
// waited, when due, and none twice.
func TestDelayRevocationSkipsFinished(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var handled []int64
	c := newTestConsumer(t, Config{Options: consumer.Options{SetAside: true}}, func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, m.Source.Offset)
		return nil
	})
	clk := newFakeClock(t0)
	c.clock = clk
	copies := []kafkago.Message{delayMsg(0, 0, t0.Add(time.Hour)), delayMsg(0, 1, t0), delayMsg(0, 2, t0.Add(-time.Second))}
	f := newFakeGroup(map[int]partitionReader{})
	f.delayReaders = map[int]partitionReader{0: newFakeReader(copies...)}
	f.delayWriter = &fakeWriter{}
	rg := startGeneration(t, c, f, &fakeWriter{})
	waitFor(t, "offsets 1 and 2 handled, 0 held", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 2 && len(clk.sleeping()) == 1
	})
	rg.finish(t, false)
	f.mu.Lock()
	pos, meta := f.delayCommits[0], f.delayMeta[0]
	f.mu.Unlock()
	if pos != 0 || !parseFinished(pos, meta).has(1) || !parseFinished(pos, meta).has(2) {
		t.Fatalf("committed %d with metadata %q, want 0 with offsets 1 and 2 finished", pos, meta)
	}

	mu.Lock()
	handled = nil
	mu.Unlock()
	clk.set(t0.Add(time.Hour))
	f2 := newFakeGroup(map[int]partitionReader{})
	f2.delayReaders = map[int]partitionReader{0: newFakeReader(copies...)}
	f2.delayWriter = &fakeWriter{}
	f2.delaySkips = map[int]finishedSet{0: parseFinished(pos, meta)}
	rg2 := startGeneration(t, c, f2, &fakeWriter{})
	waitFor(t, "the delay partition committed to its end", func() bool { return f2.delayCommitted()[0] == 3 })
	rg2.finish(t, true)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(handled, []int64{0}) {
		t.Fatalf("the next owner handled %v, want only offset 0", handled)
	}
}

// TestSetAsideWritesBeforeCommit: a message the handler sets aside is
// written to the delay topic, with its due time, origin, attempts and
// reason, before the commit may pass it; while the write fails, it is
// retried and the commit stays before the message, also after the drain.
func TestSetAsideWritesBeforeCommit(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	reason := errors.New(`limit "per-key": rate 1/s (burst 1) exceeded`)
	cases := []struct {
		name        string
		writerFails int // -1: always
		committed   int64
		writes      int
	}{
		{"written after two failures, then committed", 2, 3, 1},
		{"not committed while the write fails", -1, 1, 0},
	}
	for _, ordering := range []consumer.Ordering{consumer.OrderPartition, consumer.OrderKey, consumer.OrderNone} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", ordering, tc.name), func(t *testing.T) {
				h := func(_ context.Context, m consumer.Message) error {
					if m.Source.Offset == 1 {
						return consumer.SetAside(reason, 5*time.Second)
					}
					return nil
				}
				var observed []time.Duration
				var mu sync.Mutex
				obs := &consumer.MessageObserver{SetAside: func(_ consumer.Message, d time.Duration) {
					mu.Lock()
					observed = append(observed, d)
					mu.Unlock()
				}}
				c := newTestConsumer(t, Config{Options: consumer.Options{
					SetAside: true,
					Ordering: ordering, Observer: obs, DrainTimeout: 200 * time.Millisecond,
				}}, h)
				c.clock = newFakeClock(t0)
				p0 := msgs(0, 0, 1, 2)
				for i := range p0 {
					p0[i].Key = []byte{byte(i)}
					p0[i].Headers = []kafkago.Header{{Key: "x-from", Value: []byte("+1555")}}
				}
				f := newFakeGroup(map[int]partitionReader{0: newFakeReader(p0...)})
				dw := &fakeWriter{fail: tc.writerFails}
				f.delayWriter = dw
				rg := startGeneration(t, c, f, &fakeWriter{})
				if tc.writes > 0 {
					waitFor(t, "the commit", func() bool { return f.committed()[0] == tc.committed })
				} else {
					waitFor(t, "write retries", func() bool { dw.mu.Lock(); defer dw.mu.Unlock(); return dw.calls >= 2 })
				}
				rg.finish(t, true)
				if got := f.committed()[0]; got != tc.committed {
					t.Fatalf("committed %d, want %d", got, tc.committed)
				}
				dw.mu.Lock()
				defer dw.mu.Unlock()
				if len(dw.writes) != tc.writes {
					t.Fatalf("%d delay writes, want %d", len(dw.writes), tc.writes)
				}
				if tc.writes == 0 {
					return
				}
				w := dw.writes[0]
				got := headerMap(w.Headers)
				want := map[string]string{
					"x-from":                      "+1555",
					consumer.HeaderDue:            "2026-12-01T06:00:05Z",
					HeaderOriginalTopic:           "t",
					HeaderOriginalPartition:       "0",
					HeaderOriginalOffset:          "1",
					consumer.HeaderAttempts:       "0",
					consumer.HeaderSetAsideReason: reason.Error(),
					HeaderGroup:                   "g",
				}
				if !maps.Equal(got, want) || string(w.Key) != "\x01" || string(w.Value) != "v" {
					t.Fatalf("delay write key %q value %q headers %v; want key \"\\x01\", value \"v\", headers %v", w.Key, w.Value, got, want)
				}
				mu.Lock()
				defer mu.Unlock()
				if !slices.Equal(observed, []time.Duration{5 * time.Second}) {
					t.Errorf("Observer.SetAside saw %v", observed)
				}
			})
		}
	}
}

// TestSetAsideAgainKeepsOrigin: a message of the delay topic set aside
// again keeps the position it was first consumed from, gets a new due
// time, and its delay-topic offset is committed.
func TestSetAsideAgainKeepsOrigin(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	delayed, _ := handleDelayMessage(t, t0, delayMsg(0, 7, t0.Add(-time.Second), originHeaders("3", "42")...),
		func(context.Context, consumer.Message) error {
			return consumer.SetAside(errors.New("still full"), 2*time.Second)
		})
	if len(delayed) != 1 {
		t.Fatalf("%d delay writes, want 1", len(delayed))
	}
	got := headerMap(delayed[0].Headers)
	if got[HeaderOriginalTopic] != "t" || got[HeaderOriginalPartition] != "3" || got[HeaderOriginalOffset] != "42" ||
		got[consumer.HeaderDue] != "2026-12-01T06:00:02Z" || got[consumer.HeaderSetAsideReason] != "still full" {
		t.Fatalf("headers %v", got)
	}
}

// TestSetAsideWithoutDelayTopic: when the consumer sets aside but has no
// delay topic (the brokers refused to create it), the handler waits out
// the delay and the message is handled again, then committed.
func TestSetAsideWithoutDelayTopic(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	c := newTestConsumer(t, Config{Options: consumer.Options{SetAside: true}}, func(context.Context, consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return consumer.SetAside(errors.New("full"), 20*time.Millisecond)
		}
		return nil
	})
	f := newFakeGroup(map[int]partitionReader{0: newFakeReader(msgs(0, 0)...)})
	rg := startGeneration(t, c, f, &fakeWriter{})
	waitFor(t, "the commit", func() bool { return f.committed()[0] == 1 })
	rg.finish(t, true)
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("handler called %d times, want 2", calls)
	}
}

// TestDeadLetterFromDelayTopicKeepsOrigin: a message of the delay topic
// that fails for good is dead-lettered with the position it was first
// consumed from, and its delay-topic offset is committed.
func TestDeadLetterFromDelayTopicKeepsOrigin(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	_, deadLetters := handleDelayMessage(t, t0, delayMsg(0, 4, t0, originHeaders("2", "9")...),
		func(context.Context, consumer.Message) error {
			return consumer.Permanent(errors.New("recipient gone"))
		})
	if len(deadLetters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(deadLetters))
	}
	got := headerMap(deadLetters[0].Headers)
	if got[HeaderOriginalTopic] != "t" || got[HeaderOriginalPartition] != "2" || got[HeaderOriginalOffset] != "9" ||
		got[consumer.HeaderError] != "recipient gone" {
		t.Fatalf("dead-letter headers %v", got)
	}
}

// TestSetAsidePaidHeaderOfTheCopy: a message set aside by a handler that
// names no headers (a plain consumer.SetAside) carries setaside.HeaderPaid
// to the delay topic only when it came from there: the header a producer
// wrote on a message of the topic, which fetch dropped, is not written to
// the copy, where it would count when the copy comes back.
func TestSetAsidePaidHeaderOfTheCopy(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	const slot = `[{"layer":"per-key","key":"k","due":"2026-12-01T06:00:01Z"}]`
	paid := kafkago.Header{Key: setaside.HeaderPaid, Value: []byte(slot)}
	h := func(context.Context, consumer.Message) error {
		return consumer.SetAside(errors.New("downstream 429"), 5*time.Second)
	}

	t.Run("from the topic: the producer's header is dropped", func(t *testing.T) {
		c := newTestConsumer(t, Config{Options: consumer.Options{SetAside: true}}, h)
		c.clock = newFakeClock(t0)
		p0 := msgs(0, 0)
		p0[0].Headers = []kafkago.Header{paid}
		f := newFakeGroup(map[int]partitionReader{0: newFakeReader(p0...)})
		dw := &fakeWriter{}
		f.delayWriter = dw
		rg := startGeneration(t, c, f, &fakeWriter{})
		waitFor(t, "the commit", func() bool { return f.committed()[0] == 1 })
		rg.finish(t, true)
		dw.mu.Lock()
		defer dw.mu.Unlock()
		if len(dw.writes) != 1 {
			t.Fatalf("%d delay writes, want 1", len(dw.writes))
		}
		if v, ok := headerMap(dw.writes[0].Headers)[setaside.HeaderPaid]; ok {
			t.Errorf("the copy carries the producer's %s %q, want none", setaside.HeaderPaid, v)
		}
	})

	t.Run("from the delay topic: the slot is kept", func(t *testing.T) {
		delayed, _ := handleDelayMessage(t, t0, delayMsg(0, 0, t0, append(originHeaders("0", "3"), paid)...), h)
		if len(delayed) != 1 {
			t.Fatalf("%d delay writes, want 1", len(delayed))
		}
		if got := headerMap(delayed[0].Headers)[setaside.HeaderPaid]; got != slot {
			t.Errorf("the copy carries %s %q, want %q", setaside.HeaderPaid, got, slot)
		}
	})
}
