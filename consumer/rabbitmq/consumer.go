package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/connstate"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// ErrNotConnected is wrapped in the errors of Backlog and Connected when
// the Consumer has no live connection to the broker: before Run has
// connected, while Run is reconnecting, and after Run has returned. It is
// consumer.ErrNotConnected.
var ErrNotConnected = consumer.ErrNotConnected

// closeTimeout bounds the closing handshake of a connection.
const closeTimeout = 5 * time.Second

var tagSeq atomic.Int64

// Consumer consumes one queue and calls a handler for each message, at most
// Options.Concurrency at a time. Create it with New, run it with Run, stop it
// by cancelling Run's context or with Close.
//
// A Consumer is safe for concurrent use. To consume with several replicas,
// run one Consumer per process or several Consumers in one process; the
// broker spreads the deliveries among them.
type Consumer struct {
	cfg  Config
	uri  amqp.URI
	url  string // redacted, for logs
	tag  string
	proc *kit.Processor
	log  *slog.Logger
	life kit.Lifecycle

	// state is the broker session as Connected reports it, with the
	// connection events it observes and logs.
	state  *connstate.State
	connMu sync.Mutex
	conn   *amqp.Connection // of Run's live session, nil between sessions; guarded by connMu
	// probes counts the goroutines of Backlog calls, which Run waits for
	// before it returns. Add is called only under connMu with conn set.
	probes sync.WaitGroup
	// delayProbe spares the broker a question for a delay queue that it
	// just said does not exist (BacklogParts).
	delayProbe delayProbe
	// lag is how late the delay queues bring messages back, which
	// setAside asks for them back ahead of.
	lag returnLag
}

// New returns a Consumer that calls h for each message of cfg.Queue. It
// validates cfg and fills in its defaults, but does not connect: Run does.
// It returns an error naming the field at fault.
func New(cfg Config, h consumer.Handler) (*Consumer, error) {
	if h == nil {
		return nil, fmt.Errorf("rabbitmq: %w: handler must not be nil", consumer.ErrInvalidConfig)
	}
	cfg, uri, redacted, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tag := cfg.ConsumerTag
	if tag == "" {
		host, _ := os.Hostname()
		tag = "throttle-" + host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(tagSeq.Add(1), 10)
	}
	log := cfg.Logger.With("broker", Broker, "queue", cfg.Queue)
	opts := cfg.Options
	opts.Logger = log
	// The consumers that share a queue compete for its messages: the
	// queue is their group.
	// A delivered message is acked once its dedupe mark is written
	// (run.handleOnce): the handler goes on meanwhile.
	popts := []kit.ProcessorOption{kit.ConsumerGroup(cfg.Queue), kit.MarksLater()}
	if cfg.SetAside {
		popts = append(popts, kit.SetsAside())
	}
	proc, err := kit.NewProcessor(opts, h, popts...)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	return &Consumer{
		cfg:   cfg,
		uri:   uri,
		url:   redacted,
		tag:   tag,
		proc:  proc,
		log:   log,
		state: connstate.New(Broker, cfg.Observer, log.With("url", redacted)),
	}, nil
}

// Run connects, consumes and handles messages until ctx is cancelled or
// Close is called. Run runs once: a second call, or a call after Close,
// returns consumer.ErrStopped.
//
// When the connection or a channel closes, Run reconnects with exponential
// backoff and jitter, sets the QoS again, declares the topology again if
// Config.Declare is set, and resumes consuming; each attempt is logged and
// reported to Observer.ReconnectAttempt, a lost session to
// Observer.Disconnected and a restored one to Observer.Reconnected, and
// Connected says meanwhile that the Consumer is not connected. Handlers
// still running for deliveries of the broken channel get a cancelled
// context: the broker redelivers those messages anyway, and they are never
// acked on the new channel, whose delivery tags are unrelated.
//
// When ctx is cancelled, Run cancels the consumer so that no new delivery
// arrives, lets in-flight handlers finish for up to Config.DrainTimeout,
// acks or dead-letters what finished, cancels the context of the handlers
// still running, nacks their deliveries with requeue, closes the
// connection and returns nil. Handlers get a context that keeps ctx's
// values but is cancelled only at the drain deadline.
//
// Run returns an error only when, before it ever got a session going, the
// broker refuses the setup for a reason retrying cannot fix: access refused
// (a wrong user or password, a virtual host or queue the user may not use;
// the error wraps consumer.ErrAccessRefused), queue or dead-letter exchange
// not found, or queue arguments that conflict with Declare. Once it has
// consumed, every failure is retried.
func (c *Consumer) Run(ctx context.Context) error {
	ctx, end, err := c.life.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	// Run's connections are all closed by the time this runs, so that the
	// Backlog calls still using one end promptly.
	defer c.probes.Wait()
	if c.cfg.DeadLetterExchange == "" {
		c.log.Warn("no dead-letter exchange known (Declare is off and DeadLetterExchange is empty): " +
			"messages that fail for good are nacked to the queue's own dead-letter exchange, without the reason headers; " +
			"if the queue has none, by argument or policy, RabbitMQ drops them")
	}

	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	r := newRun(c, hctx, cancelHandlers)
	r.startWorkers()
	defer r.stopWorkers()
	defer r.drain() // handlers of broken sessions may still be returning
	return c.loop(ctx, r)
}

// loop connects and serves sessions until ctx ends.
func (c *Consumer) loop(ctx context.Context, r *run) error {
	var (
		guesses int // consecutive client-side "username or password not allowed"
		backoff = kit.Backoff{Initial: c.cfg.ReconnectBackoff, Max: c.cfg.MaxReconnectBackoff}
		st      = c.state
	)
	defer st.Stopped()
	for {
		s, err := c.connect(ctx)
		if ctx.Err() != nil {
			if s != nil {
				s.close()
			}
			return nil
		}
		st.Attempted(err)
		if err != nil {
			if !st.EverUp() {
				if fatal := c.fatal(err, &guesses); fatal != nil {
					return fatal
				}
			}
			delay := backoff.Delay(st.Failures())
			st.Retry(ctx, err, delay, errors.Is(classify(err), consumer.ErrAccessRefused))
			if kit.Sleep(ctx, delay) != nil {
				return nil
			}
			continue
		}
		guesses = 0
		c.setConn(s.conn)
		// qos: the broker's prefetch count, twice prefetch with dedupe's
		// queued marks (Config.Prefetch).
		st.Up(slog.Int("prefetch", c.cfg.Prefetch), slog.Int("qos", c.qos()), slog.Int("concurrency", c.cfg.Concurrency),
			slog.String("ordering", string(c.cfg.Ordering)), slog.String("dead_letter_exchange", c.cfg.DeadLetterExchange))
		lost := r.serve(ctx, s)
		c.setConn(nil)
		if lost == nil {
			return nil
		}
		delay := backoff.Delay(st.Failures())
		st.Lost(lost, delay)
		if kit.Sleep(ctx, delay) != nil {
			return nil
		}
	}
}

// Close stops a running Run as if its context had ended and waits for it to
// return; Close before Run makes Run return consumer.ErrStopped. It is idempotent,
// safe from any goroutine except a handler of this Consumer, and returns
// nil.
func (c *Consumer) Close() error { return c.life.Close() }

// Connected returns nil while Run has a live session with the broker, and
// otherwise an error wrapping ErrNotConnected with the reason: Run has not
// connected yet, the last connection error, or Run returned. It is
// consumer.Consumer's Connected, for a readiness probe. It is safe for
// concurrent use and does not block on the network.
func (c *Consumer) Connected() error { return c.state.Connected() }

// setConn makes conn, nil between sessions, the connection that Backlog
// uses.
func (c *Consumer) setConn(conn *amqp.Connection) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	c.conn = conn
}

// fatal returns the error Run returns for err, a failed first connect, or
// nil when Run should retry. guesses counts consecutive client-side
// credential errors (see classify).
func (c *Consumer) fatal(err error, guesses *int) error {
	if errors.Is(err, amqp.ErrCredentials) {
		// amqp091 says "username or password not allowed" whenever the
		// broker closes the socket after the login, which RabbitMQ does
		// for bad credentials, but a broker restarting at that moment
		// does too: believe it the second time in a row.
		if *guesses++; *guesses < 2 {
			return nil
		}
	} else {
		*guesses = 0
	}
	cerr := classify(err)
	if cerr == nil {
		return nil
	}
	return fmt.Errorf("rabbitmq: %w", cerr)
}

// classify returns err wrapped with consumer.ErrAccessRefused when it is
// the broker refusing the user, or err itself when it is another refusal
// that retrying cannot fix (queue or exchange not found, arguments that
// conflict); nil when retrying may help.
func classify(err error) error {
	if errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrSASL) {
		return fmt.Errorf("%w: %w", consumer.ErrAccessRefused, err)
	}
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || !aerr.Server {
		return nil
	}
	switch aerr.Code {
	case amqp.AccessRefused, amqp.NotAllowed:
		// 403: login or permission refused; 530: a virtual host that does
		// not exist or that the user may not use.
		return fmt.Errorf("%w: %w", consumer.ErrAccessRefused, err)
	case amqp.NotFound, amqp.PreconditionFailed:
		return err
	}
	return nil
}
