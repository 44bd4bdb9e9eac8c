package rabbitmq

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// heldMarks is a DedupeStore with the queued operations of
// redisdedupe.Store (ClaimLater, MarkSentLater, ReleaseLater, Flush), in
// memory: claims, releases and direct marks are decided at once; the
// queued marks wait until release.
type heldMarks struct {
	local consumer.DedupeStore
	mu    sync.Mutex
	marks []func()
}

func (s *heldMarks) Claim(ctx context.Context, key, token string, ttl time.Duration) (consumer.DedupeState, error) {
	return s.local.Claim(ctx, key, token, ttl)
}

func (s *heldMarks) MarkSent(ctx context.Context, key, token string, window time.Duration) error {
	return s.local.MarkSent(ctx, key, token, window)
}

func (s *heldMarks) Release(ctx context.Context, key, token string) error {
	return s.local.Release(ctx, key, token)
}

func (s *heldMarks) ClaimLater(key, token string, ttl time.Duration, done func(consumer.DedupeState, error)) {
	done(s.local.Claim(context.Background(), key, token, ttl))
}

func (s *heldMarks) MarkSentLater(key, token string, window time.Duration, done func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marks = append(s.marks, func() { done(s.local.MarkSent(context.Background(), key, token, window)) })
}

func (s *heldMarks) ReleaseLater(key, token string, done func(error)) {
	done(s.local.Release(context.Background(), key, token))
}

func (s *heldMarks) Flush() {}

// held returns the number of marks waiting.
func (s *heldMarks) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.marks)
}

// land writes the marks waiting, from another goroutine, as the store's
// batcher does.
func (s *heldMarks) land() {
	s.mu.Lock()
	marks := s.marks
	s.marks = nil
	s.mu.Unlock()
	go func() {
		for _, m := range marks {
			m()
		}
	}()
}

// TestDedupeAckAfterMark: with Options.Dedupe on a store that queues its
// marks, a delivered message is acked only once its mark landed, while
// its handler goes on at once with the next delivery (Concurrency 1); a
// copy of a message already marked is acked without a send; and the
// drain waits for the acks whose mark is under way.
func TestDedupeAckAfterMark(t *testing.T) {
	st := &heldMarks{local: consumer.NewLocalDedupeStore()}
	var mu sync.Mutex
	var sent []string
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, m.Source.MessageID)
		return nil
	}
	p := newTestRun(t, context.Background(), Config{Options: consumer.Options{
		Concurrency: 1,
		Dedupe: &consumer.Dedupe{Store: st,
			Key: func(m consumer.Message) (string, error) { return m.Source.MessageID, nil }},
	}}, h, &fakePublisher{})
	ack := &fakeAck{}
	p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 1, MessageId: "m1"})
	p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 2, MessageId: "m2"})
	// The one handler sent both, the first one's mark still held.
	waitFor(t, func() bool { return st.held() == 2 })
	for tag := range uint64(2) {
		if got := ack.of(tag + 1); len(got) != 0 {
			t.Fatalf("delivery %d: acknowledger calls %q before its mark landed, want none", tag+1, got)
		}
	}
	if n := p.inflight.Load(); n != 2 {
		t.Errorf("in flight with their marks held: %d, want 2", n)
	}

	drained := make(chan struct{})
	go func() {
		p.drain()
		close(drained)
	}()
	select {
	case <-drained:
		t.Fatal("the drain returned with two acks waiting for their marks")
	case <-time.After(50 * time.Millisecond):
	}
	st.land()
	<-drained
	for tag := range uint64(2) {
		if got := ack.of(tag + 1); len(got) != 1 || got[0] != "ack multiple=false" {
			t.Errorf("delivery %d: acknowledger calls %q after its mark landed, want one ack", tag+1, got)
		}
	}

	// A copy of m1, marked now: acked at once, not sent.
	p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 3, MessageId: "m1"})
	p.wg.Wait()
	if got := ack.of(3); len(got) != 1 || got[0] != "ack multiple=false" {
		t.Errorf("copy of m1: acknowledger calls %q, want one ack", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || sent[0] != "m1" || sent[1] != "m2" {
		t.Errorf("sent %q, want [m1 m2]", sent)
	}
	if n := p.inflight.Load(); n != 0 {
		t.Errorf("in flight after all settled: %d", n)
	}
}

// TestDedupeAckAfterMarkChannelClosed: the channel closes while a
// delivery's mark is under way; once the mark landed, its ack is tried,
// fails (the broker redelivers the message, which finds its key marked),
// and the delivery is settled for the drain; the redelivered copy is
// acked without a send.
func TestDedupeAckAfterMarkChannelClosed(t *testing.T) {
	st := &heldMarks{local: consumer.NewLocalDedupeStore()}
	var mu sync.Mutex
	sends := 0
	h := func(context.Context, consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sends++
		return nil
	}
	p := newTestRun(t, context.Background(), Config{Options: consumer.Options{
		Dedupe: &consumer.Dedupe{Store: st,
			Key: func(m consumer.Message) (string, error) { return m.Source.MessageID, nil }},
	}}, h, &fakePublisher{})
	closed := &fakeAck{err: amqp.ErrClosed}
	p.deliverForTest(amqp.Delivery{Acknowledger: closed, DeliveryTag: 1, MessageId: "m1"})
	waitFor(t, func() bool { return st.held() == 1 })
	if got := closed.of(1); len(got) != 0 {
		t.Fatalf("acknowledger calls %q before the mark landed, want none", got)
	}
	st.land()
	p.wg.Wait()
	if got := closed.of(1); len(got) != 1 || got[0] != "ack multiple=false" {
		t.Fatalf("acknowledger calls %q after the mark landed, want one ack (failed)", got)
	}
	ack := &fakeAck{}
	p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 1, MessageId: "m1", Redelivered: true})
	p.wg.Wait()
	if got := ack.of(1); len(got) != 1 || got[0] != "ack multiple=false" {
		t.Errorf("redelivery: acknowledger calls %q, want one ack", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if sends != 1 {
		t.Errorf("sent %d times, want 1", sends)
	}
	if n := p.inflight.Load(); n != 0 {
		t.Errorf("in flight after all settled: %d", n)
	}
}

// TestDedupeMarksLeavePrefetchFree: with a store that queues its marks,
// the broker's QoS leaves room beside Prefetch for the deliveries that
// only wait for their mark (Consumer.qos), and the consumer takes
// deliveries only while fewer than Prefetch are being handled or waiting
// for a handler (run.full), step by step.
func TestDedupeMarksLeavePrefetchFree(t *testing.T) {
	held := func() *consumer.Dedupe {
		return &consumer.Dedupe{Store: &heldMarks{local: consumer.NewLocalDedupeStore()},
			Key: func(m consumer.Message) (string, error) { return m.Source.MessageID, nil }}
	}
	for _, tt := range []struct {
		name     string
		prefetch int
		dedupe   *consumer.Dedupe
		want     int
	}{
		{"no dedupe", 10, nil, 10},
		{"a store without queued marks", 10, &consumer.Dedupe{Store: consumer.NewLocalDedupeStore(),
			Key: func(consumer.Message) (string, error) { return "k", nil }}, 10},
		{"queued marks", 10, held(), 20},
		{"queued marks, capped", 40000, held(), 65535},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/", Queue: "sms", Prefetch: tt.prefetch,
				Options: consumer.Options{Dedupe: tt.dedupe, Logger: testenv.Logger(t, -8)}},
				func(context.Context, consumer.Message) error { return nil })
			if err != nil {
				t.Fatal(err)
			}
			if got := c.qos(); got != tt.want {
				t.Errorf("qos with Prefetch %d: %d, want %d", tt.prefetch, got, tt.want)
			}
		})
	}

	// The gate: Prefetch 2, one handler, held marks.
	st := &heldMarks{local: consumer.NewLocalDedupeStore()}
	release := make(chan struct{})
	h := func(ctx context.Context, _ consumer.Message) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p := newTestRun(t, context.Background(), Config{Prefetch: 2, Options: consumer.Options{
		Concurrency: 1,
		Dedupe: &consumer.Dedupe{Store: st,
			Key: func(m consumer.Message) (string, error) { return m.Source.MessageID, nil }},
	}}, h, &fakePublisher{})
	ack := &fakeAck{}
	steps := []struct {
		do         func()
		held, busy int  // marks waiting, deliveries handled or waiting for the handler
		full       bool // run.full: no delivery taken from the broker
	}{
		{func() {}, 0, 0, false},
		{func() { p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 1, MessageId: "m1"}) }, 0, 1, false},
		// m1 handled (blocked), m2 waits for the handler: Prefetch busy.
		{func() { p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 2, MessageId: "m2"}) }, 0, 2, true},
		// m1 sent, its mark held: it no longer counts; m2 is handled.
		{func() { release <- struct{}{} }, 1, 1, false},
		{func() { p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 3, MessageId: "m3"}) }, 1, 2, true},
		{func() { release <- struct{}{} }, 2, 1, false},
		{func() { release <- struct{}{} }, 3, 0, false},
	}
	for i, s := range steps {
		s.do()
		waitFor(t, func() bool { return st.held() == s.held && p.busy.Load() == int64(s.busy) })
		if got := p.full(); got != s.full {
			t.Errorf("step %d: full %v, want %v (busy %d, in flight %d)", i, got, s.full, p.busy.Load(), p.inflight.Load())
		}
	}
	if n := p.inflight.Load(); n != 3 {
		t.Errorf("in flight with three marks held: %d, want 3", n)
	}
	st.land()
	p.wg.Wait()
	for tag := range uint64(3) {
		if got := ack.of(tag + 1); len(got) != 1 || got[0] != "ack multiple=false" {
			t.Errorf("delivery %d: acknowledger calls %q, want one ack", tag+1, got)
		}
	}
}

// TestDedupeMarksLeavePrefetchFreeBroker: against RabbitMQ, Prefetch 2
// and two handlers that send at once, the marks held: the broker sends
// two more deliveries while the first two wait for their marks (it sent
// only two before), and every message is acked once its mark landed.
func TestDedupeMarksLeavePrefetchFreeBroker(t *testing.T) {
	url := testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := testenv.Name(t, "throttle-test")
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	ready := func() int {
		info, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspecting %s: %v", q, err)
		}
		return info.Messages
	}
	const n = 6
	for i := range n {
		if err := ch.PublishWithContext(context.Background(), "", q, false, false,
			amqp.Publishing{MessageId: fmt.Sprintf("m%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the messages ready", func() bool { return ready() == n })

	st := &heldMarks{local: consumer.NewLocalDedupeStore()}
	var mu sync.Mutex
	sent := 0
	c, err := New(Config{URL: url, Queue: q, Prefetch: 2, Options: consumer.Options{
		Concurrency: 2, Logger: testenv.Logger(t, -8),
		Dedupe: &consumer.Dedupe{Store: st,
			Key: func(m consumer.Message) (string, error) { return m.Source.MessageID, nil }},
	}}, func(context.Context, consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sent++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	sentN := func() int {
		mu.Lock()
		defer mu.Unlock()
		return sent
	}
	// Four sent and their marks held: two within Prefetch, two in the
	// room beside it; two left in the queue.
	testenv.Eventually(t, 10*time.Second, "4 sent, 4 marks held, 2 ready", func() bool {
		return sentN() == 4 && st.held() == 4 && ready() == 2
	})
	st.land()
	testenv.Eventually(t, 10*time.Second, "6 sent, 2 marks held", func() bool {
		return sentN() == n && st.held() == 2 && ready() == 0
	})
	st.land()
	// The drain waits for the last acks; a delivery left unacked would
	// be back in the queue once Run closed its channel.
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, ok, err := ch.Get(q, true); err != nil || ok {
		t.Errorf("a message back in the queue after Run (%v): not acked", err)
	}
}
