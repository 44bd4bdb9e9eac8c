package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// publisher publishes dead letters and messages set aside, and waits for
// the broker's confirms.
type publisher interface {
	// publish returns nil once the broker confirmed the message. It
	// returns errPublisherClosed when the channel closed (the session is
	// over), errNotConfirmed when the broker nacked it, and ctx's error
	// when ctx ended first.
	publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
	// declareDelay declares the levels 0 to levels-1 of queue's delay
	// queues (see declareDelay), on a channel of its own, so that a
	// refusal closes nothing else.
	declareDelay(queue string, levels int) error
}

var (
	errPublisherClosed = errors.New("dead-letter channel closed")
	errNotConfirmed    = errors.New("broker did not confirm the dead letter")
)

// confirmPublisher publishes on a channel in confirm mode. It is safe for
// concurrent use: amqp091 serializes publishes on a channel and matches
// each confirm to its publish.
type confirmPublisher struct {
	conn *amqp.Connection
	ch   *amqp.Channel

	mu       sync.Mutex
	declared map[string]bool // delay queues declared on conn, by top level; guarded by mu
}

// declareDelay declares queue's delay queues once per connection and
// number of levels: a later call for them returns nil at once. Calls wait
// for each other.
func (p *confirmPublisher) declareDelay(queue string, levels int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	name := delayLevelName(queue, levels-1)
	if p.declared[name] {
		return nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return err
	}
	// A refused declare closes ch already, and Close does nothing.
	defer func() { _ = ch.Close() }()
	if err := declareDelay(ch, queue, levels); err != nil {
		return err
	}
	if p.declared == nil {
		p.declared = map[string]bool{}
	}
	p.declared[name] = true
	return nil
}

func (p *confirmPublisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		if p.ch.IsClosed() || errors.Is(err, amqp.ErrClosed) {
			return errPublisherClosed
		}
		return err
	}
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return err
	case ok:
		return nil
	case p.ch.IsClosed():
		// amqp091 resolves the pending confirms as nacks when the
		// channel closes.
		return errPublisherClosed
	}
	return errNotConfirmed
}

// position returns the dead-letter headers that say where d came from.
func position(d *amqp.Delivery, queue string) map[string]string {
	return map[string]string{
		HeaderOriginalQueue:      queue,
		HeaderOriginalExchange:   d.Exchange,
		HeaderOriginalRoutingKey: d.RoutingKey,
	}
}

// deadLetter returns the message to publish for d (a dead letter, or a
// copy set aside): its body and properties, its headers with dlh added (dlh
// wins over an original header of the same name), persistent. As RabbitMQ does when it dead-letters,
// the per-message TTL is dropped, so the dead letter does not expire; so
// is the user-id, which the broker checks against this connection's user.
func deadLetter(d *amqp.Delivery, dlh map[string]string) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers)+len(dlh))
	for k, v := range d.Headers {
		headers[k] = v
	}
	for k, v := range dlh {
		headers[k] = v
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// handle runs the handler for it under the retry policy, then settles the
// delivery with exactly one call: Ack when it was delivered (with
// Options.Dedupe on a store that queues its marks, once the mark ended:
// see kit.MarksLater; handle returns before), set aside (see
// setAside) or dead-lettered by publishing; Nack without requeue when it
// failed and no dead-letter exchange is known; Nack with requeue when it was
// not finished (ctx ended). A call that fails because the channel closed is
// logged: the broker redelivers the message.
func (r *run) handle(ctx context.Context, it item, pub publisher) {
	ctx, span := r.proc.StartSpan(ctx, it.msg)
	defer span.End()
	for r.handleOnce(ctx, &it, pub) {
	}
}

// handleOnce is one round of handle. It reports true when setAside waited
// out the delay, without a delay queue, for it.msg to be handled again.
func (r *run) handleOnce(ctx context.Context, it *item, pub publisher) (again bool) {
	d := &it.d
	var out kit.Outcome
	switch {
	case it.keyErr != nil:
		out = r.proc.KeyFailed(it.keyErr)
	case ctx.Err() != nil:
		out = kit.Outcome{Abandoned: true} // not started: requeued quietly
	case r.back(ctx, it, pub):
		return false
	default:
		out = r.proc.Process(ctx, it.msg)
		if out.Abandoned {
			attrs := append(requeueAttrs(d), slog.Int("attempts", out.Attempts))
			if out.Err != nil {
				attrs = append(attrs, slog.String("err", out.Err.Error()))
			}
			r.log.LogAttrs(ctx, slog.LevelWarn, kit.LogAbandoned, attrs...)
		}
	}
	// The log attributes are made where a line may be logged: a
	// delivered message's ack makes them only when it fails.
	switch {
	case out.Abandoned:
		r.requeue(d, nil)
	case out.SetAside > 0:
		return r.setAside(ctx, it, out, pub, requeueAttrs(d))
	case out.Err == nil && out.Marking != nil:
		// Acked once its dedupe mark is written (or its failure handled
		// as Dedupe.OnStoreError says), while the handler goes on with
		// the next delivery; it stays unacked and counts as in flight,
		// for the drain, until then, but not against Prefetch: the
		// broker's QoS leaves room for it (Consumer.qos, run.full).
		r.wg.Add(1)
		r.inflight.Add(1)
		dv := *d
		out.Marking.Then(func() {
			r.acks.push(func() {
				defer r.wg.Done()
				defer r.inflight.Add(-1)
				r.ack(context.Background(), &dv, nil)
			})
		})
	case out.Err == nil:
		r.ack(ctx, d, nil)
	case r.cfg.DeadLetterExchange == "":
		attrs := requeueAttrs(d)
		if err := d.Nack(false, false); err != nil {
			r.log.LogAttrs(ctx, slog.LevelWarn, "nack failed; the broker will redeliver the message",
				append(attrs, slog.String("err", err.Error()))...)
			return
		}
		r.settledAlone(d)
		r.proc.DeadLettered(ctx, it.msg, out, append(attrs, slog.String(kit.KeyDestination, "the queue's own dead-letter exchange (nack)"))...)
	default:
		dlx := r.cfg.DeadLetterExchange
		msg := deadLetter(d, out.DeadLetterHeaders(position(d, r.cfg.Queue)))
		attrs := append(requeueAttrs(d), slog.String(kit.KeyDestination, dlx))
		if r.publishThenAck(ctx, d, pub, dlx, d.RoutingKey, msg, attrs) {
			r.proc.DeadLettered(ctx, it.msg, out, attrs...)
		}
	}
	return false
}

// delayQueue returns the name of the single delay queue that messages
// were set aside in, with a per-message TTL, before the delay queues by
// level (see delayUnit). A message set aside there comes back as before;
// nothing is published there any more.
func (c *Consumer) delayQueue() string { return c.cfg.Queue + ".delay" }

// setAside publishes the delivery to the delay queues (see delayUnit),
// to come back after out.SetAside (at most Options.MaxSetAside), with the
// headers its handler asked for (kit.Outcome.SetAsideHeaders, such as
// setaside.HeaderPaid), consumer.HeaderDue and headerBack. It asks for it back a
// lead ahead of its due time (returnLag), rounded down to delayUnit, and
// the handler waits the rest when it comes back (run.back). The delay
// queues are declared when Run connects (Options.SetAside), or at the
// first message set aside on the connection if that failed.
// Once the broker confirmed the copy, the delivery is acked. If the delay
// queues cannot be declared, the handler waits out the delay and setAside
// reports true: the delivery is to be handled again, as it.msg, now with
// those headers (or it goes back to the queue if ctx ends first).
func (r *run) setAside(ctx context.Context, it *item, out kit.Outcome, pub publisher, attrs []slog.Attr) (again bool) {
	d := &it.d
	maxSetAside := r.proc.Options().MaxSetAside
	out.SetAside = min(out.SetAside, maxSetAside) // back to set aside again if need be
	levels := delayLevels(maxSetAside)
	due := time.Now().Add(out.SetAside)
	if err := pub.declareDelay(r.cfg.Queue, levels); err != nil {
		r.log.LogAttrs(ctx, slog.LevelWarn, kit.LogNoDelayDestination, append(attrs,
			slog.String(kit.KeyDestination, delayLevelName(r.cfg.Queue, 0)), slog.String("delay", out.SetAside.String()),
			slog.String("err", fmt.Sprintf("declaring the delay queues: %v", err)))...)
		if kit.Sleep(ctx, out.SetAside) != nil {
			r.requeue(d, attrs)
			return false
		}
		// Handled again (by handle), with the headers it would have been
		// set aside with: a requeued delivery would lose them, and with
		// setaside.HeaderPaid the slot a delay layer booked for it.
		it.msg = out.Returned(it.msg)
		return true
	}
	// What is left of the delay after the declare (about 60 calls, the
	// first time on a connection), less the lead; with a paid slot, until
	// it is handed on (setaside.HandOnAt).
	// The copy carries setaside.HeaderPaid as it.msg does, not as d does:
	// item dropped a publisher's.
	h := map[string]string{setaside.HeaderPaid: it.msg.Headers[setaside.HeaderPaid]}
	maps.Copy(h, out.SetAsideHeaders()) // such as setaside.HeaderPaid
	now := time.Now()
	back := setaside.HandOnAt(due, h[setaside.HeaderPaid])
	exchange, key, after := delayRoute(r.cfg.Queue, back.Sub(now)-r.lag.lead(now), levels)
	attrs = append(attrs, slog.String(kit.KeyDestination, exchange))
	msg := deadLetter(d, nil)
	dropDelayDeaths(msg.Headers, r.cfg.Queue)
	for k, v := range h {
		if v == "" {
			delete(msg.Headers, k)
		} else {
			msg.Headers[k] = v
		}
	}
	msg.Headers[consumer.HeaderDue] = due.UTC().Format(time.RFC3339Nano)
	msg.Headers[headerRoutingKey] = d.RoutingKey // the delay queues route by their own
	msg.Headers[headerBack] = now.Add(after).UTC().Format(time.RFC3339Nano)
	if out.Err != nil {
		msg.Headers[consumer.HeaderSetAsideReason] = out.Err.Error()
	}
	if r.publishThenAck(ctx, d, pub, exchange, key, msg, attrs) {
		r.proc.ReportSetAside(ctx, it.msg, out.SetAside, due, attrs...)
	}
	return false
}

// publishThenAck publishes msg to exchange with key, retrying until the
// broker confirms it, then acks d and reports true. If the session or ctx
// ends first, it requeues d and reports false.
func (r *run) publishThenAck(ctx context.Context, d *amqp.Delivery, pub publisher, exchange, key string, msg amqp.Publishing, attrs []slog.Attr) bool {
	backoff := kit.Backoff{Initial: r.cfg.ReconnectBackoff, Max: r.cfg.MaxReconnectBackoff}
	for failures := 0; ; failures++ {
		err := pub.publish(ctx, exchange, key, msg)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, errPublisherClosed) {
			r.log.LogAttrs(ctx, slog.LevelWarn, kit.LogWriteAbandoned,
				append(attrs, slog.String("err", err.Error()))...)
			kit.SpanAbandoned(ctx, 0)
			r.requeue(d, attrs)
			return false
		}
		delay := backoff.Delay(failures)
		r.log.LogAttrs(ctx, slog.LevelWarn, kit.LogWriteRetry,
			append(attrs, slog.Int("attempt", failures+1), slog.String("retry_in", delay.String()), slog.String("err", err.Error()))...)
		if kit.Sleep(ctx, delay) != nil {
			r.requeue(d, attrs)
			return false
		}
	}
	if err := r.settle(d); err != nil {
		// The copy is out; the broker redelivers the original, which may
		// then be published twice.
		r.log.LogAttrs(ctx, slog.LevelWarn, "ack after writing failed; the broker will redeliver the message",
			append(attrs, slog.String("err", err.Error()))...)
	}
	return true
}

// ack acks d; a failure is logged, with attrs (requeueAttrs when nil):
// the channel closed, and the broker redelivers the message.
func (r *run) ack(ctx context.Context, d *amqp.Delivery, attrs []slog.Attr) {
	if err := r.settle(d); err != nil {
		if attrs == nil {
			attrs = requeueAttrs(d)
		}
		r.log.LogAttrs(ctx, slog.LevelWarn, "ack failed; the broker will redeliver the message",
			append(attrs, slog.String("err", err.Error()))...)
	}
}

// settle acks d: through the session's ackBatcher when d came on its
// channel (a failure is then logged by the batcher, and settle reports
// nil), or on its own at once.
func (r *run) settle(d *amqp.Delivery) error {
	if b := r.batch.Load(); b != nil && b.ch == d.Acknowledger && b.add(d.DeliveryTag) {
		return nil
	}
	if err := d.Ack(false); err != nil {
		return err
	}
	r.settledAlone(d)
	return nil
}

// settledAlone tells the session's ackBatcher that d was settled by a
// call of its own, so that its multiple acks may pass it.
func (r *run) settledAlone(d *amqp.Delivery) {
	if b := r.batch.Load(); b != nil && b.ch == d.Acknowledger {
		b.settled(d.DeliveryTag)
	}
}

// requeue gives d back to the broker, for this or another consumer.
func (r *run) requeue(d *amqp.Delivery, attrs []slog.Attr) {
	if attrs == nil {
		attrs = requeueAttrs(d)
	}
	if err := d.Nack(false, true); err != nil {
		r.log.LogAttrs(context.Background(), slog.LevelDebug, "requeue failed; the channel closed, so the broker requeues the message itself",
			append(attrs, slog.String("err", err.Error()))...)
		return
	}
	r.settledAlone(d)
	r.log.LogAttrs(context.Background(), slog.LevelDebug, "message requeued unfinished", attrs...)
}
