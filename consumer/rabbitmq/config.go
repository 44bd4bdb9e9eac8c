package rabbitmq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// Defaults of the Config fields.
const (
	DefaultPrefetch            = 50
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultMaxReconnectBackoff = 10 * time.Second
)

// DefaultDrainTimeout is the default of Options.DrainTimeout, the same for
// every backend.
const DefaultDrainTimeout = kit.DefaultDrainTimeout

// defaultDialTimeout bounds the TCP dial and the TLS and AMQP handshakes when
// the URL sets no connection_timeout, as amqp091 does.
const defaultDialTimeout = 30 * time.Second

// Config configures a Consumer. The zero value of every optional field uses
// the documented default.
type Config struct {
	// Options are the settings every backend shares: limiter, cost,
	// push-back, concurrency, set aside, retry policy, drain timeout,
	// ordering, observer and logger (see consumer.Options).
	// Options.Concurrency defaults to Prefetch; more is pointless, since
	// the broker never has more deliveries out than that. With
	// Options.SetAside, the messages set aside go to the delay queues
	// (DelayQueues).
	//
	// Ordering for a queue: OrderPartition (the default) and OrderNone
	// start deliveries in the order the broker sends them, up to
	// Concurrency at once, so only Concurrency 1 keeps the queue's order.
	// OrderKey handles the deliveries of one key (OrderingKey; default
	// the routing key, or a header, or a template in the binary)
	// strictly one after the other, in delivery order, while
	// other keys proceed, up to Concurrency messages at once. Prefetch
	// bounds the deliveries in flight, those waiting behind their key
	// included.
	//
	// With classes (Options.Priority), OrderKey and OrderNone start a
	// delivery of a higher class ahead of the lower-class ones that wait
	// for a handler (under OrderKey, not ahead of its own key's), and the
	// lower classes leave a reserve of the Concurrency handlers free for
	// it (see consumer.Ordering). Only deliveries within Prefetch are
	// reordered: a higher-class message further back in the queue waits
	// until the broker sends it (a queue declared with x-max-priority and
	// messages published with a priority property make the broker send
	// it first). OrderPartition ignores classes.
	consumer.Options

	// URL is the broker address: amqp://user:pass@host:5672/vhost, or
	// amqps:// for TLS. Required. The password never appears in logs or
	// errors.
	URL string
	// TLS configures the TLS client for an amqps URL. Nil uses the system
	// roots and the URL's host name. Setting it with an amqp URL is an
	// error, so that TLS is never silently off. The Consumer clones it for
	// each dial and never modifies it.
	TLS *tls.Config
	// Queue is the queue to consume. Required.
	Queue string
	// Prefetch is the QoS prefetch count: how many unacknowledged
	// deliveries the broker sends ahead. It bounds the messages in flight
	// and the redeliveries after a crash. Default 50, at most 65535.
	//
	// With Options.Dedupe on a store that queues its marks
	// (redisdedupe.Store), a delivery whose handler is done and that waits
	// only for its mark before its ack does not count against it: the
	// Consumer asks the broker for twice Prefetch (at most 65535), and
	// takes deliveries from it only while fewer than Prefetch are being
	// handled or wait for a handler. Up to twice Prefetch are then
	// unacknowledged, and redelivered after a crash (those already marked
	// are acked without a send).
	Prefetch int
	// AckDelay is how long the ack of a settled delivery may wait, so
	// that the acks of the deliveries settled meanwhile go out together,
	// as one Ack with multiple set: one frame and one write for many
	// messages, on this process and on the broker. A delivery is acked
	// only once it is settled (delivered, dead-lettered or set aside), as
	// without it; one settled while a lower one is still being handled
	// is acked on its own after one to two AckDelays. An ack waits only
	// while it keeps no delivery from a free handler: when the deliveries
	// unacked fill the prefetch (the broker sends no more) and none waits
	// for a handler, as with a slow sink, every ack waiting goes out at
	// once. The price: a delivery waiting holds its place of Prefetch
	// until its ack, and a crash redelivers, and so sends again, the
	// messages settled in the last AckDelay or two (at 1,000 messages a
	// second and the default, at most 1,000/s × 2ms = 2). Default
	// DefaultAckDelay (1ms), at most 1s; negative: each delivery is
	// acked on its own at once.
	AckDelay time.Duration
	// Declare makes the Consumer declare its topology on every connect: the
	// queue, durable, with x-dead-letter-exchange set to
	// DeadLetterExchange; that exchange, fanout and durable; and the queue
	// "<Queue>.dlq", durable and bound to it. An existing queue declared
	// with other arguments makes Run fail at its first connect with
	// PRECONDITION_FAILED.
	Declare bool
	// DeadLetterExchange is where the Consumer publishes the messages that
	// fail for good, with the headers consumer.HeaderError,
	// consumer.HeaderAttempts and the original queue, exchange and routing
	// key (HeaderOriginalQueue...), under a publisher confirm,
	// and only then acks them. The dead letter keeps the body, the
	// properties and the routing key, and is persistent; as with
	// RabbitMQ's own dead-lettering, one that the exchange routes to no
	// queue is dropped. Default with Declare: Queue+".dlx".
	//
	// Without Declare, set it to the queue's dead-letter exchange: Run
	// then checks at each connect that it exists. Left empty without
	// Declare, no dead-letter exchange is known: a failed message is
	// nacked without requeue, so the queue's own dead-letter exchange
	// takes it (RabbitMQ drops it if the queue has none, by argument or
	// policy) with only RabbitMQ's x-death header, and Run says so in one
	// warning at start.
	DeadLetterExchange string
	// ReconnectBackoff is the delay before the first reconnect attempt. It
	// doubles with each failed attempt up to MaxReconnectBackoff, with
	// equal jitter (each delay between half and all of it). Defaults 100ms
	// and 10s.
	ReconnectBackoff    time.Duration
	MaxReconnectBackoff time.Duration
	// ConsumerTag names the consumer on the broker and the connection
	// (connection_name). Default "throttle-<host>-<pid>-<n>".
	ConsumerTag string
}

// Validate returns nil or every problem of c, each a *consumer.FieldError
// naming the Go field at fault ("URL", "Prefetch", "Retry.MaxAttempts"),
// joined with errors.Join (read them with consumer.FieldErrors). No error
// contains the URL's password. New calls it; the config package calls it
// to name its own keys.
func (c Config) Validate() error {
	_, errs := c.check()
	return errors.Join(errs...)
}

// check validates c and returns the parsed URL with every problem.
func (c Config) check() (amqp.URI, []error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &consumer.FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	var uri amqp.URI
	if c.URL == "" {
		bad("URL", "required")
	} else if u, err := url.Parse(c.URL); err != nil {
		// *url.Error quotes the whole URL, password included: keep only
		// its cause.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		bad("URL", "%w", err)
	} else {
		redacted := u.Redacted()
		if uri, err = amqp.ParseURI(c.URL); err != nil {
			bad("URL", "%s: %w", redacted, err)
		} else if c.TLS != nil && uri.Scheme != "amqps" {
			bad("TLS", "is set but URL %s is not amqps://", redacted)
		}
	}
	if c.Queue == "" {
		bad("Queue", "required")
	}
	if c.Prefetch < 0 || c.Prefetch > 65535 {
		bad("Prefetch", "%d must be between 1 and 65535 (0: default %d)", c.Prefetch, DefaultPrefetch)
	}
	if c.AckDelay > maxAckDelay {
		bad("AckDelay", "%v is over %v (negative: each delivery acked on its own at once)", c.AckDelay, maxAckDelay)
	}
	if c.ReconnectBackoff < 0 {
		bad("ReconnectBackoff", "%v must not be negative", c.ReconnectBackoff)
	}
	if c.MaxReconnectBackoff < 0 {
		bad("MaxReconnectBackoff", "%v must not be negative", c.MaxReconnectBackoff)
	}
	lo, hi := cmp.Or(c.ReconnectBackoff, DefaultReconnectBackoff), cmp.Or(c.MaxReconnectBackoff, DefaultMaxReconnectBackoff)
	if c.ReconnectBackoff >= 0 && c.MaxReconnectBackoff >= 0 && hi < lo {
		bad("MaxReconnectBackoff", "%v is below ReconnectBackoff %v", hi, lo)
	}
	if err := c.Options.Validate(); err != nil {
		errs = append(errs, err)
	}
	return uri, errs
}

// withDefaults validates c and returns it with every default filled in,
// along with the parsed URL and its redacted form for logs.
func (c Config) withDefaults() (Config, amqp.URI, string, error) {
	uri, errs := c.check()
	if len(errs) > 0 {
		return c, uri, "", fmt.Errorf("rabbitmq: %w: %w", consumer.ErrInvalidConfig, errors.Join(errs...))
	}
	u, _ := url.Parse(c.URL) // check parsed it
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.Concurrency == 0 {
		c.Concurrency = c.Prefetch
	}
	if c.DeadLetterExchange == "" && c.Declare {
		c.DeadLetterExchange = c.Queue + ".dlx"
	}
	c.AckDelay = cmp.Or(c.AckDelay, DefaultAckDelay)
	c.ReconnectBackoff = cmp.Or(c.ReconnectBackoff, DefaultReconnectBackoff)
	c.MaxReconnectBackoff = cmp.Or(c.MaxReconnectBackoff, DefaultMaxReconnectBackoff)
	opts, err := kit.WithDefaults(c.Options)
	if err != nil {
		return c, uri, "", fmt.Errorf("rabbitmq: %w", err) // unreachable: check validated them; wraps consumer.ErrInvalidConfig
	}
	c.Options = opts
	return c, uri, u.Redacted(), nil
}
