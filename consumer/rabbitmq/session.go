package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one connection with its consuming channel and a channel in
// confirm mode to publish dead letters and messages set aside on.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	// pub publishes dead letters and messages set aside, with confirms.
	pub *confirmPublisher
	// The close notifications, registered right after each was opened. A
	// receive yields the broker's or the library's error, or nil once the
	// connection or channel was closed by this process.
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
	pubClosed  chan *amqp.Error
}

// close closes the connection, and with it the channels. The broker
// requeues every delivery the channel did not ack.
func (s *session) close() {
	_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
}

// deliveriesClosed says why the delivery channel closed: the channel or
// connection closed, or the broker cancelled the consumer (the queue was
// deleted, for example). amqp091 sends the close notifications before it
// closes the delivery channel, so they are there to read.
func (s *session) deliveriesClosed() error {
	select {
	case e := <-s.chClosed:
		return closeError("channel", e)
	case e := <-s.connClosed:
		return closeError("connection", e)
	default:
		return errors.New("consumer cancelled by the broker")
	}
}

func closeError(what string, e *amqp.Error) error {
	if e == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %w", what, e)
}

// connect dials the broker and sets up a consuming channel and the
// publishing channel. If ctx ends
// meanwhile, it closes the socket so that no step blocks, and returns
// ctx's error.
func (c *Consumer) connect(ctx context.Context) (_ *session, err error) {
	var (
		mu  sync.Mutex
		raw net.Conn
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if raw != nil {
			_ = raw.Close()
		}
	})
	defer stop()

	timeout := defaultDialTimeout
	if c.uri.ConnectionTimeout > 0 {
		timeout = time.Duration(c.uri.ConnectionTimeout) * time.Millisecond
	}
	var tlsConfig *tls.Config
	if c.cfg.TLS != nil {
		tlsConfig = c.cfg.TLS.Clone() // amqp091 sets ServerName on it
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.tag)
	conn, err := amqp.DialConfig(c.cfg.URL, amqp.Config{
		TLSClientConfig: tlsConfig,
		Properties:      props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// amqp091 clears the deadline once the handshake is done.
			if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
				_ = nc.Close()
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			if ctx.Err() != nil {
				_ = nc.Close()
				return nil, ctx.Err()
			}
			raw = nc
			return nc, nil
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("dialing %s: %w", c.url, err)
	}
	s := &session{conn: conn}
	defer func() {
		if err != nil {
			s.close()
			if ctx.Err() != nil {
				err = ctx.Err()
			}
		}
	}()
	s.connClosed = conn.NotifyClose(make(chan *amqp.Error, 1))
	if s.ch, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("opening channel: %w", err)
	}
	s.chClosed = s.ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := s.ch.Qos(c.qos(), 0, false); err != nil {
		return nil, fmt.Errorf("setting prefetch %d: %w", c.qos(), err)
	}
	if c.cfg.Declare {
		if err := c.declare(s.ch); err != nil {
			return nil, err
		}
	}
	pch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening the publishing channel: %w", err)
	}
	s.pubClosed = pch.NotifyClose(make(chan *amqp.Error, 1))
	if dlx := c.cfg.DeadLetterExchange; dlx != "" && !c.cfg.Declare {
		// Publishing to a missing exchange would close the channel at
		// the first dead letter; find out now. A failed passive declare
		// closes pch, and connect fails.
		if err := pch.ExchangeDeclarePassive(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return nil, fmt.Errorf("checking dead-letter exchange %q: %w", dlx, err)
		}
	}
	if err := pch.Confirm(false); err != nil {
		return nil, fmt.Errorf("enabling publisher confirms: %w", err)
	}
	s.pub = &confirmPublisher{conn: conn, ch: pch}
	if o := c.proc.Options(); o.SetAside {
		// Declared before the first delivery, not at the first message
		// set aside: on a loaded broker the messages set aside while they
		// ran missed their booked slots by about 110 ms. A failure is no
		// reason not to consume; the first set-aside tries again (and,
		// failing, waits the delay in its handler).
		if err := s.pub.declareDelay(c.cfg.Queue, delayLevels(o.MaxSetAside)); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			c.log.LogAttrs(ctx, slog.LevelWarn, "declaring the delay queues failed; the first message set aside tries again",
				slog.String("err", err.Error()))
		}
	}
	s.deliveries, err = s.ch.Consume(c.cfg.Queue, c.tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consuming queue %q: %w", c.cfg.Queue, err)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	return s, nil
}

// declare declares the queue with its dead-letter exchange and queue.
func (c *Consumer) declare(ch *amqp.Channel) error {
	dlx, dlq := c.cfg.DeadLetterExchange, c.cfg.Queue+".dlq"
	if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring dead-letter exchange %q: %w", dlx, err)
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring dead-letter queue %q: %w", dlq, err)
	}
	if err := ch.QueueBind(dlq, "", dlx, false, nil); err != nil {
		return fmt.Errorf("binding dead-letter queue %q to %q: %w", dlq, dlx, err)
	}
	args := amqp.Table{"x-dead-letter-exchange": dlx}
	if _, err := ch.QueueDeclare(c.cfg.Queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("declaring queue %q: %w", c.cfg.Queue, err)
	}
	return nil
}

// qos is the QoS prefetch count the Consumer asks the broker for:
// Prefetch, or, when a delivered message may wait for its dedupe mark
// before its ack (kit.Processor.QueuesMarks), twice Prefetch (at most
// 65535), so that the deliveries waiting only for their mark do not
// starve the handlers; run.full keeps those being handled or waiting for
// a handler within Prefetch.
func (c *Consumer) qos() int {
	if c.proc.QueuesMarks() {
		return min(2*c.cfg.Prefetch, 65535)
	}
	return c.cfg.Prefetch
}
