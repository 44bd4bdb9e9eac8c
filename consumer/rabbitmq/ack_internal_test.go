package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/internal/testenv"
)

// fakeAck is an amqp.Acknowledger that records the calls per delivery tag.
type fakeAck struct {
	mu    sync.Mutex
	calls map[uint64][]string
	err   error // returned by every call, as by a closed channel
}

func (f *fakeAck) record(tag uint64, call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[uint64][]string{}
	}
	f.calls[tag] = append(f.calls[tag], call)
	return f.err
}

func (f *fakeAck) Ack(tag uint64, multiple bool) error {
	return f.record(tag, fmt.Sprintf("ack multiple=%v", multiple))
}

func (f *fakeAck) Nack(tag uint64, multiple, requeue bool) error {
	if requeue {
		return f.record(tag, fmt.Sprintf("requeue multiple=%v", multiple))
	}
	return f.record(tag, fmt.Sprintf("nack multiple=%v", multiple))
}

func (f *fakeAck) Reject(tag uint64, requeue bool) error {
	return f.record(tag, fmt.Sprintf("reject requeue=%v", requeue))
}

func (f *fakeAck) of(tag uint64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls[tag])
}

// fakePublisher answers each publish with the next of its results (nil
// after the last) and records what was published.
type fakePublisher struct {
	mu         sync.Mutex
	results    []error
	published  []amqp.Publishing
	exchanges  []string
	keys       []string
	declareErr error
	declared   map[string]int // the levels of each queue's delay queues
}

func (p *fakePublisher) declareDelay(queue string, levels int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.declareErr != nil {
		return p.declareErr
	}
	if p.declared == nil {
		p.declared = map[string]int{}
	}
	p.declared[queue] = levels
	return nil
}

func (p *fakePublisher) publish(_ context.Context, exchange, key string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.published = append(p.published, msg)
	p.exchanges = append(p.exchanges, exchange)
	p.keys = append(p.keys, key)
	if len(p.results) == 0 {
		return nil
	}
	err := p.results[0]
	p.results = p.results[1:]
	return err
}

// newTestRun returns a run of a Consumer that never connects, and a
// dispatcher for one session whose handler context is ctx.
func newTestRun(t *testing.T, ctx context.Context, cfg Config, h consumer.Handler, pub publisher) *dispatcher {
	t.Helper()
	cfg.URL = "amqp://guest:guest@127.0.0.1:1/"
	cfg.Queue = "sms"
	cfg.Logger = testenv.Logger(t, -8)
	cfg.ReconnectBackoff = time.Millisecond
	c, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	r := newRun(c, hctx, cancel)
	r.startWorkers()
	t.Cleanup(r.stopWorkers)
	return &dispatcher{run: r, ctx: hctx, pub: pub}
}

// deliverForTest hands d to p as serve does.
func (p *dispatcher) deliverForTest(d amqp.Delivery) {
	p.dispatch(p.item(d))
}

var fastRetry = consumer.RetryPolicy{MaxAttempts: 2, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}

// TestAckPaths drives each way a delivery can end through the consumer's
// dispatch and handle, with a fake Acknowledger: every delivery gets
// exactly one Ack or Nack, the right one, and dead letters are published
// with the reason and position headers before the ack.
func TestAckPaths(t *testing.T) {
	errDown := errors.New("503 provider down")
	tests := []struct {
		name       string
		handler    func(ctx context.Context, m consumer.Message) error
		noDLX      bool    // no dead-letter exchange known: nack
		pubResults []error // answers of the dead-letter publisher
		ackErr     error   // every ack/nack fails, as on a closed channel
		cancel     bool    // the session's context ends during the handler
		keyErr     bool    // the ordering key function fails
		declareErr error   // declaring the delay queue fails
		setAside   bool    // published to the delay queue
		want       string  // the one call
		published  int     // dead letters published
		dead       bool    // reported to Observer.DeadLettered
		wantErr    string  // x-throttle-error of the dead letter
		attempts   string  // x-throttle-attempts of the dead letter
	}{
		{name: "delivered", handler: ok, want: "ack multiple=false"},
		{name: "permanent: published then acked", handler: permanent, want: "ack multiple=false",
			published: 1, dead: true, wantErr: "400 bad number", attempts: "1"},
		{name: "out of attempts: published then acked", handler: failing(errDown), want: "ack multiple=false",
			published: 1, dead: true, wantErr: errDown.Error(), attempts: "2"},
		{name: "dead letter not confirmed at first: published again", handler: permanent, pubResults: []error{errNotConfirmed, errors.New("timeout")},
			want: "ack multiple=false", published: 3, dead: true, wantErr: "400 bad number", attempts: "1"},
		{name: "dead-letter channel closed: requeued", handler: permanent, pubResults: []error{errPublisherClosed},
			want: "requeue multiple=false", published: 1},
		{name: "no dead-letter exchange: nacked", handler: permanent, noDLX: true, want: "nack multiple=false", dead: true},
		{name: "unfinished at the drain deadline: requeued", handler: blockUntilDone, cancel: true, want: "requeue multiple=false"},
		{name: "ordering key fails: dead-lettered without a handler call", handler: ok, keyErr: true, want: "ack multiple=false",
			published: 1, dead: true, wantErr: "no key for you", attempts: "1"},
		{name: "set aside: published to the delay queue, then acked", handler: setAside, want: "ack multiple=false",
			published: 1, setAside: true},
		{name: "set aside without a delay queue: waited, then handled again", handler: setAsideOnce(), declareErr: errors.New("403"),
			want: "ack multiple=false"},
		{name: "ack on a closed channel: one call, logged", handler: ok, ackErr: amqp.ErrClosed, want: "ack multiple=false"},
		{name: "nack on a closed channel: one call, not reported", handler: permanent, noDLX: true, ackErr: amqp.ErrClosed, want: "nack multiple=false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pub := &fakePublisher{results: tt.pubResults}
			var deadN int
			var mu sync.Mutex
			cfg := Config{Options: consumer.Options{
				Retry:    fastRetry,
				SetAside: true,
				Observer: &consumer.MessageObserver{DeadLettered: func(consumer.Message, error) {
					mu.Lock()
					deadN++
					mu.Unlock()
				}},
			}}
			if !tt.noDLX {
				cfg.DeadLetterExchange = "sms.dlx"
			}
			if tt.keyErr {
				cfg.Ordering = consumer.OrderKey
				cfg.OrderingKey = func(consumer.Message) (string, error) { return "", errors.New("no key for you") }
			}
			calls := 0
			h := func(ctx context.Context, m consumer.Message) error {
				calls++
				if tt.cancel {
					cancel()
				}
				return tt.handler(ctx, m)
			}
			pub.declareErr = tt.declareErr
			p := newTestRun(t, ctx, cfg, h, pub)
			ack := &fakeAck{err: tt.ackErr}
			p.deliverForTest(amqp.Delivery{
				Acknowledger: ack, DeliveryTag: 7, MessageId: "m-7", Exchange: "in", RoutingKey: "eu.sms",
				Headers: amqp.Table{"trace": "abc", consumer.HeaderAttempts: "stale"}, Expiration: "60000", UserId: "alice",
				Body: []byte("hello"),
			})
			p.wg.Wait()

			if got := ack.of(7); len(got) != 1 || got[0] != tt.want {
				t.Fatalf("acknowledger calls %q, want exactly [%q]", got, tt.want)
			}
			if len(pub.published) != tt.published {
				t.Fatalf("published %d dead letters, want %d", len(pub.published), tt.published)
			}
			if (deadN == 1) != tt.dead || deadN > 1 {
				t.Fatalf("Observer.DeadLettered called %d times, want dead-lettered %v", deadN, tt.dead)
			}
			if tt.keyErr && calls != 0 {
				t.Fatalf("handler called %d times for a message without a key", calls)
			}
			if tt.setAside {
				m := pub.published[0]
				// It holds a paid slot, so it is asked back PaidLead (100
				// ms) before it is due: what is left of 150 ms when it is
				// published, rounded down to 10 ms units, is 14 units:
				// 0.1.1.1, from level 3.
				if pub.exchanges[0] != "sms.delay.03" || pub.keys[0] != "0.1.1.1" || m.Expiration != "" ||
					m.Headers[consumer.HeaderSetAsideReason] != "limit per-recipient: no room" || m.Headers["trace"] != "abc" ||
					m.Headers[setaside.HeaderPaid] != paidSlot ||
					string(m.Body) != "hello" || m.DeliveryMode != amqp.Persistent {
					t.Errorf("set aside as %+v to exchange %q key %q; want the message to sms.delay.03 with key 0.1.1.1, without expiration, with the reason and the paid slot",
						m, pub.exchanges[0], pub.keys[0])
				}
				due, err1 := time.Parse(time.RFC3339Nano, fmt.Sprint(m.Headers[consumer.HeaderDue]))
				back, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(m.Headers[headerBack]))
				if lead := due.Sub(back) - setaside.PaidLead; err1 != nil || err2 != nil || lead <= 0 || lead > delayUnit {
					t.Errorf("due %v, back %v: want back PaidLead and up to one unit before due (no lead without a measured lag)", m.Headers[consumer.HeaderDue], m.Headers[headerBack])
				}
				// The default MaxSetAside, 1 min, is 6000 units: 13 levels.
				if got := pub.declared["sms"]; got != 13 {
					t.Errorf("delay queues of sms declared with %d levels, want 13", got)
				}
				return
			}
			if !tt.dead || tt.noDLX {
				return
			}
			m := pub.published[len(pub.published)-1]
			want := map[string]any{
				consumer.HeaderError: tt.wantErr, consumer.HeaderAttempts: tt.attempts,
				HeaderOriginalQueue: "sms", HeaderOriginalExchange: "in",
				HeaderOriginalRoutingKey: "eu.sms", "trace": "abc",
			}
			for k, v := range want {
				if m.Headers[k] != v {
					t.Errorf("dead letter header %s = %v, want %v", k, m.Headers[k], v)
				}
			}
			if len(m.Headers) != len(want) || string(m.Body) != "hello" || m.MessageId != "m-7" ||
				m.DeliveryMode != amqp.Persistent || m.Expiration != "" || m.UserId != "" {
				t.Errorf("dead letter %+v: want the body, message id and headers, persistent, no expiration or user id", m)
			}
			if pub.exchanges[0] != "sms.dlx" || pub.keys[0] != "eu.sms" {
				t.Errorf("published to exchange %q with key %q, want sms.dlx and the original routing key", pub.exchanges[0], pub.keys[0])
			}
		})
	}
}

func ok(context.Context, consumer.Message) error { return nil }

func setAside(context.Context, consumer.Message) error {
	return setaside.With(errors.New("limit per-recipient: no room"), 250*time.Millisecond,
		map[string]string{setaside.HeaderPaid: paidSlot})
}

const paidSlot = `[{"layer":"per-recipient","key":"a","due":"2026-01-01T00:00:00Z"}]`

// setAsideOnce returns a handler that sets a message aside with a paid
// marker, then delivers it when it comes back with the marker.
func setAsideOnce() func(context.Context, consumer.Message) error {
	var calls atomic.Int32
	return func(_ context.Context, m consumer.Message) error {
		if calls.Add(1) == 1 {
			return setaside.With(errors.New("limit per-recipient: slot booked"), 10*time.Millisecond,
				map[string]string{setaside.HeaderPaid: `[{"layer":"per-recipient","key":"a"}]`})
		}
		if m.Headers[setaside.HeaderPaid] == "" {
			return consumer.Permanent(errors.New("came back without its paid marker"))
		}
		return nil
	}
}

func permanent(context.Context, consumer.Message) error {
	return consumer.Permanent(errors.New("400 bad number"))
}

func failing(err error) func(context.Context, consumer.Message) error {
	return func(context.Context, consumer.Message) error { return err }
}

func blockUntilDone(ctx context.Context, _ consumer.Message) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestKeyOrdering dispatches deliveries of three keys with OrderKey: while
// the first delivery of key a is held, key b's deliveries are all handled;
// a's others wait and then run in order; every delivery is acked once.
// At shutdown, deliveries still queued behind their key are requeued
// without a handler call.
func TestKeyOrdering(t *testing.T) {
	hold := make(chan struct{})
	var mu sync.Mutex
	var order []string
	h := func(_ context.Context, m consumer.Message) error {
		id := m.Source.MessageID
		if id == "a1" || id == "c1" {
			<-hold
		}
		mu.Lock()
		order = append(order, id)
		mu.Unlock()
		return nil
	}
	p := newTestRun(t, context.Background(), Config{
		Options: consumer.Options{Concurrency: 4, Ordering: consumer.OrderKey, OrderingKey: func(m consumer.Message) (string, error) { return m.Headers["from"], nil }},
	}, h, &fakePublisher{})
	ack := &fakeAck{}
	ids := []string{"a1", "a2", "b1", "b2", "a3", "b3", "c1", "c2"}
	for i, id := range ids {
		p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: uint64(i + 1), MessageId: id,
			Headers: amqp.Table{"from": id[:1]}})
	}
	// A failure below must not leave the held handlers blocking the
	// run's cleanup (it waits for them): the test used to hang until its
	// timeout when a check failed.
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	// All of b is handled while a1 and c1 are held.
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 3
	})
	mu.Lock()
	if !slices.Equal(order, []string{"b1", "b2", "b3"}) {
		t.Fatalf("while a1 and c1 are held, handled %v; want b1 b2 b3", order)
	}
	mu.Unlock()
	// b3's worker marks its key done after its handler returns: wait for
	// the queue to settle rather than read it once.
	waitFor(t, func() bool {
		keys, queued := p.queued()
		return keys == 2 && queued == 3 // a2 a3 c2
	})
	p.stopping.Store(true) // shutdown: c2, a2, a3 must not start
	release()
	p.wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order[3:], []string{"a1", "c1"}) && !slices.Equal(order[3:], []string{"c1", "a1"}) {
		t.Fatalf("after the release, handled %v; want a1 and c1 only", order[3:])
	}
	for i, id := range ids {
		want := "ack multiple=false"
		if id == "a2" || id == "a3" || id == "c2" {
			want = "requeue multiple=false"
		}
		if got := ack.of(uint64(i + 1)); len(got) != 1 || got[0] != want {
			t.Errorf("%s: acknowledger calls %q, want [%q]", id, got, want)
		}
	}
	if n := p.inflight.Load(); n != 0 {
		t.Errorf("in flight after all settled: %d", n)
	}
}

// TestKeyOrderingInOrder checks that a key's deliveries run one at a time,
// in delivery order, while many keys run at once.
func TestKeyOrderingInOrder(t *testing.T) {
	var mu sync.Mutex
	got := map[string][]int{}
	active := map[string]bool{}
	h := func(_ context.Context, m consumer.Message) error {
		key := m.Headers["from"]
		mu.Lock()
		if active[key] {
			t.Errorf("key %s handled twice at once", key)
		}
		active[key] = true
		mu.Unlock()
		time.Sleep(50 * time.Microsecond)
		mu.Lock()
		active[key] = false
		var n int
		fmt.Sscan(m.Source.MessageID, &n)
		got[key] = append(got[key], n)
		mu.Unlock()
		return nil
	}
	p := newTestRun(t, context.Background(), Config{
		Options: consumer.Options{Concurrency: 3, Ordering: consumer.OrderKey, OrderingKey: func(m consumer.Message) (string, error) { return m.Headers["from"], nil }},
	}, h, &fakePublisher{})
	ack := &fakeAck{}
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	for i := range 500 {
		p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: uint64(i + 1), MessageId: fmt.Sprint(i),
			Headers: amqp.Table{"from": keys[i*7%5]}})
	}
	p.wg.Wait()
	total := 0
	for _, k := range keys {
		total += len(got[k])
		if !slices.IsSorted(got[k]) {
			t.Errorf("key %s handled out of order: %v", k, got[k])
		}
	}
	if total != 500 {
		t.Fatalf("handled %d of 500", total)
	}
	for i := range 500 {
		if c := ack.of(uint64(i + 1)); len(c) != 1 || c[0] != "ack multiple=false" {
			t.Fatalf("delivery %d: calls %q", i, c)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSetAsidePaidHeaderOfTheCopy: a delivery set aside by a handler that
// names no headers (a plain consumer.SetAside) carries setaside.HeaderPaid
// to the delay queue only when it came back from there: the header a
// publisher wrote, which item dropped, is not published with the copy,
// where it would count when the copy comes back.
func TestSetAsidePaidHeaderOfTheCopy(t *testing.T) {
	for _, tt := range []struct {
		name    string
		headers amqp.Table
		want    any
	}{
		{"published with the header: dropped", amqp.Table{setaside.HeaderPaid: paidSlot}, nil},
		{"back from the delay queue: kept", amqp.Table{setaside.HeaderPaid: paidSlot,
			"x-death": []any{amqp.Table{"queue": "sms.delay", "reason": "expired"}}}, paidSlot},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pub := &fakePublisher{}
			h := func(context.Context, consumer.Message) error {
				return consumer.SetAside(errors.New("downstream 429"), 250*time.Millisecond)
			}
			p := newTestRun(t, context.Background(), Config{Options: consumer.Options{Retry: fastRetry, SetAside: true}}, h, pub)
			ack := &fakeAck{}
			p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 7, MessageId: "m-7", Headers: tt.headers, Body: []byte("hello")})
			p.wg.Wait()
			if got := ack.of(7); len(got) != 1 || got[0] != "ack multiple=false" || len(pub.published) != 1 {
				t.Fatalf("acknowledger calls %q, %d published; want acked after one copy", got, len(pub.published))
			}
			if got := pub.published[0].Headers[setaside.HeaderPaid]; got != tt.want {
				t.Errorf("the copy carries %s %v, want %v", setaside.HeaderPaid, got, tt.want)
			}
		})
	}
}
