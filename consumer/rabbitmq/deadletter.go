package rabbitmq

import (
	"context"
	"errors"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
)

// publisher publishes a dead letter and waits for the broker's confirm.
type publisher interface {
	// publish returns nil once the broker confirmed the message. It
	// returns errPublisherClosed when the channel closed (the session is
	// over), errNotConfirmed when the broker nacked it, and ctx's error
	// when ctx ended first.
	publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
}

var (
	errPublisherClosed = errors.New("dead-letter channel closed")
	errNotConfirmed    = errors.New("broker did not confirm the dead letter")
)

// confirmPublisher publishes on a channel in confirm mode. It is safe for
// concurrent use: amqp091 serializes publishes on a channel and matches
// each confirm to its publish.
type confirmPublisher struct {
	ch *amqp.Channel
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
		consumer.HeaderOriginalQueue:      queue,
		consumer.HeaderOriginalExchange:   d.Exchange,
		consumer.HeaderOriginalRoutingKey: d.RoutingKey,
	}
}

// deadLetter returns the message to publish for d: its body and
// properties, its headers with dlh added (dlh wins over an original header
// of the same name), persistent. As RabbitMQ does when it dead-letters,
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
// delivery with exactly one call: Ack when it was delivered, or
// dead-lettered by publishing; Nack without requeue when it failed and no
// dead-letter exchange is known (pub is nil); Nack with requeue when it
// was not finished (ctx ended). A call that fails because the channel
// closed is logged: the broker redelivers the message.
func (r *run) handle(ctx context.Context, it item, pub publisher) {
	d := &it.d
	var out consumer.Outcome
	switch {
	case it.keyErr != nil:
		out = consumer.Outcome{Err: it.keyErr}
	case ctx.Err() != nil:
		out = consumer.Outcome{Abandoned: true}
	default:
		out = r.proc.Process(ctx, it.msg)
	}
	attrs := requeueAttrs(d)
	switch {
	case out.Abandoned:
		r.requeue(d, attrs)
	case out.Err == nil:
		if err := d.Ack(false); err != nil {
			r.log.LogAttrs(ctx, slog.LevelWarn, "rabbitmq ack failed; the broker will redeliver the message",
				append(attrs, slog.String("err", err.Error()))...)
		}
	case pub == nil:
		if err := d.Nack(false, false); err != nil {
			r.log.LogAttrs(ctx, slog.LevelWarn, "rabbitmq nack failed; the broker will redeliver the message",
				append(attrs, slog.String("err", err.Error()))...)
			return
		}
		r.proc.DeadLettered(it.msg, out, append(attrs, slog.String("nacked_to", "the queue's dead-letter exchange"))...)
	default:
		r.publishDeadLetter(ctx, it, out, pub, attrs)
	}
}

// publishDeadLetter publishes the failed delivery to the dead-letter
// exchange, retrying until the broker confirms it, then acks it. If the
// session ends or ctx ends first, it requeues the delivery instead.
func (r *run) publishDeadLetter(ctx context.Context, it item, out consumer.Outcome, pub publisher, attrs []slog.Attr) {
	d := &it.d
	dlx := r.cfg.DeadLetterExchange
	msg := deadLetter(d, out.DeadLetterHeaders(position(d, r.cfg.Queue)))
	backoff := consumer.Backoff{Initial: r.cfg.ReconnectBackoff, Max: r.cfg.MaxReconnectBackoff}
	for failures := 0; ; failures++ {
		err := pub.publish(ctx, dlx, d.RoutingKey, msg)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, errPublisherClosed) {
			r.log.LogAttrs(ctx, slog.LevelWarn, "rabbitmq dead-letter publish abandoned; the message goes back to the queue",
				append(attrs, slog.String("dead_letter_exchange", dlx), slog.String("err", err.Error()))...)
			r.requeue(d, attrs)
			return
		}
		delay := backoff.Delay(failures)
		r.log.LogAttrs(ctx, slog.LevelWarn, "rabbitmq dead-letter publish failed; retrying",
			append(attrs, slog.String("dead_letter_exchange", dlx), slog.Int("attempt", failures+1),
				slog.String("retry_in", delay.String()), slog.String("err", err.Error()))...)
		if consumer.Sleep(ctx, delay) != nil {
			r.requeue(d, attrs)
			return
		}
	}
	if err := d.Ack(false); err != nil {
		// The dead letter is out; the broker redelivers the original,
		// which may be dead-lettered twice.
		r.log.LogAttrs(ctx, slog.LevelWarn, "rabbitmq ack after dead-lettering failed; the broker will redeliver the message",
			append(attrs, slog.String("err", err.Error()))...)
	}
	r.proc.DeadLettered(it.msg, out, append(attrs, slog.String("dead_letter_exchange", dlx))...)
}

// requeue gives d back to the broker, for this or another consumer.
func (r *run) requeue(d *amqp.Delivery, attrs []slog.Attr) {
	if attrs == nil {
		attrs = requeueAttrs(d)
	}
	if err := d.Nack(false, true); err != nil {
		r.log.LogAttrs(context.Background(), slog.LevelDebug, "rabbitmq requeue failed; the channel closed, so the broker requeues the message itself",
			append(attrs, slog.String("err", err.Error()))...)
		return
	}
	r.log.LogAttrs(context.Background(), slog.LevelDebug, "rabbitmq message requeued unfinished", attrs...)
}
