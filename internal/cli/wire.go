package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/consumer/redisdedupe"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
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

// builder assembles one replica's pipeline from the libraries'
// configurations that config.Libraries mapped from the YAML, in the order
// run needs its parts: the bucket, the sink, the consumer. It adds only
// what is not configuration (the Redis client, metrics, logs, and the
// bucket where the consumer and the sink need it) and reads nothing of the
// YAML model, so that a value goes one way, from the file down to the
// library that uses it, and a program building from config.Libraries gets
// the same pipeline. The libraries validate and default what they are
// given; their errors name Go fields, and the YAML keys are those of
// config.Validate, which checked the file before.
type builder struct {
	lib *config.Libraries
	m   *metrics
	log *slog.Logger
	// tp traces the consumer's messages (tracing.*); nil when off.
	tp trace.TracerProvider
	// dedupe is the store of delivery.dedupe, nil without.
	dedupe *redisdedupe.Store
}

// dedupeStore builds the Redis store of delivery.dedupe
// (Libraries.DedupeStore) with the bucket's key prefix, or nil without
// dedupe. The caller closes it after the consumer stopped.
func (b builder) dedupeStore(client redis.UniversalClient) (*redisdedupe.Store, error) {
	sc := b.lib.DedupeStore
	if sc == nil {
		return nil, nil
	}
	cfg := *sc
	cfg.Prefix = b.lib.Bucket.Prefix
	s, err := redisdedupe.New(client, cfg)
	if err != nil {
		return nil, &configError{err: fmt.Errorf("delivery.dedupe: %w", err)}
	}
	return s, nil
}

// bucket builds the shared bucket in Redis (Libraries.Bucket), with the
// layers of limit.extra, and the limiter around it (Libraries.Limiter),
// which reports to the metrics and logs push-back pauses.
func (b builder) bucket(client redis.UniversalClient) (*redislimiter.Store, *limiter.Bucket, error) {
	store, err := redislimiter.New(client, b.lib.Bucket)
	if err != nil {
		return nil, nil, &configError{err: fmt.Errorf("limit: %w", err)}
	}
	var ls limiter.Store = store
	if len(b.lib.Layers) > 0 || b.lib.Fair != nil || b.lib.Limiter.Shadow { // a shadow shared bucket is decided with the layers
		layered, err := store.WithLayers(b.lib.Layers)
		if err != nil {
			return nil, nil, &configError{err: fmt.Errorf("limit.extra: %w", err)}
		}
		if b.lib.Fair != nil {
			if layered, err = layered.WithFair(*b.lib.Fair); err != nil {
				return nil, nil, &configError{err: fmt.Errorf("limit.fair: %w", err)}
			}
		}
		ls = layered
	}
	opts := b.lib.Limiter
	opts.Observer = newPauseReporter(b.log, pauseLogEvery).observe(layerObserver(b.m, b.m.limiterObserver(), b.lib.Layers, b.lib.Fair != nil, b.lib.Limiter.Shadow))
	opts.Logger = b.log
	bucket, err := limiter.New(ls, opts)
	if err != nil {
		return nil, nil, &configError{err: fmt.Errorf("limit: %w", err)}
	}
	return store, bucket, nil
}

// sink builds the configured sink. Sinks holding connections are closed
// by the returned function. The HTTP sink caps a provider's delay where
// bucket caps the pause it causes (limiter.Bucket.MaxPause), so that the
// message that got it is retried when the pause ends.
func (b builder) sink(ctx context.Context, bucket *limiter.Bucket, out io.Writer) (sinks.Sink, func(), error) {
	switch lib := b.lib; {
	case lib.HTTP != nil:
		cfg := *lib.HTTP
		cfg.MaxRetryAfter = bucket.MaxPause()
		s, err := httpsink.New(cfg)
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
	case lib.Postgres != nil:
		s, err := postgres.New(ctx, *lib.Postgres)
		if err != nil {
			if errors.Is(err, postgres.ErrNoTable) {
				// The library names its Go field; say it in the file's terms.
				err = fmt.Errorf("%w; sink.postgres.create_table: true creates it", err)
			}
			return nil, nil, fmt.Errorf("starting the postgres sink: %w", err)
		}
		return s, func() { _ = s.Close() }, nil
	case lib.Stdout:
		return stdout.New(out), func() {}, nil
	}
	return nil, nil, &configError{err: errors.New("sink: exactly one of http, postgres, stdout must be set")}
}

// consumer builds the configured source's consumer around h. It waits on
// bucket through consumer.NewLimiter (Libraries.Limit), which also gives
// the consumer its messages' classes; with push-back on, a delay a sink
// reports pauses bucket; a Kafka member without partitions marks the
// replica idle (limiter.Bucket.SetIdle).
// With delivery.dedupe, its claims and marks are kept in b.dedupe.
func (b builder) consumer(bucket *limiter.Bucket, h consumer.Handler) (runner, error) {
	lim, err := consumerLimiter(b.lib.Limit, bucket, b.m)
	if err != nil {
		return nil, err
	}
	add := func(o *consumer.Options) {
		if o.Dedupe != nil && b.dedupe != nil {
			d := *o.Dedupe
			d.Store = b.dedupe
			o.Dedupe = &d
		}
		o.Limiter = lim
		if b.lib.PushBack {
			o.Pauser = bucket
		}
		o.Observer = b.m.consumerObserver()
		o.Logger = b.log
		o.TracerProvider = b.tp
	}
	switch lib := b.lib; {
	case lib.Kafka != nil:
		cfg := *lib.Kafka
		add(&cfg.Options)
		cfg.Assigned = func(n int) { bucket.SetIdle(n == 0) }
		c, err := kafka.New(cfg, h)
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.kafka: %w", err)}
		}
		return c, nil
	case lib.RabbitMQ != nil:
		cfg := *lib.RabbitMQ
		add(&cfg.Options)
		c, err := rabbitmq.New(cfg, h)
		if err != nil {
			return nil, &configError{err: fmt.Errorf("source.rabbitmq: %w", err)}
		}
		return c, nil
	}
	return nil, &configError{err: errors.New("source: exactly one of kafka, rabbitmq must be set")}
}

// consumerLimiter returns what the consumer waits on: bucket, through
// consumer.NewLimiter with opts (Libraries.Limit: each message's keys in
// the layers of limit.extra, its class, limit.max_wait), counting the
// messages waiting for tokens and the tokens granted in m.
func consumerLimiter(opts consumer.LimitOptions, bucket *limiter.Bucket, m *metrics) (consumer.MessageLimiter, error) {
	opts.Waiting = m.addWaiting
	opts.Granted = m.tookTokens
	lim, err := consumer.NewLimiter(bucket, opts)
	if err != nil {
		return nil, &configError{err: fmt.Errorf("limit: %w", err)}
	}
	return lim, nil
}
