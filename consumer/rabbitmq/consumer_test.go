package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// tracker records every handler call, by message id.
type tracker struct {
	mu       sync.Mutex
	want     int
	calls    []time.Time
	seen     map[string]int
	redeliv  map[string]bool // ids handled with the redelivered flag
	done     chan struct{}
	doneOnce sync.Once
}

func newTracker(want int) *tracker {
	return &tracker{want: want, seen: map[string]int{}, redeliv: map[string]bool{}, done: make(chan struct{})}
}

// record notes a call for msg and returns how many distinct ids were seen.
func (tr *tracker) record(msg consumer.Message) int {
	now := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.calls = append(tr.calls, now)
	tr.seen[msg.Source.MessageID]++
	if msg.Source.Redelivered {
		tr.redeliv[msg.Source.MessageID] = true
	}
	if len(tr.seen) >= tr.want {
		tr.doneOnce.Do(func() { close(tr.done) })
	}
	return len(tr.seen)
}

// wait waits until every wanted id was handled, and fails the test after d.
func (tr *tracker) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-tr.done:
	case <-time.After(d):
		tr.mu.Lock()
		defer tr.mu.Unlock()
		t.Fatalf("only %d of %d messages handled after %v", len(tr.seen), tr.want, d)
	}
}

// missing returns the ids that were never handled.
func (tr *tracker) missing(ids []string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, id := range ids {
		if tr.seen[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

func newConsumer(t *testing.T, cfg rabbitmq.Config, h consumer.Handler) *rabbitmq.Consumer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c, err := rabbitmq.New(cfg, h)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// The shared-rate scenario (replicas on one queue and one Redis bucket
// deliver at the bucket's rate together) runs for both backends in the
// shared broker suite: integration/suite_scenarios_test.go, suiteSharedRate.

// TestReplicaCrash cuts one replica's connection while it holds unacked
// deliveries, and never lets it reconnect: the other replicas must handle
// every message.
func TestReplicaCrash(t *testing.T) {
	const (
		n        = 300
		prefetch = 10
		okBefore = 20 // messages the doomed replica acks before it hangs
	)
	b := newBroker(t)
	q := b.declareQueue(t)
	ids := b.publish(t, q, n)
	shared, err := limiter.NewLocal(300, 10)
	must(t, err)
	t.Cleanup(func() { _ = shared.Close() })

	tr := newTracker(n)
	var survivorCalls atomic.Int64
	survivor := func(_ context.Context, msg consumer.Message) error {
		survivorCalls.Add(1)
		tr.record(msg)
		return nil
	}
	// The doomed replica acks its first messages, then hangs on every
	// further one until its context ends, so that its whole prefetch is
	// in flight when it crashes.
	var (
		doomedOK   atomic.Int64
		hung       atomic.Int64
		allHung    = make(chan struct{})
		hungOnce   sync.Once
		abandoned  atomic.Int64
		doomedSeen sync.Map
	)
	doomed := func(ctx context.Context, msg consumer.Message) error {
		if doomedOK.Add(1) <= okBefore {
			tr.record(msg)
			return nil
		}
		doomedSeen.Store(msg.Source.MessageID, true)
		if hung.Add(1) == prefetch {
			hungOnce.Do(func() { close(allHung) })
		}
		<-ctx.Done()
		abandoned.Add(1)
		return ctx.Err()
	}

	p, proxied := newProxy(t, b.url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := rabbitmq.Config{Queue: q, Prefetch: prefetch, ReconnectBackoff: 50 * time.Millisecond, Options: consumer.Options{Limiter: shared}}
	cfg.URL = proxied
	doomedC := newConsumer(t, cfg, doomed)
	cfg.URL = b.url
	a, c := newConsumer(t, cfg, survivor), newConsumer(t, cfg, survivor)
	wait := runAll(t, ctx, doomedC.Run, a.Run, c.Run)

	select {
	case <-allHung:
	case <-time.After(20 * time.Second):
		t.Fatalf("the doomed replica never had %d deliveries in flight", prefetch)
	}
	p.close() // crash: connections reset, and no reconnect can succeed
	tr.wait(t, 30*time.Second)
	cancel()
	wait()

	if m := tr.missing(ids); len(m) > 0 {
		t.Fatalf("%d messages lost, first %s", len(m), m[0])
	}
	taken := 0
	doomedSeen.Range(func(k, _ any) bool {
		taken++
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if !tr.redeliv[k.(string)] {
			t.Errorf("message %s was in flight at the crash but no survivor handled it as redelivered", k)
		}
		return true
	})
	if got := b.waitReady(t, q, 0); got != 0 {
		t.Errorf("%d messages left in the queue, want 0 (all acked)", got)
	}
	t.Logf("replica crash: doomed replica acked %d and had %d in flight (%d abandoned); survivors handled %d calls, %d redelivered",
		okBefore, taken, abandoned.Load(), survivorCalls.Load(), len(tr.redeliv))
	if taken < prefetch {
		t.Errorf("doomed replica had %d deliveries in flight, want %d", taken, prefetch)
	}
}

// TestHandlerErrors checks retries and dead-lettering, against the real
// broker: a dead letter that the consumer publishes itself (with Declare,
// or with DeadLetterExchange set) carries the reason and position headers;
// without a known dead-letter exchange the consumer nacks, and RabbitMQ's
// x-death header is all there is.
func TestHandlerErrors(t *testing.T) {
	errSink := errors.New("sink unavailable")
	tests := []struct {
		name         string
		failures     int   // calls that fail before one succeeds; -1: all fail
		err          error // what the failing calls return
		wantAttempts int
		wantDLQ      bool
		topology     string // "declare", "dlx" (DeadLetterExchange only) or "none"
	}{
		{name: "retried then delivered", failures: 2, err: errSink, wantAttempts: 3, topology: "declare"},
		{name: "retried then dead-lettered", failures: -1, err: errSink, wantAttempts: 3, wantDLQ: true, topology: "declare"},
		{name: "permanent is not retried", failures: -1, err: consumer.Permanent(errSink), wantAttempts: 1, wantDLQ: true, topology: "declare"},
		{name: "dead-letter exchange named without declare", failures: -1, err: consumer.Permanent(errSink), wantAttempts: 1, wantDLQ: true, topology: "dlx"},
		{name: "no dead-letter exchange known: nacked", failures: -1, err: consumer.Permanent(errSink), wantAttempts: 1, wantDLQ: true, topology: "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBroker(t)
			q := b.declareQueue(t)
			b.publish(t, q, 1)

			var calls atomic.Int64
			h := func(_ context.Context, msg consumer.Message) error {
				calls.Add(1)
				if tt.failures < 0 || msg.Attempt <= tt.failures {
					return tt.err
				}
				return nil
			}
			ended := make(chan consumer.Message, 1)
			var deadErr error
			obs := &consumer.MessageObserver{
				Delivered: func(m consumer.Message) { ended <- m },
				DeadLettered: func(m consumer.Message, err error) {
					deadErr = err
					ended <- m
				},
			}
			cfg := rabbitmq.Config{
				URL:   b.url,
				Queue: q,
				Options: consumer.Options{
					Retry:    consumer.RetryPolicy{MaxAttempts: 3, Backoff: 10 * time.Millisecond},
					Observer: obs,
				},
			}
			switch tt.topology {
			case "declare":
				cfg.Declare = true
			case "dlx":
				cfg.DeadLetterExchange = q + ".dlx"
			}
			c := newConsumer(t, cfg, h)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wait := runAll(t, ctx, c.Run)

			var m consumer.Message
			select {
			case m = <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("message neither delivered nor dead-lettered after 10s")
			}
			if m.Attempt != tt.wantAttempts || int(calls.Load()) != tt.wantAttempts {
				t.Errorf("attempts: observed %d, handler calls %d, want %d", m.Attempt, calls.Load(), tt.wantAttempts)
			}
			if tt.wantDLQ && !errors.Is(deadErr, errSink) {
				t.Errorf("dead-letter error %v, want %v", deadErr, errSink)
			}

			dlq, err := b.ch.Consume(q+".dlq", "", true, false, false, false, nil)
			must(t, err)
			select {
			case d := <-dlq:
				if !tt.wantDLQ {
					t.Fatalf("message %s in the dead-letter queue, want delivered", d.MessageId)
				}
				if d.MessageId != "m-0000" {
					t.Errorf("dead-lettered message id %q, want m-0000", d.MessageId)
				}
				if tt.topology == "none" {
					deaths, _ := d.Headers["x-death"].([]any)
					if len(deaths) == 0 {
						t.Fatalf("nacked message has no x-death header: %v", d.Headers)
					}
					death, _ := deaths[0].(amqp.Table)
					if death["queue"] != q || death["reason"] != "rejected" {
						t.Errorf("x-death %v, want queue %s and reason rejected", death, q)
					}
					break
				}
				want := amqp.Table{
					consumer.HeaderError:              errSink.Error(),
					consumer.HeaderAttempts:           strconv.Itoa(tt.wantAttempts),
					rabbitmq.HeaderOriginalQueue:      q,
					rabbitmq.HeaderOriginalExchange:   "", // published to the default exchange
					rabbitmq.HeaderOriginalRoutingKey: q,
				}
				if !maps.Equal(d.Headers, want) {
					t.Errorf("dead letter headers %v, want %v (and no x-death: the consumer published it)", d.Headers, want)
				}
				if d.DeliveryMode != amqp.Persistent || string(d.Body) != "body m-0000" {
					t.Errorf("dead letter: mode %d, body %q; want persistent with the original body", d.DeliveryMode, d.Body)
				}
			case <-time.After(500 * time.Millisecond):
				if tt.wantDLQ {
					t.Fatal("no message in the dead-letter queue after 500ms")
				}
			}
			cancel()
			wait()
			if got := b.waitReady(t, q, 0); got != 0 {
				t.Errorf("%d messages left in the queue, want 0", got)
			}
		})
	}
}

// TestBrokenConnection resets the consumer's connection mid-run: it must
// reconnect, and every message must be handled.
func TestBrokenConnection(t *testing.T) {
	const n, cutAt = 200, 60
	b := newBroker(t)
	q := b.declareQueue(t)
	ids := b.publish(t, q, n)
	local, err := limiter.NewLocal(200, 10)
	must(t, err)
	t.Cleanup(func() { _ = local.Close() })

	tr := newTracker(n)
	cutNow := make(chan struct{})
	var cutOnce sync.Once
	h := func(ctx context.Context, msg consumer.Message) error {
		// Redeliveries of handled messages return the same count again.
		if tr.record(msg) >= cutAt {
			cutOnce.Do(func() { close(cutNow) })
		}
		return nil
	}
	var reconnects atomic.Int64
	var cause error
	obs := &consumer.MessageObserver{Reconnected: func(broker string, err error) {
		if broker == rabbitmq.Broker {
			cause = err
			reconnects.Add(1)
		}
	}}
	p, proxied := newProxy(t, b.url)
	c := newConsumer(t, rabbitmq.Config{URL: proxied, Queue: q, Prefetch: 20, Options: consumer.Options{Limiter: local, Observer: obs}}, h)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)

	select {
	case <-cutNow:
	case <-time.After(20 * time.Second):
		t.Fatalf("fewer than %d messages handled after 20s", cutAt)
	}
	p.cut()
	tr.wait(t, 30*time.Second)
	cancel()
	wait()

	if got := reconnects.Load(); got != 1 {
		t.Errorf("%d reconnects, want 1", got)
	}
	if cause == nil {
		t.Error("reconnect reported no cause")
	}
	if m := tr.missing(ids); len(m) > 0 {
		t.Fatalf("%d messages never handled, first %s", len(m), m[0])
	}
	if got := b.waitReady(t, q, 0); got != 0 {
		t.Errorf("%d messages left in the queue, want 0", got)
	}
	t.Logf("broken connection: %d reconnect(s) after %v; %d calls for %d messages, %d redelivered",
		reconnects.Load(), cause, len(tr.calls), n, len(tr.redeliv))
}

// TestQueueRecreated deletes the queue under a running consumer, which makes
// the broker cancel it, and declares it again: the consumer must keep
// retrying and resume on the new queue.
func TestQueueRecreated(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	b.publish(t, q, 1)

	tr := newTracker(2)
	first := make(chan struct{})
	var firstOnce sync.Once
	h := func(_ context.Context, msg consumer.Message) error {
		tr.record(msg)
		firstOnce.Do(func() { close(first) })
		return nil
	}
	var reconnects atomic.Int64
	obs := &consumer.MessageObserver{Reconnected: func(string, error) { reconnects.Add(1) }}
	c := newConsumer(t, rabbitmq.Config{
		URL:                 b.url,
		Queue:               q,
		Declare:             false,
		ReconnectBackoff:    20 * time.Millisecond,
		MaxReconnectBackoff: 100 * time.Millisecond,
		Options: consumer.Options{
			Observer: obs,
		},
	}, h)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("first message not handled after 10s")
	}
	_, err := b.ch.QueueDelete(q, false, false, false)
	must(t, err)
	time.Sleep(300 * time.Millisecond) // let the consumer fail a few times
	_, err = b.ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": q + ".dlx"})
	must(t, err)
	// m-0000 again, but the tracker counts ids: publish a second one.
	_, err = b.ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{MessageId: "after"})
	must(t, err)
	tr.wait(t, 10*time.Second)
	cancel()
	wait()
	if reconnects.Load() != 1 {
		t.Errorf("%d reconnects, want 1", reconnects.Load())
	}
}

// The graceful-shutdown scenario (in-flight handlers finish within the
// drain timeout or are cancelled at its deadline; nothing starts after
// shutdown began; only what finished is acked) runs for both backends in
// the shared broker suite: integration/suite_scenarios_test.go,
// suiteGracefulShutdown.

// TestRunMissingQueue checks that a first connect refused by the broker
// fails Run at once, naming the queue.
func TestRunMissingQueue(t *testing.T) {
	b := newBroker(t)
	q := testenv.Name(t, "throttle-test")
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q}, func(context.Context, consumer.Message) error { return nil })
	ctx := testenv.Context(t, 10*time.Second)
	err := c.Run(ctx)
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
		t.Fatalf("Run returned %v, want a NOT_FOUND *amqp.Error", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run retried until the test deadline instead of failing at once")
	}
}

// TestWarnsWhenItCannotVouchForTheDeadLetterExchange checks that a consumer
// that does not declare its queue says, once, that a queue without a
// dead-letter exchange would make RabbitMQ drop failed messages.
func TestWarnsWhenItCannotVouchForTheDeadLetterExchange(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	for _, tc := range []struct {
		declare bool
		dlx     string
		warn    int
	}{{false, "", 1}, {true, "", 0}, {false, q + ".dlx", 0}} {
		var logs testenv.Buffer
		c := newConsumer(t, rabbitmq.Config{
			URL:                b.url,
			Queue:              q,
			Declare:            tc.declare,
			DeadLetterExchange: tc.dlx,
			Options: consumer.Options{
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			},
		}, func(context.Context, consumer.Message) error { return nil })
		ctx, cancel := context.WithCancel(context.Background())
		wait := runAll(t, ctx, c.Run)
		cancel()
		wait()
		var lines []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "no dead-letter exchange known") {
				lines = append(lines, l)
			}
		}
		if len(lines) != tc.warn {
			t.Errorf("Declare %v, DeadLetterExchange %q: the warning was logged %d times, want %d:\n%s", tc.declare, tc.dlx, len(lines), tc.warn, logs.String())
		}
		for _, l := range lines {
			if n := strings.Count(l, " queue="); n != 1 {
				t.Errorf("the warning has %d queue attributes, want 1: %s", n, l)
			}
		}
	}
}

// TestAccessRefusedAtStart checks that a broker refusing the login or the
// virtual host at start ends Run at once with consumer.ErrAccessRefused
// (so the binary exits 1), instead of retrying forever, and that the
// error does not show the password.
func TestAccessRefusedAtStart(t *testing.T) {
	b := newBroker(t)
	u, err := url.Parse(b.url)
	must(t, err)
	wrongPassword := *u
	wrongPassword.User = url.UserPassword(u.User.Username(), "wrong-s3cret")
	noVhost := *u
	noVhost.Path = "/" + testenv.Name(t, "throttle-test")
	for name, raw := range map[string]string{"wrong password": wrongPassword.String(), "unknown vhost": noVhost.String()} {
		t.Run(name, func(t *testing.T) {
			var attempts atomic.Int64
			c := newConsumer(t, rabbitmq.Config{URL: raw, Queue: "q", ReconnectBackoff: 10 * time.Millisecond,
				Options: consumer.Options{Observer: &consumer.MessageObserver{ReconnectAttempt: func(string, error) { attempts.Add(1) }}}},
				func(context.Context, consumer.Message) error { return nil })
			ctx := testenv.Context(t, 30*time.Second)
			start := time.Now()
			err := c.Run(ctx)
			if !errors.Is(err, consumer.ErrAccessRefused) {
				t.Fatalf("Run returned %v after %v, want an error wrapping consumer.ErrAccessRefused", err, time.Since(start))
			}
			if strings.Contains(err.Error(), "wrong-s3cret") {
				t.Errorf("error shows the password: %v", err)
			}
			if cerr := c.Connected(); !errors.Is(cerr, rabbitmq.ErrNotConnected) {
				t.Errorf("Connected after a refused start = %v, want ErrNotConnected", cerr)
			}
			t.Logf("%s: Run returned after %v and %d retries: %v", name, time.Since(start).Round(time.Millisecond), attempts.Load(), err)
		})
	}
}

// TestDisconnectedState checks what a replica reports while it cannot
// reach the broker at run time: Connected returns ErrNotConnected with the
// cause, every reconnect attempt is reported (Observer.ReconnectAttempt),
// the loss once (Observer.Disconnected), and once the broker is back,
// Connected returns nil and Reconnected is reported.
func TestDisconnectedState(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	var mu sync.Mutex
	var failed, succeeded, lost, back int
	obs := &consumer.MessageObserver{
		ReconnectAttempt: func(_ string, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
			} else {
				succeeded++
			}
		},
		Disconnected: func(string, error) { mu.Lock(); lost++; mu.Unlock() },
		Reconnected:  func(string, error) { mu.Lock(); back++; mu.Unlock() },
	}
	p, proxied := newProxy(t, b.url)
	c := newConsumer(t, rabbitmq.Config{URL: proxied, Queue: q, ReconnectBackoff: 10 * time.Millisecond,
		MaxReconnectBackoff: 50 * time.Millisecond, Options: consumer.Options{Observer: obs}},
		func(context.Context, consumer.Message) error { return nil })
	if err := c.Connected(); !errors.Is(err, rabbitmq.ErrNotConnected) {
		t.Fatalf("Connected before Run = %v, want ErrNotConnected", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)
	eventually(t, "connected", func() bool { return c.Connected() == nil })

	p.refuseNew(true)
	p.cut()
	eventually(t, "disconnected", func() bool { return c.Connected() != nil })
	eventually(t, "three failed attempts reported", func() bool { mu.Lock(); defer mu.Unlock(); return failed >= 3 })
	if err := c.Connected(); !errors.Is(err, rabbitmq.ErrNotConnected) {
		t.Errorf("Connected while the broker is unreachable = %v, want ErrNotConnected", err)
	}
	p.refuseNew(false)
	eventually(t, "reconnected", func() bool { return c.Connected() == nil })
	cancel()
	wait()
	mu.Lock()
	defer mu.Unlock()
	if lost != 1 || back != 1 || succeeded != 1 {
		t.Errorf("Disconnected %d, Reconnected %d, successful attempts %d; want 1 each", lost, back, succeeded)
	}
	if err := c.Connected(); !errors.Is(err, rabbitmq.ErrNotConnected) {
		t.Errorf("Connected after Run returned = %v, want ErrNotConnected", err)
	}
	t.Logf("%d failed reconnect attempts reported, then 1 successful", failed)
}

// eventually polls cond until it holds, for up to 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s after 20s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOrderingKey runs ordering by key against the broker: the messages of
// one sender (a header) are handled one at a time in publish order, while
// the other senders' messages proceed past a slow sender's.
func TestOrderingKey(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	const perKey = 15
	senders := []string{"slow", "fast1", "fast2"}
	ctx := testenv.Context(t, 30*time.Second)
	var confirms []*amqp.DeferredConfirmation
	for i := range perKey {
		for _, s := range senders {
			dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
				MessageId: fmt.Sprintf("%s-%02d", s, i), Headers: amqp.Table{"x-from": s}, Body: []byte("x"),
			})
			must(t, err)
			confirms = append(confirms, dc)
		}
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}

	var mu sync.Mutex
	handled := map[string][]string{}
	var order []string
	active := map[string]bool{}
	h := func(_ context.Context, m consumer.Message) error {
		from := m.Headers["x-from"]
		mu.Lock()
		if active[from] {
			t.Errorf("sender %s handled twice at once", from)
		}
		active[from] = true
		mu.Unlock()
		if from == "slow" {
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		active[from] = false
		handled[from] = append(handled[from], m.Source.MessageID)
		order = append(order, from)
		mu.Unlock()
		return nil
	}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Prefetch: 3 * perKey,
		Options: consumer.Options{Concurrency: 3, Ordering: consumer.OrderKey, OrderingKey: func(m consumer.Message) (string, error) { return m.Headers["x-from"], nil }}}, h)
	runCtx, cancel := context.WithCancel(context.Background())
	wait := runAll(t, runCtx, c.Run)
	eventually(t, "all handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 3*perKey })
	cancel()
	wait()
	for _, s := range senders {
		if got := handled[s]; len(got) != perKey || !slices.IsSorted(got) {
			t.Errorf("sender %s: handled %v, want %d in publish order", s, got, perKey)
		}
	}
	// The fast senders do not wait behind the slow one: they are done
	// before the slow sender's second half.
	lastFast := 0
	for i, from := range order {
		if from != "slow" {
			lastFast = i
		}
	}
	slowBefore := 0
	for _, from := range order[:lastFast] {
		if from == "slow" {
			slowBefore++
		}
	}
	if slowBefore > perKey/2 {
		t.Errorf("%d of the slow sender's %d messages were handled before the fast senders finished; they waited behind it", slowBefore, perKey)
	}
	if got := b.waitReady(t, q, 0); got != 0 {
		t.Errorf("%d messages left in the queue", got)
	}
	t.Logf("slow sender: %d of %d handled before the fast senders were done", slowBefore, perKey)
}

// TestSetAside runs a handler that asks, the first time it sees each
// message, to set it aside for 300ms (as a layered limit with on_exceed
// delay does): the message goes to the delay queues ("<queue>.delay.NN"),
// comes back to the queue when due (its paid slot: setaside.PaidLead
// ahead), and is delivered then, while the handler is free meanwhile.
// Nothing is lost or left in any queue.
func TestSetAside(t *testing.T) {
	const n, delay = 5, 300 * time.Millisecond
	b := newBroker(t)
	q := b.declareQueue(t)
	ids := b.publish(t, q, n)

	var mu sync.Mutex
	first := map[string]time.Time{}
	second := map[string]time.Time{}
	reasons := map[string]string{}
	paid := map[string]string{}
	const slot = `[{"layer":"per-recipient","key":"a","due":"2026-01-01T00:00:00Z"}]`
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		id := m.Source.MessageID
		if _, seen := first[id]; !seen {
			first[id] = time.Now()
			return setaside.With(errors.New("limit per-recipient: 5 per 1h"), delay, map[string]string{setaside.HeaderPaid: slot})
		}
		second[id] = time.Now()
		reasons[id] = m.Headers[consumer.HeaderSetAsideReason]
		paid[id] = m.Headers[setaside.HeaderPaid]
		return nil
	}
	var setAside atomic.Int64
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q,
		Options: consumer.Options{Concurrency: 1, SetAside: true, Observer: &consumer.MessageObserver{SetAside: func(consumer.Message, time.Duration) { setAside.Add(1) }}}}, h)
	ctx, cancel := context.WithCancel(context.Background())
	wait := runAll(t, ctx, c.Run)
	eventually(t, "every message delivered after its delay", func() bool { mu.Lock(); defer mu.Unlock(); return len(second) == n })
	cancel()
	wait()
	mu.Lock()
	defer mu.Unlock()
	var firstRound time.Time
	for _, id := range ids {
		// Its paid slot is handed on setaside.PaidLead ahead: the
		// limiter waits for it.
		if waited := second[id].Sub(first[id]); waited < delay-setaside.PaidLead-50*time.Millisecond {
			t.Errorf("%s came back after %v, want at least the %v delay less the %v lead", id, waited, delay, setaside.PaidLead)
		}
		if reasons[id] != "limit per-recipient: 5 per 1h" {
			t.Errorf("%s came back with reason header %q", id, reasons[id])
		}
		if paid[id] != slot {
			t.Errorf("%s came back with %s %q, want the slot it was set aside with", id, setaside.HeaderPaid, paid[id])
		}
		if first[id].After(firstRound) {
			firstRound = first[id]
		}
	}
	// With one handler, all five were set aside before the first came
	// back: none held the handler for its delay.
	for _, id := range ids {
		if second[id].Before(firstRound) {
			t.Errorf("%s came back before every message had been seen once", id)
		}
	}
	if got := setAside.Load(); got != n {
		t.Errorf("Observer.SetAside called %d times, want %d", got, n)
	}
	if got := b.waitReady(t, q, 0); got != 0 {
		t.Errorf("%d messages left in the queue", got)
	}
	if got := b.waitDelayEmpty(t, q); got != 0 {
		t.Errorf("%d messages left in the delay queues", got)
	}
	t.Logf("%d messages set aside for %v each and delivered when they came back", n, delay)
}

// TestSetAsideOutOfOrder sets 10 messages aside, the first for 2 s, each
// next one 200 ms less: each must come back when due, not when the delay
// set aside before it is. With a per-message TTL in one delay queue,
// RabbitMQ expired a message only at the queue's head, and all 10 came
// back together after 2 s (the last one 1.8 s late).
func TestSetAsideOutOfOrder(t *testing.T) {
	const n, step = 10, 200 * time.Millisecond
	b := newBroker(t)
	q := b.declareQueue(t)
	ids := b.publish(t, q, n)
	delay := map[string]time.Duration{}
	for i, id := range ids {
		delay[id] = time.Duration(n-i) * step
	}
	var mu sync.Mutex
	first := map[string]time.Time{}
	late := map[string]time.Duration{}
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		id := m.Source.MessageID
		if _, seen := first[id]; !seen {
			first[id] = time.Now()
			return consumer.SetAside(errors.New("not now"), delay[id])
		}
		late[id] = time.Since(first[id]) - delay[id]
		return nil
	}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Options: consumer.Options{Concurrency: 1, SetAside: true}}, h)
	ctx, cancel := context.WithCancel(context.Background())
	wait := runAll(t, ctx, c.Run)
	eventually(t, "every message back", func() bool { mu.Lock(); defer mu.Unlock(); return len(late) == n })
	cancel()
	wait()
	mu.Lock()
	defer mu.Unlock()
	var got []time.Duration
	for _, id := range ids {
		got = append(got, late[id].Round(time.Millisecond))
		// Back late by 2 to 7 ms on an idle machine, up to 180 ms
		// under load; never early: the handler waits for the due time.
		if late[id] < 0 || late[id] > 400*time.Millisecond {
			t.Errorf("%s, set aside for %v, came back %v late, want 0 to 400ms", id, delay[id], late[id].Round(time.Millisecond))
		}
	}
	if left := b.waitDelayEmpty(t, q); left != 0 {
		t.Errorf("%d messages left in the delay queues", left)
	}
	t.Logf("set aside for 2s, 1.8s, ... 200ms: back late by %v", got)
}

// TestSetAsideTwice sets each message aside twice through the same delay
// levels: it must come back both times. RabbitMQ drops a message that
// would be dead-lettered into a queue its x-death header already names
// (a cycle without a rejection), and the copy set aside again carried the
// x-death of its first pass: all 5 were lost.
func TestSetAsideTwice(t *testing.T) {
	const n, delay = 5, 300 * time.Millisecond
	b := newBroker(t)
	q := b.declareQueue(t)
	b.publish(t, q, n)
	var mu sync.Mutex
	seen := map[string]int{}
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		id := m.Source.MessageID
		if seen[id]++; seen[id] <= 2 {
			return consumer.SetAside(errors.New("not now"), delay)
		}
		return nil
	}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Options: consumer.Options{SetAside: true}}, h)
	ctx, cancel := context.WithCancel(context.Background())
	wait := runAll(t, ctx, c.Run)
	eventually(t, "every message back twice", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range seen {
			if k < 3 {
				return false
			}
		}
		return len(seen) == n
	})
	cancel()
	wait()
	if left := b.waitDelayEmpty(t, q); left != 0 {
		t.Errorf("%d messages left in the delay queues", left)
	}
}

// TestDeadLetterExchangeMissing checks that a DeadLetterExchange that does
// not exist (without Declare) ends Run at start with NOT_FOUND naming it,
// rather than closing the channel at the first dead letter.
func TestDeadLetterExchangeMissing(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	dlx := testenv.Name(t, "throttle-test-no-dlx")
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, DeadLetterExchange: dlx},
		func(context.Context, consumer.Message) error { return nil })
	ctx := testenv.Context(t, 10*time.Second)
	err := c.Run(ctx)
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound || !strings.Contains(err.Error(), strconv.Quote(dlx)) {
		t.Fatalf("Run returned %v, want a NOT_FOUND naming exchange %q", err, dlx)
	}
	if ctx.Err() != nil {
		t.Fatal("Run retried until the test deadline instead of failing at once")
	}
}

// TestDelayQueuesDeclaredOnConnect: a Consumer with Options.SetAside
// declares its delay queues when it connects, before any message asks to
// be set aside (declared at the first set-aside, on a loaded broker the
// declares held that message up to seconds past its booked slot); one
// without it declares none.
func TestDelayQueuesDeclaredOnConnect(t *testing.T) {
	b := newBroker(t)
	exists := func(q string) bool {
		conn, err := amqp.Dial(b.url)
		must(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		must(t, err)
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil
	}
	for _, setAside := range []bool{true, false} {
		q := b.declareQueue(t)
		c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Options: consumer.Options{SetAside: setAside}}, nop)
		ctx, cancel := context.WithCancel(context.Background())
		wait := runAll(t, ctx, c.Run)
		eventually(t, "connected", func() bool { return c.Connected() == nil })
		for _, dq := range rabbitmq.DelayQueues(q, kit.DefaultMaxSetAside) {
			if got := exists(dq); got != setAside {
				t.Errorf("SetAside %v: delay queue %s exists: %v, want %v", setAside, dq, got, setAside)
			}
		}
		cancel()
		wait()
	}
}
