package rabbitmq

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
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
