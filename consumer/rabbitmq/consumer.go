// Package rabbitmq consumes a RabbitMQ queue with throttled, at-least-once
// handling, on top of github.com/rabbitmq/amqp091-go.
//
// A Consumer sets the channel's QoS prefetch, consumes with manual
// acknowledgement, and for each delivery waits on the limiter for the
// message's cost, calls the handler under the retry policy, and only then
// acks. A message whose handler failed permanently, or ran out of attempts,
// is nacked without requeue, so that the queue's dead-letter exchange takes
// it; RabbitMQ records why in the message's x-death header. The queue must
// therefore have a dead-letter exchange (Config.Declare sets one up):
// without one, RabbitMQ discards nacked messages. AMQP cannot add headers to
// a nacked message, so the error and the attempt count of a dead-lettered
// message go to the Logger and the Observer instead.
//
// amqp091 does not reconnect by itself; the Consumer does. Deliveries that
// were not acked when a connection broke are redelivered by the broker, to
// this or another replica, so no message is lost, but one may be handled
// twice: handlers must be idempotent, as always with at-least-once delivery.
//
// Users with their own delivery loop throttle it with one call per delivery,
// Wait, or with the middleware form, consumer.Throttle, over ToMessage.
package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
)

// ErrRunning is returned by Run when another call to Run of the same
// Consumer has not returned yet.
var ErrRunning = errors.New("rabbitmq: consumer is already running")

// ErrNotConnected is wrapped in the error that Backlog returns when the
// Consumer has no live connection to the broker: before Run has connected,
// while Run is reconnecting, and after Run has returned.
var ErrNotConnected = errors.New("not connected to the broker")

// closeTimeout bounds the closing handshake of a connection.
const closeTimeout = 5 * time.Second

var tagSeq atomic.Int64

// Consumer consumes one queue and calls a handler for each message, at most
// Config.Concurrency at a time. Create it with New and start it with Run.
//
// A Consumer is safe for concurrent use, but Run may be active only once at
// a time. To consume with several replicas, run one Consumer per process or
// several Consumers in one process; the broker spreads the deliveries among
// them.
type Consumer struct {
	cfg     Config
	uri     amqp.URI
	url     string // redacted, for logs
	tag     string
	handler consumer.Handler
	log     *slog.Logger
	running atomic.Bool

	connMu sync.Mutex
	conn   *amqp.Connection // of Run's live session, nil between sessions; guarded by connMu
	// probes counts the goroutines of Backlog calls, which Run waits for
	// before it returns. Add is called only under connMu with conn set.
	probes sync.WaitGroup
}

// New returns a Consumer that calls h for each message of cfg.Queue. It
// validates cfg and fills in its defaults, but does not connect: Run does.
// It returns an error naming the field at fault.
func New(cfg Config, h consumer.Handler) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("rabbitmq: handler is nil")
	}
	cfg, uri, redacted, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var mw []consumer.Middleware
	if cfg.Limiter != nil {
		mw = append(mw, consumer.Throttle(cfg.Limiter, cfg.Cost))
	}
	if cfg.Pauser != nil {
		mw = append(mw, consumer.PushBack(cfg.Pauser, cfg.MaxPause))
	}
	tag := cfg.ConsumerTag
	if tag == "" {
		host, _ := os.Hostname()
		tag = "throttle-" + host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(tagSeq.Add(1), 10)
	}
	return &Consumer{
		cfg:     cfg,
		uri:     uri,
		url:     redacted,
		tag:     tag,
		handler: consumer.Chain(h, mw...),
		log:     cfg.Logger.With("broker", Broker, "queue", cfg.Queue),
	}, nil
}

// Run connects, consumes and handles messages until ctx is cancelled.
//
// When the connection or the channel closes, Run reconnects with
// exponential backoff and jitter, sets the QoS again, declares the topology
// again if Config.Declare is set, and resumes consuming; each reconnect is
// logged and reported to Observer.Reconnected. Handlers still running for
// deliveries of the broken channel get a cancelled context: the broker
// redelivers those messages anyway, and they are never acked on the new
// channel, whose delivery tags are unrelated.
//
// When ctx is cancelled, Run cancels the consumer so that no new delivery
// arrives, lets in-flight handlers finish for up to Config.DrainTimeout, acks
// or dead-letters what finished, cancels the context of the handlers still
// running, waits for them, closes the connection and returns nil. Deliveries
// not handled to the end are not acked: closing the channel returns them to
// the queue. Handlers get a context that keeps ctx's values but is cancelled
// only at the drain deadline.
//
// Run returns an error only when, before it ever got a session going, the
// broker refuses the setup for a reason retrying cannot fix: access refused,
// queue not found, or queue arguments that conflict with Declare. Once it
// has consumed, every failure is retried. It returns ErrRunning when called
// while another Run of the Consumer is active.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	// Run's connections are all closed by the time this runs, so that the
	// Backlog calls still using one end promptly.
	defer c.probes.Wait()
	if !c.cfg.Declare {
		c.log.Warn("rabbitmq: declare is off, so messages that fail for good are nacked to the queue's own dead-letter exchange; "+
			"if the queue has none, by argument or policy, RabbitMQ drops them", "queue", c.cfg.Queue)
	}

	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	r := &run{
		Consumer:       c,
		hctx:           hctx,
		cancelHandlers: cancelHandlers,
		sem:            make(chan struct{}, c.cfg.Concurrency),
	}
	var (
		retries   int   // backoff sleeps since the last successful connect
		lastErr   error // why the previous session ended
		connected bool  // whether a session was ever established
	)
	for {
		s, err := c.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !connected && fatal(err) {
				r.drain()
				return fmt.Errorf("rabbitmq: %w", err)
			}
			delay := c.backoff(retries)
			retries++
			c.log.Warn("rabbitmq connect failed", "url", c.url, "retry_in", delay, "err", err)
			if !sleep(ctx, delay) {
				break
			}
			continue
		}
		if connected {
			c.log.Info("rabbitmq reconnected", "url", c.url, "attempts", retries, "cause", lastErr)
			c.cfg.Observer.ObserveReconnected(Broker, lastErr)
		} else {
			c.log.Info("rabbitmq connected", "url", c.url, "prefetch", c.cfg.Prefetch, "concurrency", c.cfg.Concurrency)
		}
		connected, retries = true, 0

		c.setConn(s.conn)
		lastErr = r.serve(ctx, s)
		c.setConn(nil) // serve closed s
		if lastErr == nil {
			return nil
		}
		delay := c.backoff(retries)
		retries++
		c.log.Warn("rabbitmq connection lost", "url", c.url, "retry_in", delay, "err", lastErr)
		if !sleep(ctx, delay) {
			break
		}
	}
	// ctx ended while disconnected. Handlers of broken sessions may still
	// be returning.
	r.drain()
	return nil
}

// setConn makes conn the connection that Backlog uses; nil makes Backlog
// return ErrNotConnected.
func (c *Consumer) setConn(conn *amqp.Connection) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	c.conn = conn
}

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

// run is the state of one call to Run.
type run struct {
	*Consumer
	hctx           context.Context // parent of every handler's context
	cancelHandlers context.CancelFunc
	sem            chan struct{} // one slot per running handler
	wg             sync.WaitGroup
	inflight       atomic.Int64
}

// serve dispatches the deliveries of s to handlers until ctx ends, in which
// case it shuts down gracefully and returns nil, or s breaks, in which case
// it returns why.
func (r *run) serve(ctx context.Context, s *session) error {
	sctx, cancel := context.WithCancel(r.hctx)
	defer cancel()
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
			return r.shutdown(s, cancel)
		case e := <-s.connClosed:
			return broken(closeError("connection", e))
		case e := <-s.chClosed:
			return broken(closeError("channel", e))
		}
		select {
		case d, ok := <-s.deliveries:
			if !ok {
				<-r.sem
				return broken(s.deliveriesClosed())
			}
			if ctx.Err() != nil {
				// Shutting down: d stays unacked and is requeued.
				<-r.sem
				return r.shutdown(s, cancel)
			}
			r.wg.Add(1)
			r.inflight.Add(1)
			go func() {
				defer func() {
					r.inflight.Add(-1)
					<-r.sem
					r.wg.Done()
				}()
				r.handle(sctx, d)
			}()
		case <-ctx.Done():
			<-r.sem
			return r.shutdown(s, cancel)
		case e := <-s.connClosed:
			<-r.sem
			return broken(closeError("connection", e))
		case e := <-s.chClosed:
			<-r.sem
			return broken(closeError("channel", e))
		}
	}
}

// shutdown cancels the consumer of s, drains the handlers and closes s. If s
// breaks meanwhile, it cancels the handlers' context with cancelSession,
// since their messages will be redelivered anyway.
func (r *run) shutdown(s *session, cancelSession context.CancelFunc) error {
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case <-s.connClosed:
		case <-s.chClosed:
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
		r.log.Warn("rabbitmq drain timeout; cancelling in-flight handlers, their messages will be redelivered",
			"in_flight", r.inflight.Load(), "drain_timeout", r.cfg.DrainTimeout)
		r.cancelHandlers()
		<-done
	}
}

// handle runs the handler for d under the retry policy, then acks d, nacks
// it to the dead-letter exchange, or, when ctx ended first, leaves it
// unacked for the broker to redeliver. Acks go to the channel d came from:
// if that channel has closed they fail, and the broker redelivers.
func (r *run) handle(ctx context.Context, d amqp.Delivery) {
	msg := ToMessage(d, r.cfg.Queue)
	r.cfg.Observer.ObserveReceived(msg)
	out := r.cfg.Retry.Process(ctx, r.handler, msg, r.cfg.Observer)
	msg.Attempt = out.Attempts
	attrs := []any{"message_id", d.MessageId, "delivery_tag", d.DeliveryTag, "redelivered", d.Redelivered}
	switch {
	case out.Abandoned:
		r.log.Debug("rabbitmq message left unacked for redelivery", append(attrs, "attempts", out.Attempts)...)
	case out.Err == nil:
		if err := d.Ack(false); err != nil {
			r.log.Warn("rabbitmq ack failed; the broker will redeliver the message", append(attrs, "err", err)...)
		}
	default:
		if err := d.Nack(false, false); err != nil {
			r.log.Warn("rabbitmq nack failed; the broker will redeliver the message", append(attrs, "err", err)...)
			return
		}
		r.cfg.Observer.ObserveDeadLettered(msg, out.Err)
		h := consumer.DeadLetterHeaders(msg, out)
		for _, k := range slices.Sorted(maps.Keys(h)) {
			attrs = append(attrs, k, h[k])
		}
		r.log.Warn("rabbitmq message dead-lettered", attrs...)
	}
}

// session is one connection with its consuming channel.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
}

// close closes the connection, and with it the channel. The broker requeues
// every delivery the channel did not ack.
func (s *session) close() {
	_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
}

// deliveriesClosed says why the delivery channel closed: the channel or
// connection closed, or the broker cancelled the consumer (the queue was
// deleted, for example).
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

// connect dials the broker and sets up a consuming channel. If ctx ends
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
	if err := s.ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("setting prefetch %d: %w", c.cfg.Prefetch, err)
	}
	if c.cfg.Declare {
		if err := c.declare(s.ch); err != nil {
			return nil, err
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

// backoff returns the delay before a reconnect attempt, given the number of
// earlier attempts since the connection was lost:
// ReconnectBackoff·2^retries, capped at MaxReconnectBackoff, with equal
// jitter (uniform between half and all of it), so that replicas that lost
// the broker together do not all come back at once.
func (c *Consumer) backoff(retries int) time.Duration {
	d := c.cfg.ReconnectBackoff
	for i := 0; i < retries && d < c.cfg.MaxReconnectBackoff; i++ {
		d *= 2
	}
	d = min(d, c.cfg.MaxReconnectBackoff)
	return d/2 + rand.N(d/2+1)
}

// fatal reports whether err is the broker refusing the setup for a reason
// that retrying cannot fix.
func fatal(err error) bool {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || !aerr.Server {
		return false
	}
	switch aerr.Code {
	case amqp.AccessRefused, amqp.NotFound, amqp.PreconditionFailed, amqp.NotAllowed:
		return true
	}
	return false
}

// sleep waits for d and reports whether ctx was still live when it ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
