package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
)

// Defaults of the Config fields.
const (
	DefaultPrefetch            = 50
	DefaultDrainTimeout        = 30 * time.Second
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultMaxReconnectBackoff = 10 * time.Second
)

// defaultDialTimeout bounds the TCP dial and the TLS and AMQP handshakes when
// the URL sets no connection_timeout, as amqp091 does.
const defaultDialTimeout = 30 * time.Second

// Config configures a Consumer. The zero value of every optional field uses
// the documented default.
type Config struct {
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
	// PRECONDITION_FAILED. Without Declare the queue must exist, and it
	// must have a dead-letter exchange (by argument or policy): otherwise
	// RabbitMQ discards the messages that are dead-lettered.
	Declare bool
	// DeadLetterExchange is the exchange that Declare sets up as the
	// queue's dead-letter exchange. Default Queue+".dlx". Ignored without
	// Declare.
	DeadLetterExchange string
	// Limiter, when set, is waited on for each message's cost before every
	// handler attempt (consumer.Throttle). Default: no throttling.
	Limiter consumer.Limiter
	// Cost is the cost of a message in tokens. Default consumer.CostOne.
	// It requires Limiter.
	Cost consumer.CostFunc
	// Pauser, when set, is paused when a handler returns an error made with
	// consumer.RetryAfter, so that every replica slows down
	// (consumer.PushBack). It is usually the same bucket as Limiter.
	Pauser consumer.Pauser
	// MaxPause caps those pauses. Default 0: no cap beyond the Pauser's
	// own.
	MaxPause time.Duration
	// Retry is the retry policy for failed handlers. The zero value uses
	// consumer.RetryPolicy's defaults.
	Retry consumer.RetryPolicy
	// DrainTimeout is how long Run lets in-flight handlers finish after
	// its context is cancelled, before it cancels their context. Default
	// 30s.
	DrainTimeout time.Duration
	// ReconnectBackoff is the delay before the first reconnect attempt. It
	// doubles with each failed attempt up to MaxReconnectBackoff, with
	// jitter. Defaults 100ms and 10s.
	ReconnectBackoff    time.Duration
	MaxReconnectBackoff time.Duration
	// Observer receives message and reconnect events. Default: none.
	Observer *consumer.Observer
	// Logger receives connection events and dead-lettered messages.
	// Default slog.Default().
	Logger *slog.Logger
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
	if c.DeadLetterExchange == "" {
		c.DeadLetterExchange = c.Queue + ".dlx"
	}
	if c.Cost != nil && c.Limiter == nil {
		return c, amqp.URI{}, "", errors.New("rabbitmq: Cost is set but Limiter is nil")
	}
	if c.MaxPause < 0 {
		return c, amqp.URI{}, "", fmt.Errorf("rabbitmq: MaxPause %v: must not be negative", c.MaxPause)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"DrainTimeout", &c.DrainTimeout, DefaultDrainTimeout},
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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, uri, redacted, nil
}
