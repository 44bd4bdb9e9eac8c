package rabbitmq_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
)

// backlogWithin calls Backlog until ok accepts its result or d passes, and
// returns the last result.
func backlogWithin(t *testing.T, c *rabbitmq.Consumer, d time.Duration, ok func(int64, error) bool) (int64, error) {
	t.Helper()
	var n int64
	var err error
	testenv.Within(d, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err = c.Backlog(ctx)
		cancel()
		return ok(n, err)
	})
	return n, err
}

// TestBacklogNotConnected checks that Backlog reports ErrNotConnected
// before Run, while Run cannot reconnect, and after Run returned.
func TestBacklogNotConnected(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	p, proxied := newProxy(t, b.url)
	c := newConsumer(t, rabbitmq.Config{
		URL: proxied, Queue: q,
		ReconnectBackoff: 50 * time.Millisecond, MaxReconnectBackoff: 200 * time.Millisecond,
	}, nop)
	check := func(when string, n int64, err error) {
		t.Helper()
		if !errors.Is(err, rabbitmq.ErrNotConnected) || n != 0 {
			t.Fatalf("%s: Backlog returned %d, %v; want 0 and an error wrapping ErrNotConnected", when, n, err)
		}
		if !strings.Contains(err.Error(), strconv.Quote(q)) {
			t.Errorf("%s: error %q does not name queue %q", when, err, q)
		}
	}

	n, err := c.Backlog(testenv.Context(t, 10*time.Second))
	check("before Run", n, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)
	n, err = backlogWithin(t, c, 10*time.Second, func(_ int64, err error) bool { return err == nil })
	if err != nil || n != 0 {
		t.Fatalf("while consuming an empty queue: Backlog returned %d, %v; want 0, nil", n, err)
	}

	p.close() // the connection breaks, and reconnecting fails from now on
	n, err = backlogWithin(t, c, 10*time.Second, func(_ int64, err error) bool {
		return errors.Is(err, rabbitmq.ErrNotConnected)
	})
	check("while reconnecting", n, err)

	cancel()
	wait()
	n, err = c.Backlog(testenv.Context(t, 10*time.Second))
	check("after Run returned", n, err)
}

// TestBacklog checks the count while the consumer holds a full prefetch
// window unacked, and after every message was handled.
func TestBacklog(t *testing.T) {
	const (
		n        = 25
		prefetch = 5
	)
	b := newBroker(t)
	q := b.declareQueue(t)
	b.publish(t, q, n)

	tr := newTracker(n)
	started := make(chan struct{}, n)
	release := make(chan struct{})
	h := func(ctx context.Context, msg consumer.Message) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		tr.record(msg)
		return nil
	}
	var reconnects atomic.Int64
	obs := &consumer.MessageObserver{Reconnected: func(string, error) { reconnects.Add(1) }}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Prefetch: prefetch, Options: consumer.Options{Observer: obs}}, h)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	for i := range prefetch {
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d handlers started after 20s", i, prefetch)
		}
	}
	// The prefetch window is full: the broker delivers no more until an
	// ack, so the ready count settles at n-prefetch.
	const want = n - prefetch
	got, err := backlogWithin(t, c, 10*time.Second, func(got int64, err error) bool { return err == nil && got == want })
	if err != nil || got != want {
		t.Fatalf("with %d of %d messages delivered and unacked: Backlog returned %d, %v; want %d, nil",
			prefetch, n, got, err, want)
	}
	if ready := b.ready(t, q); ready != want {
		t.Errorf("another connection sees %d ready messages, want %d like Backlog", ready, want)
	}

	// Concurrent calls, beside Run, all see the same count.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				got, err := c.Backlog(testenv.Context(t, 10*time.Second))
				if err != nil || got != want {
					t.Errorf("concurrent Backlog returned %d, %v; want %d, nil", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if extra := len(started); extra != 0 {
		t.Errorf("%d handlers started beyond the prefetch window of %d", extra, prefetch)
	}

	close(release)
	released = true
	tr.wait(t, 30*time.Second)
	got, err = backlogWithin(t, c, 10*time.Second, func(got int64, err error) bool { return err == nil && got == 0 })
	if err != nil || got != 0 {
		t.Errorf("after every message was handled: Backlog returned %d, %v; want 0, nil", got, err)
	}
	cancel()
	wait()
	if got := b.waitReady(t, q, 0); got != 0 {
		t.Errorf("%d messages left in the queue, want 0 (all acked)", got)
	}
	if r := reconnects.Load(); r != 0 {
		t.Errorf("%d reconnects, want 0: Backlog disturbed the consuming channel", r)
	}
}

// TestBacklogContext checks that Backlog returns ctx's error at once when
// ctx is done, even while the broker does not answer.
func TestBacklogContext(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	b.publish(t, q, 3)
	p, proxied := newProxy(t, b.url)
	blocked := func(ctx context.Context, _ consumer.Message) error {
		<-ctx.Done() // keeps its one delivery unacked until Run stops
		return ctx.Err()
	}
	var reconnects atomic.Int64
	obs := &consumer.MessageObserver{Reconnected: func(string, error) { reconnects.Add(1) }}
	c := newConsumer(t, rabbitmq.Config{
		URL:      proxied,
		Queue:    q,
		Prefetch: 1,
		Options: consumer.Options{
			Observer:     obs,
			DrainTimeout: 100 * time.Millisecond,
		},
	}, blocked)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)
	const want = 2 // one of three delivered
	if got, err := backlogWithin(t, c, 10*time.Second, func(got int64, err error) bool { return err == nil && got == want }); err != nil || got != want {
		t.Fatalf("Backlog returned %d, %v; want %d, nil", got, err, want)
	}

	t.Run("cancelled before the call", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(context.Background())
		ccancel()
		start := time.Now()
		got, err := c.Backlog(cctx)
		if took := time.Since(start); took > time.Second {
			t.Errorf("Backlog took %v with a cancelled context", took)
		}
		if !errors.Is(err, context.Canceled) || got != 0 {
			t.Errorf("Backlog returned %d, %v; want 0 and an error wrapping context.Canceled", got, err)
		}
	})

	t.Run("ends during the call", func(t *testing.T) {
		resume := p.stall() // the broker's answer never comes
		defer resume()
		const timeout = 200 * time.Millisecond
		tctx, tcancel := context.WithTimeout(context.Background(), timeout)
		defer tcancel()
		start := time.Now()
		got, err := c.Backlog(tctx)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) || got != 0 {
			t.Errorf("Backlog returned %d, %v; want 0 and an error wrapping context.DeadlineExceeded", got, err)
		}
		if took > timeout+3*time.Second {
			t.Errorf("Backlog returned %v after the call began, want soon after the %v timeout", took, timeout)
		}
		resume()
		// The abandoned call ends in the background; the connection and
		// the consumer carry on.
		if got, err := backlogWithin(t, c, 10*time.Second, func(got int64, err error) bool { return err == nil && got == want }); err != nil || got != want {
			t.Errorf("after the broker answered again: Backlog returned %d, %v; want %d, nil", got, err, want)
		}
	})

	cancel()
	wait()
	if r := reconnects.Load(); r != 0 {
		t.Errorf("%d reconnects, want 0", r)
	}
	if got := b.waitReady(t, q, 3); got != 3 {
		t.Errorf("%d messages ready after Run returned, want 3", got)
	}
}

// backlogParts calls c.BacklogParts with a deadline.
func backlogParts(t *testing.T, c *rabbitmq.Consumer) (consumer.Backlog, error) {
	t.Helper()
	return c.BacklogParts(testenv.Context(t, 10*time.Second))
}

// firstBacklogParts returns what c.BacklogParts first answers once Run has
// connected.
func firstBacklogParts(t *testing.T, c *rabbitmq.Consumer) (consumer.Backlog, error) {
	t.Helper()
	var parts consumer.Backlog
	var err error
	eventually(t, "BacklogParts answering", func() bool {
		parts, err = backlogParts(t, c)
		return !errors.Is(err, rabbitmq.ErrNotConnected)
	})
	return parts, err
}

// TestBacklogCountsSetAside checks that the messages set aside in the
// delay queues count in Backlog, and apart in BacklogParts: they are still
// to be delivered. Before anything was set aside the delay queues do not
// exist, which counts 0 and is no error.
func TestBacklogCountsSetAside(t *testing.T) {
	const n, setAside = 6, 3
	b := newBroker(t)
	q := b.declareQueue(t)

	// m-0000, m-0002 and m-0004 are set aside for an hour (a stay capped
	// at Options.MaxSetAside, a minute, far beyond the test); the others
	// are delivered.
	var handled atomic.Int64
	h := func(_ context.Context, m consumer.Message) error {
		if i, _ := strconv.Atoi(strings.TrimPrefix(m.Source.MessageID, "m-")); i%2 == 0 {
			return consumer.SetAside(errors.New("limit per-recipient: 5 per 1h"), time.Hour)
		}
		handled.Add(1)
		return nil
	}
	var reconnects atomic.Int64
	obs := &consumer.MessageObserver{Reconnected: func(string, error) { reconnects.Add(1) }}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Options: consumer.Options{SetAside: true, Observer: obs}}, h)
	// The delay queue appears after the first call; a short recheck
	// lets the calls after it see it.
	rabbitmq.SetDelayRecheck(c, 100*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, c.Run)

	parts, err := firstBacklogParts(t, c)
	if err != nil || parts != (consumer.Backlog{}) {
		t.Fatalf("without a delay queue: BacklogParts returned %+v, %v; want none, nil", parts, err)
	}

	b.publish(t, q, n)
	eventually(t, "the messages not set aside handled", func() bool { return handled.Load() == n-setAside })
	got, err := backlogWithin(t, c, 10*time.Second, func(got int64, err error) bool { return err == nil && got == setAside })
	if err != nil || got != setAside {
		t.Fatalf("with %d of %d messages set aside and the others handled: Backlog returned %d, %v; want %d, nil",
			setAside, n, got, err, setAside)
	}
	want := consumer.Backlog{SetAside: setAside}
	if parts, err := backlogParts(t, c); err != nil || parts != want {
		t.Errorf("BacklogParts returned %+v, %v; want %+v, nil", parts, err, want)
	}
	// A minute is 6000 units of 10 ms, whose highest bit is bit 12: each
	// waits at level 12 first, for 4096 units.
	levels := rabbitmq.DelayQueues(q, kit.DefaultMaxSetAside)
	if ready := b.ready(t, levels[len(levels)-1]); ready != setAside {
		t.Errorf("another connection sees %d messages in the delay queue of the highest level, want %d", ready, setAside)
	}
	cancel()
	wait()
	if r := reconnects.Load(); r != 0 {
		t.Errorf("%d reconnects, want 0: asking for a missing delay queue disturbed the consumer", r)
	}
}

// TestBacklogDelayQueueRecheck checks that after the broker said that the
// delay queues do not exist, BacklogParts does not ask for them again
// until the recheck interval passed, while a consumer that was not told so
// sees them at once.
func TestBacklogDelayQueueRecheck(t *testing.T) {
	b := newBroker(t)
	q := b.declareQueue(t)
	dq := rabbitmq.DelayQueues(q, kit.DefaultMaxSetAside)[0]
	told := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q}, nop)
	rabbitmq.SetDelayRecheck(told, time.Hour)
	fresh := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q}, nop)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAll(t, ctx, told.Run, fresh.Run)

	parts, err := firstBacklogParts(t, told)
	if err != nil || parts != (consumer.Backlog{}) {
		t.Fatalf("without a delay queue: BacklogParts returned %+v, %v; want none, nil", parts, err)
	}
	_, err = b.ch.QueueDeclare(dq, true, false, false, false, nil)
	must(t, err)
	b.publish(t, dq, 2)

	if parts, err := backlogParts(t, told); err != nil || parts != (consumer.Backlog{}) {
		t.Errorf("within the recheck interval: BacklogParts returned %+v, %v; want none, nil", parts, err)
	}
	parts, err = firstBacklogParts(t, fresh)
	if want := (consumer.Backlog{SetAside: 2}); err != nil || parts != want {
		t.Errorf("a consumer that never missed the delay queue: BacklogParts returned %+v, %v; want %+v, nil", parts, err, want)
	}
	cancel()
	wait()
}
