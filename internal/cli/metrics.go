package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// modes lists every limiter mode, so that throttle_limiter_mode always has
// one series per mode.
var modes = []limiter.Mode{limiter.ModeShared, limiter.ModeLocal, limiter.ModeClosed, limiter.ModeOpen}

// metrics holds the Prometheus metrics of one replica, in a registry of its
// own, and the few counters the progress line reads back. It is safe for
// concurrent use.
type metrics struct {
	reg *prometheus.Registry

	received     *prometheus.CounterVec
	delivered    *prometheus.CounterVec
	retried      *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	failed       *prometheus.CounterVec
	reconnects   *prometheus.CounterVec
	// waitSeconds and waitingBy have one series per class
	// (limiter.Priority), labelled priority.
	waitSeconds [limiter.NumPriorities]prometheus.Observer
	waitingBy   atomic.Pointer[func() [limiter.NumPriorities]int]
	// sendSeconds times each call of the sink, by outcome (delivered,
	// failed); sendsInFlight counts the calls in progress.
	sendSeconds   *prometheus.HistogramVec
	sendsInFlight atomic.Int64
	tokens        prometheus.Gauge
	rate          prometheus.Gauge
	redisErrors   prometheus.Counter
	mode          *prometheus.GaugeVec
	// backlog counts every message waiting at the broker,
	// backlogSetAside those of them set aside in the delay topic or
	// queue.
	backlog         *prometheus.GaugeVec
	backlogSetAside *prometheus.GaugeVec
	tokensTaken     prometheus.Counter
	// recipientGone counts dead letters whose sink error says the
	// recipient is gone (httpsink.IsRecipientGone), by preset.
	recipientGone *prometheus.CounterVec
	preset        string // the label of recipientGone
	// deduplicated counts the messages acked without a send, their
	// dedupe key already sent; dedupeSkipped those sent without dedupe,
	// by reason; dedupeErrors the dedupe store's failed calls.
	deduplicated  *prometheus.CounterVec
	dedupeSkipped *prometheus.CounterVec
	dedupeErrors  prometheus.Counter
	broker        string
	// own holds the counters' series for broker, looked up once: the
	// observers run for every message.
	own brokerCounters

	deliveredN atomic.Int64
	waitingN   atomic.Int64
	tokensN    atomic.Int64  // tokens taken, for the average cost of a message
	grantsN    atomic.Int64  // successful waits
	rateBits   atomic.Uint64 // math.Float64bits of the last effective rate
}

// brokerCounters are the per-message counters' series of one broker.
type brokerCounters struct {
	received, delivered, retried, deadLettered, failed prometheus.Counter
}

// counters returns the series of broker: the cached ones for the replica's
// own broker, else looked up.
func (m *metrics) counters(broker string) brokerCounters {
	if broker == m.broker && m.own.received != nil {
		return m.own
	}
	return brokerCounters{
		received:     m.received.WithLabelValues(broker),
		delivered:    m.delivered.WithLabelValues(broker),
		retried:      m.retried.WithLabelValues(broker),
		deadLettered: m.deadLettered.WithLabelValues(broker),
		failed:       m.failed.WithLabelValues(broker),
	}
}

// newMetrics registers every metric, with a series at zero for broker, so
// that dashboards see them before the first message.
func newMetrics(broker string) *metrics {
	reg := prometheus.NewRegistry()
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"broker"})
	}
	waitSeconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "throttle_limiter_wait_seconds",
		Help:    "Time a message waited for tokens, by its class (priority: high, normal, low).",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"priority"})
	m := &metrics{
		reg:          reg,
		received:     counter("throttle_messages_received_total", "Messages taken from the broker."),
		delivered:    counter("throttle_messages_delivered_total", "Messages the sink accepted."),
		retried:      counter("throttle_messages_retried_total", "Failed delivery attempts that will be retried."),
		deadLettered: counter("throttle_messages_dead_lettered_total", "Messages sent to the dead-letter destination."),
		failed:       counter("throttle_messages_failed_total", "Failed delivery attempts, retried or not."),
		reconnects:   counter("throttle_reconnects_total", "Attempts to connect to the broker after a failure (a lost connection, or a failed attempt, at start too), successful or not."),
		tokens: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "throttle_bucket_tokens",
			Help: "Tokens in the shared bucket at the last store call; negative while tokens are reserved ahead.",
		}),
		rate: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "throttle_bucket_effective_rate",
			Help: "Effective refill rate in tokens per second: the override if set, else the configured rate; 0 while paused.",
		}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "throttle_redis_errors_total",
			Help: "Failed calls to the Redis bucket store.",
		}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttle_limiter_mode",
			Help: "1 for the limiter's current mode (shared, local, closed, open), 0 for the others.",
		}, []string{"mode"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttle_source_backlog",
			Help: "Messages waiting at the broker, those set aside by a delay layer included: the consumer group's lag on the topic and the delay topic (Kafka), or the ready messages of the queue and the delay queue (RabbitMQ). Every replica reports the same value; absent while it cannot be read.",
		}, []string{"broker"}),
		backlogSetAside: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttle_source_backlog_set_aside",
			Help: "The part of throttle_source_backlog set aside by a delay layer: the group's lag on the delay topic (Kafka) or the delay queue's messages (RabbitMQ); they come back when due. Every replica reports the same value; absent while it cannot be read.",
		}, []string{"broker"}),
		tokensTaken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "throttle_limiter_tokens_total",
			Help: "Tokens this replica took from the bucket: the sum of the costs of the messages granted, retries included.",
		}),
		recipientGone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttle_sink_recipient_gone_total",
			Help: "Messages dead-lettered because the provider said the recipient (number, device token) is gone; the sender should remove it from its lists.",
		}, []string{"preset"}),
		deduplicated: counter("throttle_deduplicated_total", "Messages acked or committed without a send because their dedupe key (delivery.dedupe.key) was already sent."),
		dedupeSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttle_dedupe_skipped_total",
			Help: "Messages sent without dedupe, by reason: no_key (the key rendered empty) or store_error (Redis failed under delivery.dedupe.on_store_error: open).",
		}, []string{"reason"}),
		dedupeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "throttle_dedupe_store_errors_total",
			Help: "Failed calls to the dedupe store in Redis; delivery.dedupe.on_store_error says what follows.",
		}),
		sendSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "throttle_sink_send_seconds",
			Help:    "Time each call of the sink took (every attempt, retries included), by outcome: delivered or failed.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		broker: broker,
	}
	m.sendSeconds.WithLabelValues("delivered")
	m.sendSeconds.WithLabelValues("failed")
	reg.MustRegister(m.sendSeconds, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "throttle_sink_in_flight",
		Help: "Calls of the sink in progress now. Flat at sink.http.max_conns while messages wait: the connections, not the handlers, bound the sends (over HTTP/1.1).",
	}, func() float64 { return float64(m.sendsInFlight.Load()) }))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "throttle_build_info",
		Help: "Always 1; the labels give the version and commit.",
	}, []string{"version", "commit"})
	buildInfo.WithLabelValues(version, commit).Set(1)
	for p := range limiter.NumPriorities {
		class := limiter.Priority(p)
		m.waitSeconds[p] = waitSeconds.WithLabelValues(class.String())
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "throttle_limiter_waiting",
			Help:        "Messages waiting for tokens now, by their class (priority: high, normal, low).",
			ConstLabels: prometheus.Labels{"priority": class.String()},
		}, func() float64 { return float64(m.waiting(class)) }))
	}
	reg.MustRegister(m.received, m.delivered, m.retried, m.deadLettered, m.failed, m.reconnects,
		waitSeconds, m.tokens, m.rate, m.redisErrors, m.mode, m.backlog, m.backlogSetAside, m.tokensTaken, m.recipientGone, buildInfo,
		m.deduplicated, m.dedupeSkipped, m.dedupeErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if broker != "" {
		m.reconnects.WithLabelValues(broker)
		m.deduplicated.WithLabelValues(broker)
		m.own = m.counters(broker)
	}
	m.setMode(limiter.ModeShared)
	return m
}

func (m *metrics) setMode(current limiter.Mode) {
	for _, mode := range modes {
		v := 0.0
		if mode == current {
			v = 1
		}
		m.mode.WithLabelValues(string(mode)).Set(v)
	}
}

func (m *metrics) setBucket(tokens, rate float64) {
	m.tokens.Set(tokens)
	m.rate.Set(rate)
	m.rateBits.Store(math.Float64bits(rate))
}

// registerKafkaReader exports the kafka-go reader's counts, read from stats
// at each scrape: kafka-go reconnects by itself, so these, not
// throttle_reconnects_total, show a Kafka consumer's connection trouble.
func (m *metrics) registerKafkaReader(stats func() kafka.ReaderStats) {
	counter := func(name, help string, field func(kafka.ReaderStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(field(stats())) })
	}
	m.reg.MustRegister(
		counter("throttle_kafka_reader_dials_total", "Connections the Kafka reader opened to partition leaders: at each join and rebalance, and after each broker or network failure.",
			func(s kafka.ReaderStats) int64 { return s.Dials }),
		counter("throttle_kafka_reader_errors_total", "Errors the Kafka reader retried by itself (failed joins, failed or broken leader connections).",
			func(s kafka.ReaderStats) int64 { return s.Errors }),
		counter("throttle_kafka_rebalances_total", "Consumer group generations the Kafka reader joined, the first included, and partitions found again after a leader move.",
			func(s kafka.ReaderStats) int64 { return s.Rebalances }),
		counter("throttle_kafka_dropped_at_revocation_total", "Messages fetched but not started when their partitions were revoked; another replica consumes them.",
			func(s kafka.ReaderStats) int64 { return s.DroppedAtRevocation }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "throttle_kafka_partitions_assigned",
			Help: "Partitions this replica owns now; 0 between a revocation and the next assignment.",
		}, func() float64 { return float64(stats().PartitionsAssigned) }),
	)
}

// registerRetimed exports throttle_limiter_retimed_total, read from
// retimed (Stats.Retimed) at each scrape.
func (m *metrics) registerRetimed(retimed func() int64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "throttle_limiter_retimed_total",
		Help: "Grants of the shared bucket given back and asked for again because their answer came back, or their caller woke, too late past their slot to go out beside the slots after them; a steady rise means slow Redis answers or a starved process.",
	}, func() float64 { return float64(retimed()) }))
}

// registerFair exports throttle_fair_active_tenants, read from active at
// each scrape. Metrics name no tenant.
func (m *metrics) registerFair(active func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "throttle_fair_active_tenants",
		Help: "Tenants holding reservations in the shared queue of the class of this replica's last message with a tenant (limit.fair), as the bucket last answered it.",
	}, func() float64 { return float64(active()) }))
}

// setBacklog records the messages waiting at the broker, and those of them
// set aside.
func (m *metrics) setBacklog(b consumer.Backlog) {
	m.backlog.WithLabelValues(m.broker).Set(float64(b.Ready + b.SetAside))
	m.backlogSetAside.WithLabelValues(m.broker).Set(float64(b.SetAside))
}

// backlogUnknown removes the backlog series, so that a dashboard shows a gap
// rather than a stale value while the broker cannot be asked.
func (m *metrics) backlogUnknown() {
	m.backlog.DeleteLabelValues(m.broker)
	m.backlogSetAside.DeleteLabelValues(m.broker)
}

// effectiveRate returns the rate last seen from the bucket.
func (m *metrics) effectiveRate() float64 { return math.Float64frombits(m.rateBits.Load()) }

// setPreset labels throttle_sink_recipient_gone_total with the HTTP sink's
// preset ("none" without one) and starts its series at zero. Call it
// before the consumer starts.
func (m *metrics) setPreset(preset string) {
	m.preset = cmp.Or(preset, "none")
	m.recipientGone.WithLabelValues(m.preset)
}

// consumerObserver returns the observer for the consumer.
func (m *metrics) consumerObserver() *consumer.MessageObserver {
	return &consumer.MessageObserver{
		Received: func(msg consumer.Message) { m.counters(msg.Source.Broker).received.Inc() },
		Delivered: func(msg consumer.Message) {
			m.counters(msg.Source.Broker).delivered.Inc()
			m.deliveredN.Add(1)
		},
		Failed: func(msg consumer.Message, _ error) { m.counters(msg.Source.Broker).failed.Inc() },
		Retried: func(msg consumer.Message, _ error, _ time.Duration) {
			m.counters(msg.Source.Broker).retried.Inc()
		},
		DeadLettered: func(msg consumer.Message, err error) {
			m.counters(msg.Source.Broker).deadLettered.Inc()
			if m.preset != "" && httpsink.IsRecipientGone(err) {
				m.recipientGone.WithLabelValues(m.preset).Inc()
			}
		},
		ReconnectAttempt: func(broker string, _ error) { m.reconnects.WithLabelValues(broker).Inc() },
		Deduplicated:     func(msg consumer.Message) { m.deduplicated.WithLabelValues(msg.Source.Broker).Inc() },
		DedupeSkipped:    func(_ consumer.Message, reason string) { m.dedupeSkipped.WithLabelValues(reason).Inc() },
		DedupeStoreError: func(error) { m.dedupeErrors.Inc() },
	}
}

// timedSends wraps the sink's handler h: it counts the calls in progress
// and times each by its outcome.
func (m *metrics) timedSends(h consumer.Handler) consumer.Handler {
	delivered, failed := m.sendSeconds.WithLabelValues("delivered"), m.sendSeconds.WithLabelValues("failed")
	return func(ctx context.Context, msg consumer.Message) error {
		m.sendsInFlight.Add(1)
		start := time.Now()
		err := h(ctx, msg)
		d := time.Since(start).Seconds()
		m.sendsInFlight.Add(-1)
		if err != nil {
			failed.Observe(d)
		} else {
			delivered.Observe(d)
		}
		return err
	}
}

// limiterObserver returns the observer for the bucket.
func (m *metrics) limiterObserver() *limiter.Observer {
	return &limiter.Observer{
		PriorityWaited: func(p limiter.Priority, d time.Duration) {
			if int(p) < len(m.waitSeconds) {
				m.waitSeconds[p].Observe(d.Seconds())
			}
		},
		Took:        func(remaining, rate float64, _ int) { m.setBucket(remaining, rate) },
		ModeChanged: func(_, to limiter.Mode, _ error) { m.setMode(to) },
		StoreError:  func(error) { m.redisErrors.Inc() },
	}
}

// tookTokens counts a successful wait for cost tokens.
func (m *metrics) tookTokens(cost int) {
	m.tokensTaken.Add(float64(cost))
	m.tokensN.Add(int64(cost))
	m.grantsN.Add(1)
}

// averageCost returns the mean cost of the messages granted so far, or 1
// before the first.
func (m *metrics) averageCost() float64 {
	if n := m.grantsN.Load(); n > 0 {
		return float64(m.tokensN.Load()) / float64(n)
	}
	return 1
}

// addWaiting counts the messages waiting for tokens, for the progress
// line: +1 when one starts waiting, -1 when it stops
// (consumer.LimitOptions.Waiting).
func (m *metrics) addWaiting(d int) { m.waitingN.Add(int64(d)) }

// countWaiting makes throttle_limiter_waiting read by, such as the bucket's
// WaitingByPriority, at each scrape.
func (m *metrics) countWaiting(by func() [limiter.NumPriorities]int) { m.waitingBy.Store(&by) }

// waiting returns the requests of class p waiting for tokens now, or 0
// before countWaiting.
func (m *metrics) waiting(p limiter.Priority) int {
	by := m.waitingBy.Load()
	if by == nil {
		return 0
	}
	return (*by)()[p]
}

// handler serves /metrics, /livez and /healthz (the process is alive: no
// dependency is checked, so that a liveness probe never restarts a replica
// for Redis or the broker being down) and /readyz (ready returns nil).
func (m *metrics) handler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	alive := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	mux.HandleFunc("GET /livez", alive)
	mux.HandleFunc("GET /healthz", alive)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// metricsServer serves a metrics handler until it is shut down.
type metricsServer struct {
	srv  *http.Server
	addr net.Addr
	done chan error
}

// startMetricsServer listens on addr at once, so that a busy port fails the
// start-up, and serves h in the background.
func startMetricsServer(addr string, h http.Handler, log *slog.Logger) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics.listen: %w", err)
	}
	s := &metricsServer{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		addr: ln.Addr(),
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// shutdown stops the server, waiting up to a few seconds for scrapes in
// progress.
func (s *metricsServer) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
