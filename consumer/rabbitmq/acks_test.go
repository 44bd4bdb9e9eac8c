package rabbitmq_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
)

// TestBatchedAcksOnTheBroker runs deliveries that settle out of order
// (handlers of random lengths, every seventh message dead-lettered, which
// publishes a copy and then acks) with the default AckDelay: every
// message is handled once, none is redelivered (a batched ack naming a
// tag the broker no longer knows would close the channel and redeliver
// the rest), and the queue is empty once Run returned; with acks one by
// one (a negative AckDelay) the same holds.
func TestBatchedAcksOnTheBroker(t *testing.T) {
	for _, delay := range []time.Duration{0, -1} {
		name := "batched"
		if delay < 0 {
			name = "one by one"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const n = 600
			b := newBroker(t)
			q := b.declareQueue(t)
			ids := b.publish(t, q, n)
			var (
				mu      sync.Mutex
				calls   = map[string]int{}
				redeliv int
			)
			ends := newEndCount(n)
			obs := &consumer.MessageObserver{
				Delivered:    func(consumer.Message) { ends.end() },
				DeadLettered: func(consumer.Message, error) { ends.end() },
			}
			errPoison := errors.New("poison")
			h := func(_ context.Context, msg consumer.Message) error {
				mu.Lock()
				calls[msg.Source.MessageID]++
				if msg.Source.Redelivered {
					redeliv++
				}
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				if strings.HasSuffix(msg.Source.MessageID, "7") {
					return consumer.Permanent(errPoison)
				}
				return nil
			}
			c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Declare: true, Prefetch: 60, AckDelay: delay,
				Options: consumer.Options{Concurrency: 40, Observer: obs}}, h)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wait := runAll(t, ctx, c.Run)
			ends.wait(t, 30*time.Second)
			cancel()
			wait()
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if calls[id] != 1 {
					t.Errorf("%s handled %d times, want once", id, calls[id])
				}
			}
			if redeliv != 0 {
				t.Errorf("%d redeliveries, want 0", redeliv)
			}
			if got := b.waitReady(t, q, 0); got != 0 {
				t.Errorf("%d messages back in the queue after Run returned, want 0 (all acked)", got)
			}
			if got := b.waitReady(t, q+".dlq", n/10); got != n/10 {
				t.Errorf("%d dead letters, want %d", got, n/10)
			}
		})
	}
}

// TestAcksDoNotHoldBackFreeHandlers: with the whole prefetch in handlers
// of a slow sink, the broker sends a delivery only once another is acked;
// an ack then goes out as its delivery settles, not after AckDelay. With
// an AckDelay of 1s, prefetch 2 and handlers of 20ms, 20 messages take
// about 0.2s; an ack that waited its delay would take about 10s.
func TestAcksDoNotHoldBackFreeHandlers(t *testing.T) {
	t.Parallel()
	const n = 20
	b := newBroker(t)
	q := b.declareQueue(t)
	b.publish(t, q, n)
	ends := newEndCount(n)
	obs := &consumer.MessageObserver{Delivered: func(consumer.Message) { ends.end() }}
	h := func(context.Context, consumer.Message) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Declare: true, Prefetch: 2, AckDelay: time.Second,
		Options: consumer.Options{Concurrency: 2, Observer: obs}}, h)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	wait := runAll(t, ctx, c.Run)
	ends.wait(t, 30*time.Second)
	took := time.Since(start)
	cancel()
	wait()
	t.Logf("%d messages through a prefetch of 2 in %v", n, took)
	// 10 rounds of 20ms, plus connecting; one AckDelay per round would
	// be 10s.
	if took > 3*time.Second {
		t.Errorf("%d messages took %v, want well under the 10s of an ack waiting its 1s delay each round", n, took)
	}
	if got := b.waitReady(t, q, 0); got != 0 {
		t.Errorf("%d messages back in the queue after Run returned, want 0 (all acked)", got)
	}
}

// endCount counts the messages that ended (delivered or dead-lettered)
// and closes all once n did. Its methods are safe for concurrent use.
type endCount struct {
	mu       sync.Mutex
	n, ended int
	all      chan struct{}
}

func newEndCount(n int) *endCount { return &endCount{n: n, all: make(chan struct{})} }

func (e *endCount) end() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended++; e.ended == e.n {
		close(e.all)
	}
}

// wait fails t unless all n messages ended within d.
func (e *endCount) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-e.all:
	case <-time.After(d):
		e.mu.Lock()
		defer e.mu.Unlock()
		t.Fatalf("%d of %d messages ended after %v", e.ended, e.n, d)
	}
}
