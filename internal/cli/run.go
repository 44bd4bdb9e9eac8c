package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

const runHelp = `Usage: throttle run --config FILE

Runs one replica: consumes the configured source, waits on the shared token
bucket in Redis before each delivery attempt, and delivers to the configured
sink. Every process that names the same limit.bucket shares one rate.

A message is acked or committed only after it was delivered or
dead-lettered. A failed attempt is retried with backoff (delivery.*); a
message that fails permanently or runs out of attempts is dead-lettered. A
wait for tokens longer than limit.max_wait (when set) fails the attempt like
any retryable error. An HTTP sink answering 429 or 503 with Retry-After
pauses the shared bucket for every replica (sink.http.push_back).

With console.listen set (off by default), the replica also serves the web
console of its bucket ('throttle help console').

Observability, on metrics.listen (default 127.0.0.1:9464; "off" disables):
  /metrics   Prometheus metrics, all named throttle_*
  /livez     200 while the process is alive (no dependency checked)
  /healthz   the same as /livez
  /readyz    200 while the consumer runs, is connected to its broker, and
             the limiter is not closed (see limit.on_store_error)
Logs go to stderr (log.level, log.format: text or json). When stderr is a
terminal, a progress line follows every 5 s.

SIGINT, SIGTERM or SIGHUP stops intake and drains in-flight messages for up to
delivery.drain_timeout, then exits 0. A second signal exits at once with
130; unacked messages are redelivered by the broker.

Flags:
  --config FILE   the YAML configuration (required)
`

// buildConsumer builds the configured source's consumer; tests replace it.
var buildConsumer = builder.consumer

// monitorInterval is how often a replica refreshes its bucket gauges and,
// on a terminal, prints its progress line.
var monitorInterval = 5 * time.Second // a variable for tests

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run")
	path := fs.String("config", "", "")
	pos, err := parseArgs(fs, args, runHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("run", "unexpected argument %q", pos[0])
	case *path == "":
		return usagef("run", "run needs --config FILE")
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log, stderr)
	return runReplica(ctx, cfg, replicaIO{stdout: stdout, stderr: stderr, log: log})
}

// replicaIO is where a replica writes.
type replicaIO struct {
	stdout, stderr io.Writer
	log            *slog.Logger
	// progress overrides the terminal check for the progress line: nil
	// means "only when stderr is a terminal".
	progress *bool
}

// runReplica runs one replica until ctx ends and it has drained.
func runReplica(ctx context.Context, cfg *config.Config, rio replicaIO) error {
	log := rio.log
	// The one mapping of the YAML onto the libraries; from here on the
	// pipeline is built from lib.
	lib, err := cfg.Libraries()
	if err != nil {
		return err
	}
	broker := "kafka"
	if lib.RabbitMQ != nil {
		broker = "rabbitmq"
	}
	m := newMetrics(broker)

	client, err := redisconn.New(cfg.Redis)
	if err != nil {
		return &configError{err: err}
	}
	defer client.Close()
	b := builder{lib: lib, m: m, log: log}
	store, bucket, err := b.bucket(client)
	if err != nil {
		return err
	}
	defer func() {
		if err := bucket.Close(); err != nil {
			log.Warn("closing the bucket", "error", err)
		}
	}()
	m.countWaiting(func() [limiter.NumPriorities]int { return bucket.Stats().WaitingByPriority })
	m.registerRetimed(func() int64 { return bucket.Stats().Retimed })
	if bucket.Fair() != nil {
		m.registerFair(bucket.FairActive)
	}

	log.Info("starting",
		"version", version,
		"replica", bucket.ReplicaID(),
		"bucket", cfg.Limit.Bucket,
		"rate", cfg.Limit.Rate,
		"burst", cfg.Limit.Burst,
		"priority", lib.Limiter.Priority.String(),
		"source", describeSource(cfg.Source),
		"sink", describeSink(cfg.Sink))
	log.Debug("configuration", "config", cfg.String())
	if key, handlers, maxConns, ok := sendsInFlightCapped(cfg.Source, cfg.Sink); ok {
		log.Info("sink.http.max_conns is below the handlers the source runs: over HTTP/1.1 a connection carries one request at a time, so at most max_conns messages are sent at once and the other handlers wait for a connection (docs/operations.md, Production checklist)",
			"max_conns", maxConns, key, handlers)
	}
	if err := checkBucket(ctx, cfg.Redis, bucket, store, m, log); err != nil {
		return err
	}

	sink, closeSink, err := b.sink(ctx, bucket, rio.stdout)
	if err != nil {
		return err
	}
	defer closeSink()
	if lib.HTTP != nil {
		m.setPreset(lib.HTTP.Preset)
	}

	tp, stopTracing, err := startTracing(ctx, lib.Tracing, bucket.ReplicaID(), log)
	if err != nil {
		return err
	}
	defer stopTracing() // after the consumer drained: its last spans go out
	b.tp = tp

	if b.dedupe, err = b.dedupeStore(client); err != nil {
		return err
	}
	if b.dedupe != nil {
		defer b.dedupe.Close()
	}
	c, err := buildConsumer(b, bucket, m.timedSends(sinks.Handler(sink)))
	if err != nil {
		return err
	}
	if cl, ok := c.(io.Closer); ok { // the Kafka consumer's Backlog connections
		defer cl.Close()
	}
	if kc, ok := c.(*kafka.Consumer); ok {
		m.registerKafkaReader(kc.ReaderStats)
	}

	var running atomic.Bool
	conn, _ := c.(interface{ Connected() error }) // consumer.Consumer
	ready := func() error {
		if !running.Load() {
			return errors.New("consumer is not running")
		}
		if conn != nil {
			if err := conn.Connected(); err != nil {
				return err
			}
		}
		if bucket.Mode() == limiter.ModeClosed {
			return errors.New("the limiter is closed: redis is unreachable (limit.on_store_error: closed) or refuses this replica")
		}
		return nil
	}
	if cfg.Metrics.Enabled() {
		srv, err := startMetricsServer(cfg.Metrics.Listen, m.handler(ready), log)
		if err != nil {
			return err
		}
		defer func() {
			if err := srv.shutdown(); err != nil {
				log.Warn("stopping the metrics server", "error", err)
			}
		}()
		log.Info("serving metrics", "addr", srv.addr.String(), "paths", "/metrics /livez /healthz /readyz")
	}

	if cfg.Console.Enabled() {
		stopConsole, err := startReplicaConsole(cfg, log)
		if err != nil {
			return err
		}
		defer stopConsole()
	}

	runCtx, stopMonitor := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	{
		g := usefulGauge(m.reg)
		wg.Add(1)
		go func() {
			defer wg.Done()
			watchUseful(runCtx, store.Admin(), g, monitorInterval)
		}()
	}
	if lib.Limiter.Adaptive != nil {
		g := adaptiveGauge(m.reg)
		wg.Add(1)
		go func() {
			defer wg.Done()
			watchAdaptive(runCtx, store.Admin(), g, monitorInterval)
		}()
	}
	if g := newBudgetGauges(m.reg, lib.Layers); g != nil {
		ls, err := store.WithLayers(lib.Layers) // validated above: the bucket holds them
		if err != nil {
			stopMonitor()
			wg.Wait()
			return &configError{err: fmt.Errorf("limit.extra: %w", err)}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.watch(runCtx, ls, monitorInterval)
		}()
	}
	{
		h := stallHistogram(m.reg)
		wg.Add(1)
		go func() {
			defer wg.Done()
			watchStalls(runCtx, log, h, time.Now)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var progress io.Writer
		if showProgress(rio) {
			progress = rio.stderr
		}
		src, _ := c.(backlogger)
		monitor(runCtx, bucket, src, m, progress, monitorInterval)
	}()
	defer func() {
		stopMonitor()
		wg.Wait()
	}()
	// The consumer stops only after "shutting down" is logged, so that the
	// log tells the shutdown in order.
	consumeCtx, stopConsuming := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConsuming()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
			log.Info("shutting down: intake stopped, draining in-flight messages (a second signal exits at once)",
				"drain_timeout", drainTimeout(cfg))
			stopConsuming()
		case <-runCtx.Done():
		}
	}()

	running.Store(true)
	err = c.Run(consumeCtx)
	running.Store(false)
	if err != nil {
		return fmt.Errorf("consuming from %s: %w", describeSource(cfg.Source), err)
	}
	log.Info("stopped", "delivered", m.deliveredN.Load())
	return nil
}

func showProgress(rio replicaIO) bool {
	if rio.progress != nil {
		return *rio.progress
	}
	f, ok := rio.stderr.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// backlogger is a consumer that can count the messages waiting for it at
// the broker, and those of them set aside in its delay topic or queue:
// kafka.Consumer (the group's lag) and rabbitmq.Consumer (the queues'
// ready messages).
type backlogger interface {
	BacklogParts(ctx context.Context) (consumer.Backlog, error)
}

// monitor refreshes the bucket and backlog gauges every interval and, when
// progress is not nil, writes a one-line summary to it, until ctx ends. src
// may be nil.
func monitor(ctx context.Context, b *limiter.Bucket, src backlogger, m *metrics, progress io.Writer, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last, lastAt := m.deliveredN.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, interval)
		st, err := b.State(sctx)
		if err == nil {
			m.setBucket(st.Tokens, st.Rate)
		}
		var backlog *consumer.Backlog
		if src != nil {
			// The bucket's heartbeats carry it to the console.
			if bl, err := src.BacklogParts(sctx); err == nil {
				backlog = &bl
				m.setBacklog(bl)
				b.SetBacklog(bl.Ready, bl.SetAside)
			} else {
				m.backlogUnknown()
				b.SetBacklog(-1, 0)
			}
		}
		cancel()
		if progress == nil {
			continue
		}
		now, delivered := time.Now(), m.deliveredN.Load()
		achieved := float64(delivered-last) / now.Sub(lastAt).Seconds()
		last, lastAt = delivered, now
		fmt.Fprintln(progress, progressLine(achieved, m.effectiveRate(), b.Mode(), delivered, m.waitingN.Load(), backlog, m.averageCost()))
	}
}

// progressLine summarizes a replica's progress. backlog is nil when
// unknown; draining it, the messages set aside included, takes its Ready +
// SetAside messages × avgCost tokens.
func progressLine(achieved, limit float64, mode limiter.Mode, delivered, waiting int64, backlog *consumer.Backlog, avgCost float64) string {
	line := fmt.Sprintf("throttle: %.1f msg/s (limit %s, %s) | delivered %d | waiting %d",
		achieved, formatRate(limit), mode, delivered, waiting)
	if backlog == nil {
		return line
	}
	n := backlog.Ready + backlog.SetAside
	line += fmt.Sprintf(" | backlog %d", n)
	var notes []string
	if backlog.SetAside > 0 {
		notes = append(notes, fmt.Sprintf("%d set aside", backlog.SetAside))
	}
	if n > 0 && limit > 0 {
		drain := time.Duration(float64(n) * avgCost / limit * float64(time.Second))
		notes = append(notes, fmt.Sprintf("~%v at the limit", roundDuration(drain.Seconds())))
	}
	if len(notes) > 0 {
		line += " (" + strings.Join(notes, ", ") + ")"
	}
	return line
}

// sendsInFlightCapped reports whether an HTTP sink's connections
// (sink.http.max_conns, or its default) are fewer than the handlers the
// source's configuration asks for: rabbitmq.concurrency, kafka.concurrency
// or kafka.max_in_flight, the largest set. It returns that key, its value
// and the connections. Only values set in the file count: the libraries'
// defaults stay with them.
func sendsInFlightCapped(src config.Source, sink config.Sink) (key string, handlers, maxConns int, ok bool) {
	if sink.HTTP == nil {
		return "", 0, 0, false
	}
	maxConns = cmp.Or(sink.HTTP.MaxConns, httpsink.DefaultMaxConns)
	consider := func(k string, n int) {
		if n > handlers {
			key, handlers = k, n
		}
	}
	if k := src.Kafka; k != nil {
		consider("kafka.concurrency", k.Concurrency)
		consider("kafka.max_in_flight", k.MaxInFlight)
	}
	if r := src.RabbitMQ; r != nil {
		consider("rabbitmq.concurrency", r.Concurrency)
	}
	return key, handlers, maxConns, handlers > maxConns
}

// describeSource names the source for logs, without secrets.
func describeSource(s config.Source) string {
	switch {
	case s.Kafka != nil:
		return fmt.Sprintf("kafka topic %s, group %s", s.Kafka.Topic, s.Kafka.Group)
	case s.RabbitMQ != nil:
		return fmt.Sprintf("rabbitmq queue %s at %s", s.RabbitMQ.Queue, config.RedactURL(s.RabbitMQ.URL))
	}
	return "none"
}

// describeSink names the sink for logs, without secrets.
func describeSink(s config.Sink) string {
	switch {
	case s.HTTP != nil && s.HTTP.Preset != "":
		return strings.TrimSpace("http preset " + s.HTTP.Preset + " " + config.RedactURL(s.HTTP.URL))
	case s.HTTP != nil:
		return "http " + cmp.Or(s.HTTP.Method, httpsink.DefaultMethod) + " " + config.RedactURL(s.HTTP.URL)
	case s.Postgres != nil:
		return "postgres table " + s.Postgres.Table
	case s.Stdout != nil:
		return "stdout"
	}
	return "none"
}
