package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Backlog returns the number of messages ready in the queue: waiting at the
// broker and not yet delivered to any consumer (deliveries held unacked by
// consumers, including this one's prefetch, are not counted). Every replica
// consuming the queue sees the same number. It opens a short-lived channel
// on the connection that Run is consuming on, passively declares the queue
// there and closes the channel: it never dials, and it leaves the consuming
// channel alone. It costs three round trips on that connection (opening the
// channel, the declare, closing the channel). It is safe for concurrent
// use, with Run and with other calls to Backlog.
//
// Before Run has connected, while Run is reconnecting, and after Run has
// returned, Backlog returns an error wrapping ErrNotConnected. If the queue
// does not exist, the error wraps the broker's NOT_FOUND *amqp.Error and
// names the queue. If ctx ends first, Backlog returns at once an error
// wrapping ctx.Err(); the channel is then closed in the background, when
// the broker answers or the connection closes, and Run waits for that
// before it returns.
func (c *Consumer) Backlog(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, c.backlogError(err)
	}
	c.connMu.Lock()
	conn := c.conn
	if conn != nil {
		c.probes.Add(1)
	}
	c.connMu.Unlock()
	if conn == nil {
		return 0, c.backlogError(ErrNotConnected)
	}
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	// amqp091 calls take no context: the call runs on, and ends when the
	// broker answers or the connection closes.
	go func() {
		defer c.probes.Done()
		n, err := c.readyMessages(conn)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return 0, c.backlogError(r.err)
		}
		return r.n, nil
	case <-ctx.Done():
		return 0, c.backlogError(ctx.Err())
	}
}

func (c *Consumer) backlogError(err error) error {
	return fmt.Errorf("rabbitmq: reading backlog of queue %q: %w", c.cfg.Queue, err)
}

// readyMessages passively declares the queue on a new channel of conn and
// returns its count of ready messages. Errors caused by conn being closed
// wrap ErrNotConnected.
func (c *Consumer) readyMessages(conn *amqp.Connection) (int64, error) {
	notConnected := func(err error) error {
		if conn.IsClosed() || errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("%w: %w", ErrNotConnected, err)
		}
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return 0, notConnected(fmt.Errorf("opening channel: %w", err))
	}
	// A channel that the broker closed, with NOT_FOUND for example, is
	// closed already, and Close does nothing.
	defer func() { _ = ch.Close() }()
	// The flags are those that declare uses, though the broker ignores
	// them in a passive declare.
	q, err := ch.QueueDeclarePassive(c.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return 0, notConnected(err)
	}
	return int64(q.Messages), nil
}
