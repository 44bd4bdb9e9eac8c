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
)

// run is the state of one call to Run.
type run struct {
	*Consumer
	hctx           context.Context // parent of every handler's context
	cancelHandlers context.CancelFunc
	sem            chan struct{}  // one slot per running handler
	work           chan task      // to the Concurrency workers
	wg             sync.WaitGroup // tasks dispatched and not finished
	workers        sync.WaitGroup
	inflight       atomic.Int64 // deliveries taken and not yet settled
}

// task is a delivery for a worker, with the session it came from.
type task struct {
	p  *dispatcher
	it item
}

// startWorkers starts the Concurrency long-lived handler goroutines, which
// serve every session of the run; stopWorkers ends them once no task is
// left. Long-lived workers keep their grown stacks, where a goroutine per
// delivery would grow a new one each time.
func (r *run) startWorkers() {
	r.work = make(chan task, cap(r.sem))
	for range cap(r.sem) {
		r.workers.Add(1)
		go func() {
			defer r.workers.Done()
			for t := range r.work {
				t.p.run1(t.it)
			}
		}()
	}
}

func (r *run) stopWorkers() {
	r.wg.Wait()
	close(r.work)
	r.workers.Wait()
}

// item is a delivery with its message and, under OrderKey, its key.
type item struct {
	d      amqp.Delivery
	msg    consumer.Message
	key    string
	keyErr error // the key function failed: the message is dead-lettered
}

func (r *run) item(d amqp.Delivery) item {
	it := item{d: d, msg: ToMessage(d, r.cfg.Queue)}
	if !fromDelayQueue(d, r.delayQueue()) {
		// Only a copy that this consumer set aside carries slots it paid
		// for. This is the second line: a publisher can forge x-death too,
		// and what keeps its slot from passing a layer is the limiter's
		// signature (limiter.PaidSlot.Sig).
		delete(it.msg.Headers, consumer.HeaderPaid)
	}
	if r.cfg.Ordering == consumer.OrderKey {
		it.key, it.keyErr = r.proc.Key(it.msg)
	}
	return it
}

// dispatcher starts the handlers of one session's deliveries in the order
// they arrive: each in its own goroutine, holding a slot of run.sem, or,
// under OrderKey, behind the running handler of the same key.
type dispatcher struct {
	*run
	ctx      context.Context // the session's handler context
	pub      publisher       // the session's publishing channel
	keys     consumer.KeyQueue[item]
	stopping atomic.Bool // shutting down: queued deliveries are requeued, not started
}

// dispatch takes it, for which the caller holds a slot. The slot is given
// back when the worker that handles it is done, or at once when it is
// queued behind its key.
func (p *dispatcher) dispatch(it item) {
	p.inflight.Add(1)
	p.cfg.Observer.ObserveReceived(it.msg)
	if p.keyed(it) && !p.keys.Push(it.key, it) {
		<-p.sem // queued: the key's owner handles it
		return
	}
	p.wg.Add(1)
	p.work <- task{p: p, it: it} // never blocks: a slot is held, and there are as many workers
}

func (p *dispatcher) keyed(it item) bool {
	return p.cfg.Ordering == consumer.OrderKey && it.keyErr == nil
}

// run1 handles it and, under OrderKey, the deliveries queued behind it,
// then gives back the slot.
func (p *dispatcher) run1(it item) {
	defer func() {
		<-p.sem
		p.wg.Done()
	}()
	p.settle(it)
	if !p.keyed(it) {
		return
	}
	for {
		next, ok := p.keys.Next(it.key)
		if !ok {
			return
		}
		if p.stopping.Load() {
			p.requeue(&next.d, nil)
			p.inflight.Add(-1)
			continue
		}
		p.settle(next)
	}
}

func (p *dispatcher) settle(it item) {
	defer p.inflight.Add(-1)
	p.handle(p.ctx, it, p.pub)
}

// serve dispatches the deliveries of s to handlers until ctx ends, in which
// case it shuts down gracefully and returns nil, or s breaks, in which case
// it returns why.
func (r *run) serve(ctx context.Context, s *session) error {
	sctx, cancel := context.WithCancel(r.hctx)
	defer cancel()
	p := &dispatcher{run: r, ctx: sctx, pub: s.pub}
	broken := func(err error) error {
		cancel()
		s.close()
		return err
	}
	for {
		// Take a handler slot before taking a delivery, so that no
		// delivery waits here unhandled.
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return r.shutdown(s, p, cancel)
		case e := <-s.connClosed:
			return broken(closeError("connection", e))
		case e := <-s.chClosed:
			return broken(closeError("channel", e))
		case e := <-s.pubClosed:
			return broken(closeError("publishing channel", e))
		}
		select {
		case d, ok := <-s.deliveries:
			if !ok {
				<-r.sem
				return broken(s.deliveriesClosed())
			}
			if ctx.Err() != nil {
				// Shutting down: d goes back to the queue.
				<-r.sem
				r.requeue(&d, nil)
				return r.shutdown(s, p, cancel)
			}
			p.dispatch(r.item(d))
		case <-ctx.Done():
			<-r.sem
			return r.shutdown(s, p, cancel)
		case e := <-s.connClosed:
			<-r.sem
			return broken(closeError("connection", e))
		case e := <-s.chClosed:
			<-r.sem
			return broken(closeError("channel", e))
		case e := <-s.pubClosed:
			<-r.sem
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
			r.log.Debug("rabbitmq consumer cancel failed", "err", err)
		}
	}()
	r.drain()
	close(stopWatch)
	<-watchDone
	s.close()
	<-cancelled
	r.log.Info("rabbitmq consumer stopped", "url", r.url)
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
		r.log.Warn("rabbitmq drain timeout; cancelling in-flight handlers, their messages go back to the queue",
			"in_flight", r.inflight.Load(), "drain_timeout", r.cfg.DrainTimeout.String())
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
