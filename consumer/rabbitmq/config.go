package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
)

// Defaults of the Config fields.
const (
	DefaultPrefetch            = 50
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultMaxReconnectBackoff = 10 * time.Second
)

// DefaultDrainTimeout is the default of Options.DrainTimeout, the same for
// every backend.
const DefaultDrainTimeout = consumer.DefaultDrainTimeout

// defaultDialTimeout bounds the TCP dial and the TLS and AMQP handshakes when
// the URL sets no connection_timeout, as amqp091 does.
const defaultDialTimeout = 30 * time.Second

// Config configures a Consumer. The zero value of every optional field uses
// the documented default.
type Config struct {
	// Options are the settings every backend shares: limiter, cost,
	// push-back, retry policy, drain timeout, ordering, observer and
	// logger (see consumer.Options).
	//
	// Ordering for a queue: OrderPartition (the default) and OrderNone
	// start deliveries in the order the broker sends them, up to
	// Concurrency at once, so only Concurrency 1 keeps the queue's order.
	// OrderKey handles the deliveries of one key (OrderingKey; default
	// the routing key, or consumer.KeyFromHeader, or a template in the
	// binary) strictly one after the other, in delivery order, while
	// other keys proceed, up to Concurrency keys at once. Prefetch bounds
	// the deliveries in flight, those waiting behind their key included.
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
	Prefetch int
	// Concurrency is the number of handlers that run at once. Default
	// Prefetch; more than Prefetch is pointless because the broker never
	// has more deliveries out than that.
	Concurrency int
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
	// key (consumer.HeaderOriginalQueue...), under a publisher confirm,
	// and only then acks them. Default with Declare: Queue+".dlx".
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
	// jitter (consumer.Backoff). Defaults 100ms and 10s.
	ReconnectBackoff    time.Duration
	MaxReconnectBackoff time.Duration
	// ConsumerTag names the consumer on the broker and the connection
	// (connection_name). Default "throttle-<host>-<pid>-<n>".
	ConsumerTag string
}

// withDefaults validates c and returns it with every default filled in,
// along with the parsed URL and its redacted form for logs.
func (c Config) withDefaults() (Config, amqp.URI, string, error) {
	if c.URL == "" {
		return c, amqp.URI{}, "", errors.New("rabbitmq: URL is required")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		// *url.Error quotes the whole URL, password included: keep only
		// its cause.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: URL: %w", err)
	}
	redacted := u.Redacted()
	uri, err := amqp.ParseURI(c.URL)
	if err != nil {
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: URL %s: %w", redacted, err)
	}
	if c.TLS != nil && uri.Scheme != "amqps" {
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: TLS is set but URL %s is not amqps://", redacted)
	}
	if c.Queue == "" {
		return c, amqp.URI{}, "", errors.New("rabbitmq: Queue is required")
	}
	switch {
	case c.Prefetch < 0 || c.Prefetch > 65535:
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: Prefetch %d: must be between 0 and 65535", c.Prefetch)
	case c.Prefetch == 0:
		c.Prefetch = DefaultPrefetch
	}
	switch {
	case c.Concurrency < 0:
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: Concurrency %d: must not be negative", c.Concurrency)
	case c.Concurrency == 0:
		c.Concurrency = c.Prefetch
	}
	if c.DeadLetterExchange == "" && c.Declare {
		c.DeadLetterExchange = c.Queue + ".dlx"
	}
	opts, err := c.Options.WithDefaults()
	if err != nil {
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: %w", err)
	}
	c.Options = opts
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"ReconnectBackoff", &c.ReconnectBackoff, DefaultReconnectBackoff},
		{"MaxReconnectBackoff", &c.MaxReconnectBackoff, DefaultMaxReconnectBackoff},
	} {
		switch {
		case *d.v < 0:
			return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: %s %v: must not be negative", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if c.MaxReconnectBackoff < c.ReconnectBackoff {
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: MaxReconnectBackoff %v is below ReconnectBackoff %v",
			c.MaxReconnectBackoff, c.ReconnectBackoff)
	}
	return c, uri, redacted, nil
}
