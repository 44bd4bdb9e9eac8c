package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// Backlog returns the number of messages waiting at the broker: those
// ready in the queue and those set aside in the delay queues. BacklogParts
// tells the two apart; Backlog is their Total.
func (c *Consumer) Backlog(ctx context.Context) (int64, error) {
	return kit.BacklogTotal(c.BacklogParts(ctx))
}

// BacklogParts returns the number of messages ready in the queue as Ready:
// waiting at the broker and not yet delivered to any consumer (deliveries
// held unacked by consumers, including this one's prefetch, are not
// counted). It returns the messages of the delay queues,
// "<Queue>.delay.NN" (see consumer.HeaderDue), as SetAside: set aside by a delay
// layer and not back in the queue yet. Every replica consuming the queue
// sees the same numbers. Messages that an older version set aside in the
// single queue "<Queue>.delay" still come back, within
// Options.MaxSetAside, but are not counted.
//
// It opens a short-lived channel on the connection that Run is consuming
// on, passively declares the queue and the delay queues there and closes
// the channel: it never dials, and it leaves the consuming channel alone.
// It costs a round trip for opening the channel, one per declare (the
// queue and, with the default Options.MaxSetAside of a minute, 13 delay
// levels) and one for closing the channel. The delay queues exist once a
// Consumer with Options.SetAside connected; while they do not, SetAside is 0, and after
// the broker said so BacklogParts does not ask again for 30 seconds, since
// the broker logs each such refusal. Delay queues that another replica
// has just created may so be counted up to 30 seconds late. It is safe for
// concurrent use, with Run and with other calls to Backlog.
//
// Before Run has connected, while Run is reconnecting, and after Run has
// returned, it returns an error wrapping ErrNotConnected. If the queue
// does not exist, the error wraps the broker's NOT_FOUND *amqp.Error and
// names the queue. If ctx ends first, it returns at once an error wrapping
// ctx.Err(); the channel is then closed in the background, when the broker
// answers or the connection closes, and Run waits for that before it
// returns.
func (c *Consumer) BacklogParts(ctx context.Context) (consumer.Backlog, error) {
	if err := ctx.Err(); err != nil {
		return consumer.Backlog{}, c.backlogError(err)
	}
	c.connMu.Lock()
	conn := c.conn
	if conn != nil {
		c.probes.Add(1)
	}
	c.connMu.Unlock()
	if conn == nil {
		return consumer.Backlog{}, c.backlogError(ErrNotConnected)
	}
	type result struct {
		b   consumer.Backlog
		err error
	}
	done := make(chan result, 1)
	// amqp091 calls take no context: the call runs on, and ends when the
	// broker answers or the connection closes.
	go func() {
		defer c.probes.Done()
		b, err := c.waitingMessages(conn)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return consumer.Backlog{}, c.backlogError(r.err)
		}
		return r.b, nil
	case <-ctx.Done():
		return consumer.Backlog{}, c.backlogError(ctx.Err())
	}
}

// delayRecheck is how long BacklogParts goes without asking for the delay
// queues after the broker said that they do not exist.
const delayRecheck = 30 * time.Second

// delayProbe remembers until when BacklogParts takes the delay queue for
// absent without asking the broker.
type delayProbe struct {
	// recheck replaces delayRecheck when not zero (tests).
	recheck time.Duration
	// absentUntil is in Unix nanoseconds; 0 before any refusal.
	absentUntil atomic.Int64
}

// due reports whether BacklogParts should ask for the delay queue at now.
func (p *delayProbe) due(now time.Time) bool { return now.UnixNano() >= p.absentUntil.Load() }

// absent records that the broker said at now that the delay queue does not
// exist.
func (p *delayProbe) absent(now time.Time) {
	d := p.recheck
	if d == 0 {
		d = delayRecheck
	}
	p.absentUntil.Store(now.Add(d).UnixNano())
}

func (c *Consumer) backlogError(err error) error {
	return fmt.Errorf("rabbitmq: reading backlog of queue %q: %w", c.cfg.Queue, err)
}

// waitingMessages passively declares the queue and the delay queues on a
// new channel of conn and returns their counts of ready messages. Errors
// caused by conn being closed wrap ErrNotConnected.
func (c *Consumer) waitingMessages(conn *amqp.Connection) (consumer.Backlog, error) {
	notConnected := func(err error) error {
		if conn.IsClosed() || errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("%w: %w", ErrNotConnected, err)
		}
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return consumer.Backlog{}, notConnected(fmt.Errorf("opening channel: %w", err))
	}
	// A channel that the broker closed, with NOT_FOUND for example, is
	// closed already, and Close does nothing.
	defer func() { _ = ch.Close() }()
	// The flags are those that declare uses, though the broker ignores
	// them in a passive declare.
	q, err := ch.QueueDeclarePassive(c.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return consumer.Backlog{}, notConnected(err)
	}
	b := consumer.Backlog{Ready: int64(q.Messages)}
	now := time.Now()
	if !c.delayProbe.due(now) {
		return b, nil
	}
	// The delay queues come last, lowest level first: a NOT_FOUND closes
	// the channel. Level 0 exists once anything was set aside.
	for n := range delayLevels(c.proc.Options().MaxSetAside) {
		name := delayLevelName(c.cfg.Queue, n)
		dq, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		var aerr *amqp.Error
		switch {
		case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
			if n == 0 {
				c.delayProbe.absent(now)
			}
			return b, nil
		case err != nil:
			return consumer.Backlog{}, notConnected(fmt.Errorf("delay queue %q: %w", name, err))
		}
		b.SetAside += int64(dq.Messages)
	}
	return b, nil
}
