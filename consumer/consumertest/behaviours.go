package consumertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// fastRetry retries at once, to keep the suite quick.
var fastRetry = consumer.RetryPolicy{MaxAttempts: 3, Backoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}

// testThrottle: n messages through a limiter of rate r with a burst of
// one take at least (n-1)/r from the first handler call to the last,
// with four handlers.
func testThrottle(t *testing.T, src Source) {
	const rate, n = 40.0, 12
	lim, err := limiter.NewLocal(rate, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Limiter: lim, Concurrency: 4, Ordering: consumer.OrderNone},
		func(_ context.Context, m consumer.Message) error {
			rec.enter(m)()
			return nil
		})
	in := msgs("t", n, 4)
	src.Publish(t, in...)
	start(t, c)
	rec.waitIDs(t, in, "every message handled")
	calls := rec.snapshot()
	span := calls[len(calls)-1].at.Sub(calls[0].at)
	// One token at the start (the burst), then one per 1/rate; a little
	// slack for the clocks.
	if want := time.Duration(float64(n-1) / rate * float64(time.Second) * 0.95); span < want {
		t.Errorf("%d messages handled within %v at a limit of %v/s; want at least %v", n, span, rate, want)
	}
	if got := rec.ids(); len(got) != n {
		t.Errorf("handled %d distinct messages, want %d", len(got), n)
	}
}

// testRetry: a handler that fails twice is called three times, with
// Message.Attempt 1, 2, 3 and the message's headers each time, and the
// message is delivered, not dead-lettered.
func testRetry(t *testing.T, src Source) {
	const n = 4
	var obs observed
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Retry: fastRetry, Observer: obs.observer()},
		func(_ context.Context, m consumer.Message) error {
			rec.enter(m)()
			if m.Attempt < 3 {
				return fmt.Errorf("attempt %d: %w", m.Attempt, errSentinel)
			}
			return nil
		})
	in := msgs("r", n, 2)
	src.Publish(t, in...)
	start(t, c)
	testenv.Eventually(t, timeout, "every message delivered", func() bool { return obs.get(&obs.delivered) == n })
	attempts := map[string][]int{}
	for _, cl := range rec.snapshot() {
		attempts[cl.id] = append(attempts[cl.id], cl.attempt)
		if cl.headers["x-trace"] != "trace-"+cl.id {
			t.Errorf("%s attempt %d: header x-trace %q, want the message's", cl.id, cl.attempt, cl.headers["x-trace"])
		}
	}
	for _, m := range in {
		if got := fmt.Sprint(attempts[idOf(m)]); got != "[1 2 3]" {
			t.Errorf("%s: attempts %s, want [1 2 3]", idOf(m), got)
		}
	}
	if r, d := obs.get(&obs.retried), obs.get(&obs.dead); r != 2*n || d != 0 {
		t.Errorf("observed %d retries and %d dead letters, want %d and 0", r, d, 2*n)
	}
}

// testDeadLetter: a permanent error and a panic are dead-lettered after
// one attempt, a handler that keeps failing after the last one, each
// with the reason headers, its own headers and body; a delivered message
// is not.
func testDeadLetter(t *testing.T, src Source) {
	var obs observed
	lines, log := newLogs(t)
	c := src.NewConsumer(t, consumer.Options{Retry: consumer.RetryPolicy{MaxAttempts: 2, Backoff: 5 * time.Millisecond}, Observer: obs.observer(), Logger: log},
		func(_ context.Context, m consumer.Message) error {
			switch id := idOf(m); {
			case strings.HasPrefix(id, "bad"):
				return consumer.Permanent(errors.New("400 bad payload"))
			case strings.HasPrefix(id, "panic"):
				panic("poison message")
			case strings.HasPrefix(id, "flaky"):
				return errSentinel
			}
			return nil
		})
	src.Publish(t, msg("ok-1", "k"), msg("bad-1", "k"), msg("panic-1", "k"), msg("flaky-1", "k"), msg("ok-2", "k"))
	start(t, c)
	dead := map[string]consumer.Message{}
	for _, m := range src.DeadLetters(t, 3) {
		dead[idOf(m)] = m
	}
	want := []struct{ id, err, attempts string }{
		{"bad-1", "400 bad payload", "1"},
		{"panic-1", "handler panicked", "1"},
		{"flaky-1", errSentinel.Error(), "2"},
	}
	for _, w := range want {
		m, ok := dead[w.id]
		if !ok {
			t.Errorf("%s not dead-lettered (dead letters: %v)", w.id, keys(dead))
			continue
		}
		if !strings.Contains(m.Headers[consumer.HeaderError], w.err) || m.Headers[consumer.HeaderAttempts] != w.attempts {
			t.Errorf("%s dead-lettered with %s %q and %s %q, want one containing %q and %s",
				w.id, consumer.HeaderError, m.Headers[consumer.HeaderError], consumer.HeaderAttempts, m.Headers[consumer.HeaderAttempts], w.err, w.attempts)
		}
		if m.Headers["x-trace"] != "trace-"+w.id || string(m.Body) != "body of "+w.id {
			t.Errorf("%s dead-lettered with header x-trace %q and body %q, want the message's", w.id, m.Headers["x-trace"], m.Body)
		}
	}
	for id := range dead {
		if strings.HasPrefix(id, "ok") {
			t.Errorf("delivered message %s was dead-lettered", id)
		}
	}
	testenv.Eventually(t, timeout, "three dead letters observed", func() bool { return obs.get(&obs.dead) == 3 })
	testenv.Eventually(t, timeout, "two messages delivered", func() bool { return obs.get(&obs.delivered) == 2 })
	lines.want(t, slog.LevelWarn, "message dead-lettered", "broker", "attempts", "err", "destination")
}

// testSetAside: with Options.SetAside, a message whose handler sets it
// aside frees the handler (with one handler, every message is set aside
// before any comes back), is counted in Backlog as SetAside while it
// waits, and comes back no sooner than asked, with consumer.HeaderDue
// and consumer.HeaderSetAsideReason.
func testSetAside(t *testing.T, src Source) {
	const n, delay = 4, 800 * time.Millisecond
	const reason = "layer per-recipient: not before its slot"
	var obs observed
	lines, log := newLogs(t)
	rec := newRecorder()
	var mu sync.Mutex
	first := map[string]time.Time{}
	c := src.NewConsumer(t, consumer.Options{SetAside: true, Concurrency: 1, Observer: obs.observer(), Logger: log},
		func(_ context.Context, m consumer.Message) error {
			rec.enter(m)()
			mu.Lock()
			defer mu.Unlock()
			if _, seen := first[idOf(m)]; !seen {
				first[idOf(m)] = time.Now()
				return consumer.SetAside(errors.New(reason), delay)
			}
			return nil
		})
	in := msgs("s", n, 2)
	src.Publish(t, in...)
	start(t, c)
	testenv.Eventually(t, timeout, "a message set aside", func() bool { return obs.get(&obs.setAside) > 0 })
	counted := testenv.Within(delay, func() bool { return backlog(t, c).SetAside > 0 })
	rec.waitCalls(t, 2*n, "every message back")
	if !counted {
		t.Errorf("BacklogParts never counted a message set aside within %v", delay)
	}
	calls := rec.snapshot()
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]bool{}
	for _, cl := range calls[:n] {
		if seen[cl.id] {
			t.Fatalf("%s came back before every message was set aside once: the handler was held (calls %v)", cl.id, order(calls))
		}
		seen[cl.id] = true
	}
	for _, cl := range calls[n:] {
		back := cl.at.Sub(first[cl.id])
		if back < delay-10*time.Millisecond || back > delay+10*time.Second {
			t.Errorf("%s came back after %v, want %v", cl.id, back, delay)
		}
		if _, err := time.Parse(time.RFC3339Nano, cl.headers[consumer.HeaderDue]); err != nil {
			t.Errorf("%s came back with %s %q: %v", cl.id, consumer.HeaderDue, cl.headers[consumer.HeaderDue], err)
		}
		if cl.headers[consumer.HeaderSetAsideReason] != reason || cl.headers["x-trace"] != "trace-"+cl.id {
			t.Errorf("%s came back with %s %q and x-trace %q, want %q and its own", cl.id,
				consumer.HeaderSetAsideReason, cl.headers[consumer.HeaderSetAsideReason], cl.headers["x-trace"], reason)
		}
	}
	if got := obs.get(&obs.setAside); got != n {
		t.Errorf("MessageObserver.SetAside called %d times, want %d", got, n)
	}
	lines.want(t, slog.LevelDebug, "message set aside", "broker", "delay", "due", "destination")
	testenv.Eventually(t, timeout, "an empty backlog", func() bool { return backlog(t, c) == consumer.Backlog{} })
}

// testSetAsideOff: without Options.SetAside, the handler waits out the
// delay itself: the message holds its handler, nothing is set aside, and
// the handler is called again after the delay.
func testSetAsideOff(t *testing.T, src Source) {
	const delay = 300 * time.Millisecond
	var obs observed
	rec := newRecorder()
	var calls atomic.Int64
	c := src.NewConsumer(t, consumer.Options{Concurrency: 1, Observer: obs.observer()},
		func(_ context.Context, m consumer.Message) error {
			rec.enter(m)()
			if calls.Add(1) == 1 {
				return consumer.SetAside(errors.New("not yet"), delay)
			}
			return nil
		})
	src.Publish(t, msg("a", "k"), msg("b", "k"))
	start(t, c)
	rec.waitCalls(t, 3, "both messages handled")
	got := rec.snapshot()
	if o := order(got); o != "a a b" {
		t.Errorf("calls %s, want a a b: the message waiting out its delay holds the only handler", o)
	}
	if back := got[1].at.Sub(got[0].at); back < delay {
		t.Errorf("called again after %v, want at least %v", back, delay)
	}
	if n := obs.get(&obs.setAside); n != 0 {
		t.Errorf("MessageObserver.SetAside called %d times without Options.SetAside", n)
	}
	if b := backlog(t, c); b.SetAside != 0 {
		t.Errorf("Backlog %+v counts messages set aside without Options.SetAside", b)
	}
}

// testDrain: when Run's context ends, the handlers in flight finish (their
// context is not cancelled before the drain deadline), Run returns only
// after them, nothing else starts, and the next consumer receives every
// other message and none of those.
func testDrain(t *testing.T, src Source) {
	const n = 6
	gate := make(chan struct{})
	var ended, cancelled atomic.Int64
	rec1 := newRecorder()
	c1 := src.NewConsumer(t, consumer.Options{Concurrency: 2, Ordering: consumer.OrderNone, DrainTimeout: timeout},
		func(ctx context.Context, m consumer.Message) error {
			defer rec1.enter(m)()
			select {
			case <-gate:
			case <-ctx.Done():
				cancelled.Add(1)
				return ctx.Err()
			}
			ended.Add(1)
			return nil
		})
	in := msgs("d", n, 3)
	src.Publish(t, in...)
	r1 := start(t, c1)
	rec1.waitCalls(t, 2, "two handlers in flight")
	r1.cancel()
	if testenv.Within(200*time.Millisecond, r1.returned) {
		t.Fatal("Run returned while two handlers were in flight")
	}
	close(gate)
	if err := r1.stop(t); err != nil {
		t.Errorf("Run returned %v after draining, want nil", err)
	}
	if e, c := ended.Load(), cancelled.Load(); e != 2 || c != 0 {
		t.Errorf("%d handlers finished and %d were cancelled, want 2 and 0", e, c)
	}
	done := rec1.ids()
	if len(done) != 2 {
		t.Errorf("calls %s during and after the drain, want only the two in flight", order(rec1.snapshot()))
	}

	rec2 := newRecorder()
	c2 := src.NewConsumer(t, consumer.Options{}, func(_ context.Context, m consumer.Message) error {
		rec2.enter(m)()
		return nil
	})
	r2 := start(t, c2)
	var rest []consumer.Message
	for _, m := range in {
		if done[idOf(m)] == 0 {
			rest = append(rest, m)
		}
	}
	rec2.waitIDs(t, rest, "the messages not handled before the shutdown")
	_ = r2.stop(t)
	for id := range rec2.ids() {
		if done[id] > 0 {
			t.Errorf("%s, finished during the drain, was delivered again", id)
		}
	}
}

// testDrainDeadline: a handler still running at the drain deadline sees
// its context end, Run returns about then, and the message is delivered
// again to the next consumer: nothing is lost.
func testDrainDeadline(t *testing.T, src Source) {
	const drain = 300 * time.Millisecond
	var obs observed
	var sawCancel atomic.Bool
	lines, log := newLogs(t)
	rec1 := newRecorder()
	c1 := src.NewConsumer(t, consumer.Options{Concurrency: 1, DrainTimeout: drain, Observer: obs.observer(), Logger: log},
		func(ctx context.Context, m consumer.Message) error {
			rec1.enter(m)()
			<-ctx.Done()
			sawCancel.Store(true)
			return ctx.Err()
		})
	in := []consumer.Message{msg("slow", "k")}
	src.Publish(t, in...)
	r1 := start(t, c1)
	rec1.waitCalls(t, 1, "the handler in flight")
	began := time.Now()
	if err := r1.stop(t); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if took := time.Since(began); took < drain {
		t.Errorf("Run returned %v after its context ended, before the drain timeout %v", took, drain)
	}
	if !sawCancel.Load() {
		t.Error("the handler's context did not end at the drain deadline")
	}
	if d := obs.get(&obs.dead); d != 0 {
		t.Errorf("%d dead letters, want the message left for redelivery", d)
	}
	lines.want(t, slog.LevelWarn, "drain timeout reached; cancelling the handlers still running, their messages will be redelivered", "broker", "drain_timeout")
	lines.want(t, slog.LevelWarn, "message abandoned; it will be redelivered", "broker", "attempts", "err")
	lines.want(t, slog.LevelInfo, "consumer stopped", "broker")
	rec2 := newRecorder()
	c2 := src.NewConsumer(t, consumer.Options{}, func(_ context.Context, m consumer.Message) error {
		rec2.enter(m)()
		return nil
	})
	start(t, c2)
	rec2.waitIDs(t, in, "the message cut off at the drain deadline, delivered again")
}

// testReconnect: while the broker connection is cut, Connected says so
// (consumer.ErrNotConnected) and the observer saw Disconnected; once it is
// back, the consumer reconnects by itself (ReconnectAttempt, Reconnected,
// Connected nil) and delivers every message, those published during the
// cut too.
func testReconnect(t *testing.T, src Source) {
	var obs observed
	lines, log := newLogs(t)
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Observer: obs.observer(), Logger: log}, func(_ context.Context, m consumer.Message) error {
		rec.enter(m)()
		return nil
	})
	if err := c.Connected(); !errors.Is(err, consumer.ErrNotConnected) {
		t.Errorf("Connected() before Run = %v, want consumer.ErrNotConnected", err)
	}
	before := msgs("before", 3, 3)
	src.Publish(t, before...)
	start(t, c)
	rec.waitIDs(t, before, "the messages published before the cut")
	waitConnected(t, c)

	src.Cut(t)
	var last error
	if !testenv.Within(timeout, func() bool { last = c.Connected(); return last != nil }) {
		t.Fatalf("Connected() = nil %v after the cut", timeout)
	}
	if !errors.Is(last, consumer.ErrNotConnected) {
		t.Errorf("Connected() = %v during the cut, want consumer.ErrNotConnected", last)
	}
	testenv.Eventually(t, timeout, "MessageObserver.Disconnected", func() bool { return obs.get(&obs.disconnected) > 0 })
	during := msgs("during", 3, 3)
	src.Publish(t, during...)

	src.Restore(t)
	waitConnected(t, c)
	testenv.Eventually(t, timeout, "MessageObserver.Reconnected", func() bool { return obs.get(&obs.reconnected) > 0 })
	rec.waitIDs(t, append(before, during...), "every message, those published during the cut too")
	if a := obs.get(&obs.attempts); a < 1 {
		t.Errorf("MessageObserver.ReconnectAttempt called %d times, want at least the one that reconnected", a)
	}
	lines.want(t, slog.LevelInfo, "connected", "broker")
	lines.want(t, slog.LevelWarn, "connection lost; reconnecting", "broker", "retry_in", "err")
	lines.want(t, slog.LevelInfo, "reconnected", "broker", "attempts", "cause")
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.brokers) != 1 || obs.brokers[""] {
		t.Errorf("connection events named brokers %v, want one, the backend's name", keys(obs.brokers))
	}
}

// testOrderPartition: OrderPartition with Concurrency 1 handles one
// message at a time, and the messages of a key in the order published.
func testOrderPartition(t *testing.T, src Source) {
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Concurrency: 1}, func(_ context.Context, m consumer.Message) error {
		defer rec.enter(m)()
		time.Sleep(2 * time.Millisecond) // some work, for calls to overlap if they could
		return nil
	})
	in := msgs("p", 18, 3)
	src.Publish(t, in...)
	start(t, c)
	rec.waitIDs(t, in, "every message handled")
	checkKeyOrder(t, rec)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.maxIn != 1 {
		t.Errorf("%d messages handled at once with Concurrency 1", rec.maxIn)
	}
}

// testOrderKey: OrderKey handles the messages of a key one at a time in
// the order published, and different keys at once, up to Concurrency.
func testOrderKey(t *testing.T, src Source) {
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Ordering: consumer.OrderKey, OrderingKey: keyOf, Concurrency: 3},
		func(_ context.Context, m consumer.Message) error {
			defer rec.enter(m)()
			time.Sleep(20 * time.Millisecond)
			return nil
		})
	in := msgs("k", 18, 3)
	src.Publish(t, in...)
	start(t, c)
	rec.waitIDs(t, in, "every message handled")
	checkKeyOrder(t, rec)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.keyClash {
		t.Error("two messages of one key were handled at once")
	}
	if rec.maxIn < 2 || rec.maxIn > 3 {
		t.Errorf("at most %d messages handled at once, want 2 or 3 (three keys, Concurrency 3)", rec.maxIn)
	}
}

// testOrderNone: OrderNone handles up to Concurrency messages at once,
// and no more.
func testOrderNone(t *testing.T, src Source) {
	const concurrency = 4
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Ordering: consumer.OrderNone, Concurrency: concurrency},
		func(_ context.Context, m consumer.Message) error {
			defer rec.enter(m)()
			time.Sleep(40 * time.Millisecond)
			return nil
		})
	in := msgs("n", 16, 4)
	src.Publish(t, in...)
	start(t, c)
	rec.waitIDs(t, in, "every message handled")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.maxIn != concurrency {
		t.Errorf("at most %d messages handled at once, want Concurrency, %d", rec.maxIn, concurrency)
	}
}

// testBacklog: the messages a busy consumer has not taken are counted as
// Ready, and the backlog is empty once every message is handled.
func testBacklog(t *testing.T, src Source) {
	const n = 10
	gate := make(chan struct{})
	rec := newRecorder()
	c := src.NewConsumer(t, consumer.Options{Concurrency: 1}, func(ctx context.Context, m consumer.Message) error {
		rec.enter(m)()
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	src.Publish(t, msgs("b", n, 2)...)
	start(t, c)
	rec.waitCalls(t, 1, "a message in its handler")
	var b consumer.Backlog
	if !testenv.Within(timeout, func() bool { b = backlog(t, c); return b.Ready >= n-1 }) {
		t.Errorf("Backlog %+v with %d messages published and one taken, want at least %d ready", b, n, n-1)
	}
	if b.Ready > n || b.SetAside != 0 {
		t.Errorf("Backlog %+v with %d messages published, none set aside", b, n)
	}
	close(gate)
	testenv.Eventually(t, timeout, "an empty backlog", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		total, err := c.Backlog(ctx)
		return err == nil && total == 0 && backlog(t, c) == consumer.Backlog{}
	})
}

// checkKeyOrder fails t unless the calls of each key came in the order
// the messages were published (their ids), each once.
func checkKeyOrder(t *testing.T, rec *recorder) {
	t.Helper()
	last := map[string]string{}
	for _, cl := range rec.snapshot() {
		if prev, ok := last[cl.key]; ok && cl.id <= prev {
			t.Errorf("key %s: %s handled after %s (calls %s)", cl.key, cl.id, prev, order(rec.snapshot()))
			return
		}
		last[cl.key] = cl.id
	}
}

// order returns the ids of calls in order, for failures.
func order(calls []call) string {
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = c.id
	}
	return strings.Join(ids, " ")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
