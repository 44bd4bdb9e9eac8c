package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// statsBelow returns the fields in which a is greater than b, so that an
// empty result means a <= b in every field.
func statsBelow(a, b ReaderStats) []string {
	var out []string
	check := func(name string, x, y int64) {
		if x > y {
			out = append(out, fmt.Sprintf("%s %d > %d", name, x, y))
		}
	}
	check("Dials", a.Dials, b.Dials)
	check("Errors", a.Errors, b.Errors)
	check("Rebalances", a.Rebalances, b.Rebalances)
	check("Timeouts", a.Timeouts, b.Timeouts)
	check("Fetches", a.Fetches, b.Fetches)
	check("Messages", a.Messages, b.Messages)
	check("Bytes", a.Bytes, b.Bytes)
	return out
}

// assertMonotonic fails the test unless later >= earlier in every field.
func assertMonotonic(t *testing.T, what string, earlier, later ReaderStats) {
	t.Helper()
	if d := statsBelow(earlier, later); len(d) > 0 {
		t.Errorf("%s: totals decreased from %+v to %+v: %s", what, earlier, later, strings.Join(d, ", "))
	}
}

// pollReaderStats calls c.ReaderStats in a loop until the returned stop is
// called, so that the race detector sees it run concurrently with Run, and
// checks that every result is at least the previous one.
func pollReaderStats(t *testing.T, c *Consumer) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var prev ReaderStats
		for {
			s := c.ReaderStats()
			if d := statsBelow(prev, s); len(d) > 0 {
				t.Errorf("concurrent ReaderStats decreased from %+v to %+v: %s", prev, s, strings.Join(d, ", "))
			}
			prev = s
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestReaderStatsWithoutRun(t *testing.T) {
	c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g", Options: consumer.Options{Logger: discardLogger()}},
		func(context.Context, consumer.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if s := c.ReaderStats(); s != (ReaderStats{}) {
		t.Fatalf("ReaderStats before Run = %+v, want zero", s)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Fatalf("Run after Close = %v, want consumer.ErrStopped", err)
	}
	if s := c.ReaderStats(); s != (ReaderStats{}) {
		t.Fatalf("ReaderStats after Close without Run = %+v, want zero", s)
	}
}

// TestReaderStats consumes n messages and checks the totals ReaderStats
// returns while Run runs, with another goroutine calling it meanwhile, and
// after Run returned.
func TestReaderStats(t *testing.T) {
	t.Parallel()
	const (
		n          = 40
		partitions = 2
	)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, partitions, topic)
	produce(t, brokers, records(topic, partitions, n)...)

	log := newHandledLog(n)
	c, err := New(Config{
		Options: consumer.Options{Concurrency: partitions, Logger: testLogger(t)},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}, func(ctx context.Context, m consumer.Message) error {
		log.add(0, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stopPolling := pollReaderStats(t, c)
	stop := runConsumer(t, c)
	log.waitAll(t, 30*time.Second)

	first := c.ReaderStats()
	t.Logf("after handling %d messages: %+v", n, first)
	// kafka-go counts a message when it fetches it, before the handler
	// sees it, so every handled message was counted; a message fetched
	// twice counts twice.
	if first.Messages < n {
		t.Errorf("Messages = %d, want at least the %d messages handled", first.Messages, n)
	}
	if first.Bytes <= 0 {
		t.Errorf("Bytes = %d, want > 0", first.Bytes)
	}
	// Fetching needs a connection to the partition leader and a fetch.
	if first.Dials < 1 || first.Fetches < 1 {
		t.Errorf("Dials = %d, Fetches = %d, want at least 1 each", first.Dials, first.Fetches)
	}
	// kafka-go counts a rebalance for every generation it joins, the
	// first included, and it must have joined one to get partitions.
	if first.Rebalances < 1 {
		t.Errorf("Rebalances = %d, want at least 1 (the first join)", first.Rebalances)
	}
	second := c.ReaderStats()
	assertMonotonic(t, "second call while running", first, second)

	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	stopPolling()
	final := c.ReaderStats()
	t.Logf("after Run returned: %+v", final)
	assertMonotonic(t, "after Run returned", second, final)
	if final.Messages < n || final.Dials < 1 || final.Rebalances < 1 {
		t.Errorf("ReaderStats after Run returned = %+v, want the totals of the run", final)
	}
	if again := c.ReaderStats(); again != final {
		t.Errorf("ReaderStats changed after Run returned: %+v, then %+v", final, again)
	}
}

// cut closes every connection dialled so far, as a broken network would,
// but lets later dials succeed, so the client can reconnect.
func (n *crashableNet) cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.conns {
		_ = c.Close()
	}
	n.conns = nil
}

// TestReaderStatsReconnect cuts the consumer's broker connections mid-run.
// kafka-go reconnects by itself; ReaderStats shows it: Dials grows, since
// fetching the messages produced after the cut needed a new connection to
// the partition leader.
func TestReaderStatsReconnect(t *testing.T) {
	t.Parallel()
	const n = 10
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, 1, topic)

	var network crashableNet
	before, after := newHandledLog(n), newHandledLog(n)
	c, err := New(Config{
		Options: consumer.Options{Logger: discardLogger()},
		Brokers: brokers, Topic: topic, Group: group, // the cut makes kafka-go log errors, as it should
		Dialer: &kafkago.Dialer{DialFunc: network.dial, Timeout: 5 * time.Second},
		// Short timeouts, so that kafka-go notices the cut quickly.
		ConfigureReader: fastGroup,
	}, func(ctx context.Context, m consumer.Message) error {
		if strings.HasPrefix(string(m.Body), "after") {
			after.add(0, m)
		} else {
			before.add(0, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stopPolling := pollReaderStats(t, c)
	stop := runConsumer(t, c)

	produce(t, brokers, records(topic, 1, n)...)
	before.waitAll(t, 30*time.Second)
	s1 := c.ReaderStats()
	t.Logf("before the cut: %+v", s1)

	network.cut()
	recs := records(topic, 1, n)
	for _, r := range recs {
		r.Value = append([]byte("after-"), r.Value...)
	}
	produce(t, brokers, recs...)
	after.waitAll(t, 60*time.Second)

	s2 := c.ReaderStats()
	t.Logf("after the cut: %+v", s2)
	assertMonotonic(t, "across the cut", s1, s2)
	if s2.Dials <= s1.Dials {
		t.Errorf("Dials = %d after the cut, %d before: want more, the reader had to reconnect", s2.Dials, s1.Dials)
	}
	t.Logf("the cut cost %d dials, %d errors, %d rebalances", s2.Dials-s1.Dials, s2.Errors-s1.Errors, s2.Rebalances-s1.Rebalances)

	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	stopPolling()
	assertMonotonic(t, "after Run returned", s2, c.ReaderStats())
}
