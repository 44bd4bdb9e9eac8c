package rabbitmq

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/dispatch"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/limiter"
)

// run is the state of one call to Run.
type run struct {
	*Consumer
	hctx           context.Context // parent of every handler's context
	cancelHandlers context.CancelFunc
	// classes is set when deliveries start by their class
	// (Options.Priority, with OrderKey or OrderNone).
	classes bool
	wg      sync.WaitGroup // deliveries dispatched and not settled or requeued
	workers sync.WaitGroup
	// acks acks the deliveries whose dedupe mark ended (kit.MarksLater).
	acks *ackQueue
	// inflight counts the deliveries taken and not yet settled.
	inflight atomic.Int64
	// busy counts, with markRoom, the deliveries taken whose handler has
	// not returned (inflight without those waiting for their dedupe
	// mark); serve takes a delivery only while busy is under Prefetch
	// (full), and freed (capacity 1) wakes it when a handler returns.
	busy     atomic.Int64
	markRoom bool
	freed    chan struct{}
	// batch batches the acks of the current session's channel (nil with
	// a negative AckDelay, or between sessions).
	batch atomic.Pointer[ackBatcher]

	mu   sync.Mutex
	cond *sync.Cond // signalled when a delivery may start, or at stop
	// queue holds the deliveries that wait for a handler, in lanes by key
	// under OrderKey, and hands them to the Concurrency workers by class.
	queue   *dispatch.Queue[string, task]
	stopped bool
}

// newRun returns the state of a call to Run whose handlers' contexts
// derive from hctx, which cancelHandlers cancels.
func newRun(c *Consumer, hctx context.Context, cancelHandlers context.CancelFunc) *run {
	classes := c.proc.Classes() && c.cfg.Ordering != consumer.OrderPartition
	r := &run{Consumer: c, hctx: hctx, cancelHandlers: cancelHandlers, classes: classes,
		queue: dispatch.NewQueue[string, task](dispatch.NewRule(c.cfg.Concurrency, classes)),
		acks:  newAckQueue(), markRoom: c.qos() > c.cfg.Prefetch, freed: make(chan struct{}, 1)}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// task is a delivery for a worker, with the session it came from.
type task struct {
	p  *dispatcher
	it item
}

// startWorkers starts the Concurrency long-lived handler goroutines, which
// serve every session of the run; stopWorkers ends them once no delivery
// is left. Long-lived workers keep their grown stacks, where a goroutine
// per delivery would grow a new one each time.
func (r *run) startWorkers() {
	for range r.cfg.Concurrency {
		r.workers.Go(r.work)
	}
	r.workers.Go(r.acks.run)
}

func (r *run) stopWorkers() {
	r.wg.Wait() // counts the acks queued too
	r.mu.Lock()
	r.stopped = true
	r.cond.Broadcast()
	r.mu.Unlock()
	r.acks.stop()
	r.workers.Wait()
}

// ackQueue runs the acks of the deliveries whose dedupe mark ended, in
// the order queued, on a goroutine of its own: kit.Marking.Then calls
// back on the dedupe store's goroutine, which must not wait on the
// broker. It holds at most the deliveries in flight, which the prefetch
// bounds. push is safe for concurrent use.
type ackQueue struct {
	mu      sync.Mutex
	pending []func()
	wake    chan struct{} // a push since the last run; capacity 1
	done    chan struct{} // closed by stop
}

func newAckQueue() *ackQueue {
	return &ackQueue{wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// push queues ack to run.
func (q *ackQueue) push(ack func()) {
	q.mu.Lock()
	q.pending = append(q.pending, ack)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run runs the acks as they are queued until stop, and those queued
// before it.
func (q *ackQueue) run() {
	var spare []func()
	for {
		select {
		case <-q.wake:
		case <-q.done:
			q.mu.Lock()
			acks := q.pending
			q.pending = nil
			q.mu.Unlock()
			for _, ack := range acks {
				ack()
			}
			return
		}
		q.mu.Lock()
		acks := q.pending
		q.pending = spare[:0]
		q.mu.Unlock()
		for i, ack := range acks {
			ack()
			acks[i] = nil
		}
		spare = acks
	}
}

// stop ends run once the acks queued ran.
func (q *ackQueue) stop() { close(q.done) }

// work runs deliveries as the queue hands them out, until stopWorkers.
func (r *run) work() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		t, started, ok := r.queue.Pop()
		for !ok && !r.stopped {
			r.cond.Wait()
			t, started, ok = r.queue.Pop()
		}
		if !ok {
			return
		}
		if r.queue.CanPop() {
			r.cond.Signal() // a slot for another class, beside this one
		}
		r.mu.Unlock()
		t.p.run1(t.it)
		r.mu.Lock()
		r.queue.Done(started)
	}
}

// item is a delivery with its message, its class (dispatch.ClassOf) and,
// under OrderKey, its key.
type item struct {
	d      amqp.Delivery
	msg    consumer.Message
	class  int
	key    string
	keyErr error // the key function failed: the message is dead-lettered
}

func (r *run) item(d amqp.Delivery) item {
	back := fromDelayLevels(d, r.cfg.Queue) || fromDelayQueue(d, r.delayQueue())
	if k, ok := d.Headers[headerRoutingKey].(string); ok && back {
		// A copy back from the delay queues has their routing key (the
		// cascade's, or the queue's name): it presents the one it was
		// published with, to the key templates, the ordering and its
		// dead letter.
		d.RoutingKey = k
		delete(d.Headers, headerRoutingKey)
	}
	it := item{d: d, msg: ToMessage(d, r.cfg.Queue), class: dispatch.ClassOf(limiter.PriorityNormal)}
	if !fromDelayQueue(d, r.delayQueue()) {
		// Only a copy that this consumer set aside carries slots it paid
		// for. This is the second line: a publisher can forge x-death too,
		// and what keeps its slot from passing a layer is the limiter's
		// signature (limiter.PaidSlot.Sig).
		delete(it.msg.Headers, setaside.HeaderPaid)
	}
	if r.classes {
		it.class = dispatch.ClassOf(r.proc.Class(it.msg))
	}
	if r.cfg.Ordering == consumer.OrderKey {
		it.key, it.keyErr = r.proc.Key(it.msg)
	}
	return it
}

// dispatcher starts the handlers of one session's deliveries: in the
// order they arrive, or by class (run.classes), and under OrderKey one at
// a time per key, in the order they arrived.
type dispatcher struct {
	*run
	ctx      context.Context // the session's handler context
	pub      publisher       // the session's publishing channel
	stopping atomic.Bool     // shutting down: queued deliveries are requeued, not started
}

// dispatch queues it for a worker.
func (p *dispatcher) dispatch(it item) {
	p.inflight.Add(1)
	if p.markRoom {
		p.busy.Add(1)
	}
	kit.ObserveReceived(p.cfg.Observer, it.msg)
	p.wg.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	keyed := p.cfg.Ordering == consumer.OrderKey && it.keyErr == nil
	if p.queue.Push(task{p: p, it: it}, it.class, it.key, keyed) && p.queue.CanPop() {
		p.cond.Signal()
	}
}

// queued returns the keys that have a delivery running or waiting, and
// the deliveries waiting for a handler.
func (r *run) queued() (keys, waiting int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queue.Len()
}

// run1 handles it, or requeues it when the session is shutting down.
func (p *dispatcher) run1(it item) {
	defer p.wg.Done()
	defer p.handled()
	if p.stopping.Load() {
		p.requeue(&it.d, nil)
		return
	}
	p.handle(p.ctx, it, p.pub)
}

// handled counts a delivery's handler done (settled, or waiting for its
// mark: in flight still), and wakes serve's gate (markRoom).
func (r *run) handled() {
	r.inflight.Add(-1)
	if r.markRoom {
		r.busy.Add(-1)
		select {
		case r.freed <- struct{}{}:
		default:
		}
	}
}

// full reports whether Prefetch deliveries are being handled or waiting
// for a handler, those waiting only for their mark not counted: with
// markRoom the broker may send more (Consumer.qos), which serve leaves
// unread meanwhile.
func (r *run) full() bool {
	return r.markRoom && r.busy.Load() >= int64(r.cfg.Prefetch)
}

// handlersFree reports whether no delivery waits for a handler: those
// taken whose handler has not returned (inflight, or busy with markRoom,
// where inflight counts those waiting for their mark too) are no more
// than the handlers. With OrderKey, one waiting behind its key counts as
// waiting.
func (r *run) handlersFree() bool {
	n := &r.inflight
	if r.markRoom {
		n = &r.busy
	}
	return n.Load() <= int64(r.cfg.Concurrency)
}

// serve dispatches the deliveries of s to handlers until ctx ends, in which
// case it shuts down gracefully and returns nil, or s breaks, in which case
// it returns why.
func (r *run) serve(ctx context.Context, s *session) error {
	sctx, cancel := context.WithCancel(r.hctx)
	defer cancel()
	p := &dispatcher{run: r, ctx: sctx, pub: s.pub}
	b := newAckBatcher(s.ch, r.cfg.AckDelay, r.log)
	if b != nil {
		b.window = uint64(r.qos())
		b.handlersFree = r.handlersFree
		go b.run()
		r.batch.Store(b)
		// The acks still waiting go out before the channel closes (on a
		// broken one they fail, and the broker redelivers them).
		defer b.stop()
		defer r.batch.CompareAndSwap(b, nil)
	}
	broken := func(err error) error {
		// The deliveries that wait are the broker's again: none starts.
		p.stopping.Store(true)
		cancel()
		s.close()
		return err
	}
	for {
		// Every delivery is read at once: the broker's prefetch bounds
		// them, and the queue starts them by class. With markRoom, only
		// while fewer than Prefetch are being handled or wait for a
		// handler (full): the others the broker sent wait unread.
		deliveries := s.deliveries
		if r.full() {
			deliveries = nil
		}
		select {
		case <-r.freed: // a handler returned: ask full again
		case d, ok := <-deliveries:
			if !ok {
				return broken(s.deliveriesClosed())
			}
			if ctx.Err() != nil {
				// Shutting down: d goes back to the queue.
				r.requeue(&d, nil)
				return r.shutdown(s, p, cancel)
			}
			if b != nil {
				b.readTag(d.DeliveryTag)
			}
			p.dispatch(r.item(d))
		case <-ctx.Done():
			return r.shutdown(s, p, cancel)
		case e := <-s.connClosed:
			return broken(closeError("connection", e))
		case e := <-s.chClosed:
			return broken(closeError("channel", e))
		case e := <-s.pubClosed:
			return broken(closeError("publishing channel", e))
		}
	}
}

// shutdown cancels the consumer of s, drains the handlers and closes s.
// Deliveries queued behind their key are requeued, not started. If s
// breaks meanwhile, it cancels the handlers' context with cancelSession,
// since their messages will be redelivered anyway.
func (r *run) shutdown(s *session, p *dispatcher, cancelSession context.CancelFunc) error {
	p.stopping.Store(true)
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case <-s.connClosed:
		case <-s.chClosed:
		case <-s.pubClosed:
		case <-stopWatch:
			return
		}
		cancelSession()
	}()
	// Cancel waits for the broker's cancel-ok, which a dead broker never
	// sends, so it runs beside the drain; closing s ends it at the latest.
	// Deliveries that arrive meanwhile stay unread and unacked, and the
	// broker requeues them when s closes.
	cancelled := make(chan struct{})
	go func() {
		defer close(cancelled)
		// ErrClosed only means that s closed first.
		if err := s.ch.Cancel(r.tag, false); err != nil && !errors.Is(err, amqp.ErrClosed) {
			r.log.Debug("consumer cancel failed", "err", err)
		}
	}()
	r.drain()
	close(stopWatch)
	<-watchDone
	if b := r.batch.Load(); b != nil {
		b.stop() // the acks still waiting, before the channel closes
	}
	s.close()
	<-cancelled
	r.log.Info(kit.LogStopped, "url", r.url)
	return nil
}

// drain waits for the running handlers for up to DrainTimeout, then cancels
// their context and waits for them to return.
func (r *run) drain() {
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(r.cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		r.log.Warn(kit.LogDrainTimeout, "in_flight", r.inflight.Load(), "drain_timeout", r.cfg.DrainTimeout.String())
		r.cancelHandlers()
		<-done
	}
}

// requeueAttrs are the log attributes of a delivery.
func requeueAttrs(d *amqp.Delivery) []slog.Attr {
	return []slog.Attr{
		slog.String("message_id", d.MessageId),
		slog.Uint64("delivery_tag", d.DeliveryTag),
		slog.Bool("redelivered", d.Redelivered),
	}
}

// fromDelayQueue reports whether d came back from the delay queue q: the
// broker dead-lettered it from there, as its x-death header says.
func fromDelayQueue(d amqp.Delivery, q string) bool {
	deaths, _ := d.Headers["x-death"].([]any)
	for _, x := range deaths {
		if t, ok := x.(amqp.Table); ok && t["queue"] == q {
			return true
		}
	}
	return false
}
