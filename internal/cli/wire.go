package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
	"github.com/throttlehq/throttle/sinks/postgres"
	"github.com/throttlehq/throttle/sinks/stdout"
)

// runner is a consumer: kafka.Consumer or rabbitmq.Consumer.
type runner interface {
	Run(ctx context.Context) error
}

// newLogger returns a slog logger writing to w in the configured format and
// level.
func newLogger(cfg config.Log, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel(), ReplaceAttr: logReplaceAttr}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// limiterOptions maps the limit section to the bucket's options.
func limiterOptions(cfg *config.Config, obs *limiter.Observer, log *slog.Logger) limiter.Options {
	opts := cfg.Limit.LimiterOptions()
	opts.Observer = obs
	opts.Logger = log
	if h := cfg.Sink.HTTP; h != nil && h.PushBackEnabled() {
		opts.MaxPause = time.Duration(h.MaxPause)
	}
	return opts
}

// consumerLimiter returns what the consumer waits on: the bucket, through
// consumer.NewLimiter, with the message's class (limit.priority, or the
// value of limit.priority_header), its key in each keyed layer of
// limit.extra, and limit.max_wait; it counts the messages waiting for
// tokens and the tokens granted in m.
func consumerLimiter(cfg config.Limit, bucket *limiter.Bucket, m *metrics) (consumer.MessageLimiter, error) {
	keys, err := cfg.LayerKeys()
	if err != nil {
		return nil, &configError{err: err}
	}
	lim, err := consumer.NewLimiter(bucket, consumer.LimitOptions{
		Keys:        keys,
		Priority:    cfg.PriorityFunc(),
		WaitTimeout: time.Duration(cfg.MaxWait),
		Waiting:     m.addWaiting,
		Granted:     m.tookTokens,
	})
	if err != nil {
		return nil, &configError{err: fmt.Errorf("limit: %w", err)}
	}
	return lim, nil
}

// newSink builds the configured sink. Sinks holding connections are closed
// by the returned function.
func newSink(ctx context.Context, cfg config.Sink, out io.Writer) (sinks.Sink, func(), error) {
	switch {
	case cfg.HTTP != nil:
		s, err := httpsink.New(cfg.HTTP.SinkConfig())
		if err != nil {
			return nil, nil, &configError{err: fmt.Errorf("sink.http: %w", err)}
		}
		// A preset's credentials are checked now where the provider
		// allows it, so that wrong ones stop the start, not every message.
		if err := s.Check(ctx); err != nil {
			_ = s.Close()
			return nil, nil, fmt.Errorf("sink.http: checking the credentials: %w", err)
		}
		return s, func() { _ = s.Close() }, nil
	case cfg.Postgres != nil:
		s, err := postgres.New(ctx, cfg.Postgres.SinkConfig())
		if err != nil {
			if errors.Is(err, postgres.ErrNoTable) {
				// The library names its Go field; say it in the file's terms.
				err = fmt.Errorf("%w; sink.postgres.create_table: true creates it", err)
			}
			return nil, nil, fmt.Errorf("starting the postgres sink: %w", err)
		}
		return s, func() { _ = s.Close() }, nil
	case cfg.Stdout != nil:
		return stdout.New(out), func() {}, nil
	}
	return nil, nil, &configError{err: errors.New("sink: exactly one of http, postgres, stdout must be set")}
}

// consumerDeps are the parts of a consumer that do not come from the
// source section.
type consumerDeps struct {
	limiter consumer.Limiter
	cost    consumer.CostFunc
	pauser  consumer.Pauser
	retry   consumer.RetryPolicy
	drain   time.Duration
	// maxSetAside caps one stay in a delay topic or queue
	// (delivery.max_set_aside).
	maxSetAside time.Duration
	observer    *consumer.Observer
	log         *slog.Logger
	// priority gives each message's class when limit.priority_header is
	// set, so that the consumer starts the higher classes first; nil when
	// every message has the replica's class.
	priority consumer.PriorityFunc
	// setAside is set when a layer of limit.extra sets messages aside
	// (on_exceed: delay): the Kafka consumer then uses its delay topic.
	setAside bool
	// assigned tells the bucket how many partitions the Kafka consumer
	// owns: none makes the replica idle (limiter.Bucket.SetIdle).
	assigned func(partitions int)
}

// newDeps maps the limit, sink and delivery sections to consumerDeps.
// Push-back pauses the shared bucket only for an HTTP sink with
// sink.http.push_back on, the one sink that reports Retry-After.
func newDeps(cfg *config.Config, lim consumer.Limiter, bucket *limiter.Bucket, obs *consumer.Observer, log *slog.Logger) consumerDeps {
	d := consumerDeps{
		limiter:     lim,
		retry:       cfg.Delivery.RetryPolicy(),
		drain:       time.Duration(cfg.Delivery.DrainTimeout),
		maxSetAside: time.Duration(cfg.Delivery.MaxSetAside),
		observer:    obs,
		log:         log,
	}
	if cfg.Limit.PriorityHeader != "" {
		d.priority = cfg.Limit.PriorityFunc()
	}
	if bucket != nil {
		d.assigned = func(n int) { bucket.SetIdle(n == 0) }
	}
	for _, x := range cfg.Limit.Extra {
		if x.OnExceed == string(limiter.ActionDelay) {
			d.setAside = true
		}
	}
	// limit.cost_template or limit.cost_header; config.Validate parsed
	// the template already, so there is no error left to report.
	if cost, err := cfg.Limit.CostFunc(); err == nil {
		d.cost = cost
	}
	if h := cfg.Sink.HTTP; h != nil && h.PushBackEnabled() {
		d.pauser = bucket
	}
	return d
}

// options returns the consumer options of d with the source's ordering and
// its ordering key function.
func (d consumerDeps) options(ordering consumer.Ordering, keyFunc func() (consumer.KeyFunc, error)) (consumer.Options, error) {
	key, err := keyFunc()
	if err != nil {
		return consumer.Options{}, err
	}
	return consumer.Options{
		Limiter:      d.limiter,
		Cost:         d.cost,
		Pauser:       d.pauser,
		Retry:        d.retry,
		DrainTimeout: d.drain,
		MaxSetAside:  d.maxSetAside,
		Observer:     d.observer,
		Logger:       d.log,
		Ordering:     ordering,
		OrderingKey:  key,
		Priority:     d.priority,
	}, nil
}

// newConsumer builds the configured source's consumer around h.
func newConsumer(src config.Source, d consumerDeps, h consumer.Handler) (runner, error) {
	switch {
	case src.Kafka != nil:
		k := src.Kafka
		dialer, err := kafkaDialer(k)
		if err != nil {
			return nil, err
		}
		opts, err := d.options(k.Ordering, k.KeyFunc)
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.kafka.ordering_key: %w", err)}
		}
		kc := k.ConsumerConfig(opts, dialer)
		kc.SetAside = d.setAside
		kc.Assigned = d.assigned
		c, err := kafka.New(kc, h)
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.kafka: %w", err)}
		}
		return c, nil
	case src.RabbitMQ != nil:
		q := src.RabbitMQ
		tlsConf, err := q.TLS.ClientConfig()
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.rabbitmq.%w", err)}
		}
		opts, err := d.options(q.Ordering, q.KeyFunc)
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.rabbitmq.ordering_key: %w", err)}
		}
		c, err := rabbitmq.New(q.ConsumerConfig(tlsConf, opts), h)
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.rabbitmq: %w", err)}
		}
		return c, nil
	}
	return nil, &configError{err: errors.New("source: exactly one of kafka, rabbitmq must be set")}
}

// kafkaDialer returns the dialer for TLS and SASL, or nil when neither is
// configured.
func kafkaDialer(k *config.Kafka) (*kafkago.Dialer, error) {
	tlsConf, err := k.TLS.ClientConfig()
	if err != nil {
		return nil, &configError{err: fmt.Errorf("source.kafka.%w", err)}
	}
	if tlsConf == nil && k.SASL.Mechanism == config.SASLNone {
		return nil, nil
	}
	d := &kafkago.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: tlsConf}
	switch k.SASL.Mechanism {
	case config.SASLNone:
	case config.SASLPlain:
		d.SASLMechanism = plain.Mechanism{Username: k.SASL.Username, Password: k.SASL.Password}
	case config.SASLScramSHA256, config.SASLScramSHA512:
		algo := scram.SHA256
		if k.SASL.Mechanism == config.SASLScramSHA512 {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, k.SASL.Username, k.SASL.Password)
		if err != nil {
			// The error is about the user name or password: do not echo it.
			return nil, &configError{err: fmt.Errorf("source.kafka.sasl: %s credentials are not usable (check the user name and password for SASLprep)", k.SASL.Mechanism)}
		}
		d.SASLMechanism = m
	default:
		return nil, &configError{err: fmt.Errorf("source.kafka.sasl.mechanism: unknown mechanism %q", k.SASL.Mechanism)}
	}
	return d, nil
}
