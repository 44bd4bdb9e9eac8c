// Package kafka consumes a Kafka topic as a member of a consumer group and
// calls a consumer.Handler for every message, throttled by a shared limiter
// and at least once. It is built on github.com/segmentio/kafka-go.
//
// # Flow
//
// One goroutine fetches messages (Reader.FetchMessage) and hands each to the
// worker of its partition: partitions are given to the Config.Concurrency
// workers round-robin when first seen and keep their worker, so a partition
// is never worked on by two workers at once and its order is kept, while up
// to Concurrency partitions are worked in parallel. At most Config.QueueSize fetched
// messages wait for their workers; then fetching blocks until a worker takes
// one (backpressure). The bound is shared, not per worker, so a backlog on
// one partition does not keep the other workers idle. For each message the worker
// waits on the limiter for the message's cost (consumer.Throttle), calls the
// handler under the retry policy, and dead-letters the message when the
// error is permanent or the attempts run out. Only a message that was
// delivered or dead-lettered is committed.
//
// # Commits
//
// Kafka keeps one committed offset per partition, so committing a message
// commits everything before it. Because a partition is handled in order by
// one worker, the handled messages of a partition always form a prefix, and
// committing the last of them never skips an unhandled one. Workers do not
// wait for commits: they record the highest handled offset per partition and
// a committer goroutine commits whatever is pending as soon as it can, so
// commits are synchronous (the offset is on the broker when CommitMessages
// returns) yet batched under load. A failed commit is kept and retried with
// backoff; a later commit of the same partition covers it.
//
// # Rebalances
//
// Partition assignment is kafka-go's consumer-group reader. When a rebalance
// moves a partition away, kafka-go does not tell the application; messages
// of it that this replica fetched but had not committed are fetched again by
// the new owner from the last committed offset. Nothing is lost, but such
// messages may be handled twice: delivery is at least once, and handlers
// should be idempotent. Commits made while a generation ends fail (kafka-go
// returns the broker's RebalanceInProgress or IllegalGeneration error) and
// are retried in the next generation. A late commit of a partition that
// moved can only move its offset to a message this replica handled, so it
// may cause redelivery but never skips a message.
//
// # Shutdown
//
// When the context given to Run ends, the consumer stops fetching. Messages
// already being handled get Config.DrainTimeout to finish; the context
// handlers see is cancelled only at that deadline. Messages that were
// queued but not started are dropped. What finished is committed, the
// group is left, and Run returns nil. A message that was not handled is
// never committed, so the group's next owner receives it.
//
// # Authentication and TLS
//
// Set Config.Dialer to connect with SASL or TLS. The consumer uses it for
// the group reader and derives the dead-letter writer's transport from it:
//
//	mech, err := scram.Mechanism(scram.SHA512, user, password) // or plain.Mechanism{Username: user, Password: password}
//	if err != nil { ... }
//	dialer := &kafkago.Dialer{
//		Timeout:       10 * time.Second,
//		DualStack:     true,
//		TLS:           &tls.Config{MinVersion: tls.VersionTLS12},
//		SASLMechanism: mech,
//	}
//
// with the packages github.com/segmentio/kafka-go/sasl/scram and
// github.com/segmentio/kafka-go/sasl/plain.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
)

// Defaults of Config.
const (
	DefaultDrainTimeout  = 30 * time.Second
	DefaultCommitTimeout = 10 * time.Second
)

// DefaultQueueSize is the default of Config.QueueSize.
const DefaultQueueSize = 32

// DefaultMaxWait is the fetch long-poll time the consumer gives kafka-go's
// reader unless ConfigureReader sets MaxWait. kafka-go's own default is
// 10s, and its reader cannot interrupt a fetch: closing it, and every
// rebalance, waits for the fetch to end. 500ms is the Java client's
// default and keeps shutdown and rebalances quick, at the cost of one
// fetch request per partition per 500ms when the topic is idle.
const DefaultMaxWait = 500 * time.Millisecond

// Sentinel errors.
var (
	// ErrInvalidConfig is wrapped by every error New returns for bad
	// input; the message names the field at fault.
	ErrInvalidConfig = errors.New("invalid kafka consumer config")
	// ErrClosed is returned by Run after Close, or when Run is called a
	// second time, and wrapped by Backlog after Close.
	ErrClosed = errors.New("kafka consumer closed")
)

// Config configures a Consumer. Brokers, Topic and Group are required; every
// other field documents its default.
type Config struct {
	// Brokers are the bootstrap broker addresses, host:port.
	Brokers []string
	// Topic is the topic to consume.
	Topic string
	// Group is the consumer group. Replicas with the same Group share the
	// topic's partitions.
	Group string
	// Concurrency is the number of partitions handled in parallel. A
	// partition is never handled concurrently with itself. The handler is
	// called from up to Concurrency goroutines at once. Default 1.
	Concurrency int
	// QueueSize bounds the fetched messages that wait for a worker, across
	// all partitions; when it is reached, fetching blocks. A larger queue
	// keeps more workers busy when one partition has a backlog; a smaller
	// one means fewer messages handled twice after a rebalance, since
	// queued messages of a partition that moved away are still handled
	// here. It also sizes kafka-go's own read-ahead (ReaderConfig
	// QueueCapacity), so at most about 2·QueueSize messages are fetched
	// and not yet handled. A throttled consumer gains nothing from a deep
	// read-ahead: messages wait for tokens either way. Default 32.
	QueueSize int
	// DeadLetterTopic receives the messages that fail permanently or run
	// out of attempts. Default Topic + ".dlq". The writer may create it
	// (AllowAutoTopicCreation), but production clusters usually disable
	// auto-creation, so create it with the topic.
	DeadLetterTopic string
	// StartOffset is where the group starts on a partition without a
	// committed offset: kafkago.FirstOffset (the default) or
	// kafkago.LastOffset.
	StartOffset int64

	// Limiter, when set, is waited on for every handler attempt with the
	// message's cost, through consumer.Throttle. When nil the consumer
	// does not throttle; the handler may still be wrapped by the caller.
	// Close the limiter only after Run returned: a failed wait counts as a
	// failed attempt.
	Limiter consumer.Limiter
	// Cost gives a message's cost in tokens. Default consumer.CostOne.
	// It requires Limiter.
	Cost consumer.CostFunc
	// Pauser, when set, is paused for every replica when the handler
	// returns an error made with consumer.RetryAfter (consumer.PushBack).
	// Usually it is the same bucket as Limiter.
	Pauser consumer.Pauser
	// MaxPause caps a pause asked for by a handler. Default 0: no cap
	// beyond the Pauser's own.
	MaxPause time.Duration
	// Retry is the retry policy for failed handlers. The zero value uses
	// consumer.RetryPolicy's defaults.
	Retry consumer.RetryPolicy

	// DrainTimeout bounds how long in-flight handlers may run after Run's
	// context ends. Default 30s.
	DrainTimeout time.Duration
	// CommitTimeout bounds one offset commit, including the final commit
	// at shutdown, so Run returns at most DrainTimeout + CommitTimeout
	// after its context ends (plus leaving the group). Default 10s.
	CommitTimeout time.Duration

	// Observer receives message events for metrics. Default none.
	Observer *consumer.Observer
	// Logger receives retries, dead-letters, commit failures and kafka-go's
	// error log. Message bodies are never logged. Default slog.Default().
	Logger *slog.Logger
	// Dialer connects to the brokers, for SASL and TLS (see the package
	// documentation). Default kafka-go's DefaultDialer.
	Dialer *kafkago.Dialer

	// ConfigureReader, when set, may adjust the kafka-go reader
	// configuration after the consumer filled it in: timeouts, fetch sizes,
	// balancers. Brokers, GroupID, Topic, GroupTopics and Partition are
	// reset afterwards. Setting CommitInterval makes commits asynchronous:
	// fewer broker calls, more redelivery after a crash.
	//
	// The consumer sets MaxWait to DefaultMaxWait. The group timeouts keep
	// kafka-go's defaults unless set here: HeartbeatInterval 3s,
	// SessionTimeout 30s, RebalanceTimeout 30s, JoinGroupBackoff 5s. A
	// crashed replica's partitions move after SessionTimeout.
	ConfigureReader func(*kafkago.ReaderConfig)
	// ConfigureWriter, when set, may adjust the dead-letter writer, such as
	// its batching or compression. Topic is reset afterwards and Async is
	// forced off: the consumer must know that a write succeeded.
	ConfigureWriter func(*kafkago.Writer)
}

// Consumer consumes one topic in a consumer group. Create it with New, run
// it with Run, stop it by cancelling Run's context or with Close.
//
// A Consumer is safe for concurrent use: Close may be called from any
// goroutine, but not from a handler, since it waits for Run to return.
type Consumer struct {
	cfg     Config
	handler consumer.Handler
	rc      kafkago.ReaderConfig
	log     *slog.Logger
	// closing turns kafka-go's error log down to debug level while the
	// reader shuts down, when its errors are expected.
	closing atomic.Bool

	// admin reads offsets for Backlog over adminTransport, which keeps its
	// connections between calls until Close.
	admin          *kafkago.Client
	adminTransport *kafkago.Transport

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
	// closed is set by Close; backlogCalls counts the Backlog calls in
	// progress. Whichever of Close and the last such call comes later
	// releases adminTransport's connections.
	closed       bool
	backlogCalls int

	// statsMu guards statsReader and stats. statsReader is Run's reader
	// while Run uses it; stats holds the totals collected from it so far.
	statsMu     sync.Mutex
	statsReader *kafkago.Reader
	stats       ReaderStats
}

// New validates cfg and returns a Consumer for h. It does not connect to the
// brokers: Run does.
func New(cfg Config, h consumer.Handler) (*Consumer, error) {
	if err := cfg.setDefaults(h); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, log: cfg.Logger, done: make(chan struct{})}
	var mw []consumer.Middleware
	if cfg.Limiter != nil {
		mw = append(mw, consumer.Throttle(cfg.Limiter, cfg.Cost))
	}
	if cfg.Pauser != nil {
		mw = append(mw, consumer.PushBack(cfg.Pauser, cfg.MaxPause))
	}
	c.handler = consumer.Chain(h, mw...)

	rc, err := c.readerConfig()
	if err != nil {
		return nil, err
	}
	c.rc = rc
	// The transport connects on first use, so New still does not.
	c.adminTransport = newTransport(cfg.Dialer)
	c.adminTransport.MetadataTopics = []string{cfg.Topic}
	c.admin = &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Transport: c.adminTransport}
	return c, nil
}

func (cfg *Config) setDefaults(h consumer.Handler) error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case h == nil:
		return invalid("handler must not be nil")
	case len(cfg.Brokers) == 0:
		return invalid("Brokers must name at least one broker")
	case cfg.Topic == "":
		return invalid("Topic must not be empty")
	case cfg.Group == "":
		return invalid("Group must not be empty")
	case cfg.Concurrency < 0:
		return invalid("Concurrency %d must not be negative", cfg.Concurrency)
	case cfg.QueueSize < 0:
		return invalid("QueueSize %d must not be negative", cfg.QueueSize)
	case cfg.MaxPause < 0:
		return invalid("MaxPause %v must not be negative", cfg.MaxPause)
	case cfg.DrainTimeout < 0:
		return invalid("DrainTimeout %v must not be negative", cfg.DrainTimeout)
	case cfg.CommitTimeout < 0:
		return invalid("CommitTimeout %v must not be negative", cfg.CommitTimeout)
	case cfg.Cost != nil && cfg.Limiter == nil:
		return invalid("Cost is set but Limiter is nil")
	}
	for i, b := range cfg.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return invalid("Brokers[%d] %q is not host:port", i, b)
		}
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.DeadLetterTopic == "" {
		cfg.DeadLetterTopic = cfg.Topic + ".dlq"
	}
	if cfg.DeadLetterTopic == cfg.Topic {
		return invalid("DeadLetterTopic must differ from Topic %q", cfg.Topic)
	}
	switch cfg.StartOffset {
	case 0:
		cfg.StartOffset = kafkago.FirstOffset
	case kafkago.FirstOffset, kafkago.LastOffset:
	default:
		return invalid("StartOffset %d must be kafka-go's FirstOffset or LastOffset", cfg.StartOffset)
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.CommitTimeout == 0 {
		cfg.CommitTimeout = DefaultCommitTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

// readerConfig builds the kafka-go reader configuration and checks it the
// way kafka-go's NewReader would, so that Run never panics on it.
func (c *Consumer) readerConfig() (kafkago.ReaderConfig, error) {
	log := c.log
	rc := kafkago.ReaderConfig{
		Dialer:      c.cfg.Dialer,
		StartOffset: c.cfg.StartOffset,
		MaxWait:     DefaultMaxWait,
		ErrorLogger: kafkago.LoggerFunc(func(format string, args ...any) {
			level := slog.LevelWarn
			if c.closing.Load() {
				level = slog.LevelDebug
			}
			log.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...), "topic", c.cfg.Topic, "group", c.cfg.Group)
		}),
	}
	rc.QueueCapacity = c.cfg.QueueSize
	if c.cfg.ConfigureReader != nil {
		c.cfg.ConfigureReader(&rc)
	}
	rc.Brokers = c.cfg.Brokers
	rc.GroupID = c.cfg.Group
	rc.Topic = c.cfg.Topic
	rc.GroupTopics = nil
	rc.Partition = 0

	if err := rc.Validate(); err != nil {
		return rc, fmt.Errorf("%w: reader: %w", ErrInvalidConfig, err)
	}
	gc := kafkago.ConsumerGroupConfig{
		ID:                     rc.GroupID,
		Brokers:                rc.Brokers,
		Dialer:                 rc.Dialer,
		Topics:                 []string{rc.Topic},
		GroupBalancers:         rc.GroupBalancers,
		HeartbeatInterval:      rc.HeartbeatInterval,
		PartitionWatchInterval: rc.PartitionWatchInterval,
		WatchPartitionChanges:  rc.WatchPartitionChanges,
		SessionTimeout:         rc.SessionTimeout,
		RebalanceTimeout:       rc.RebalanceTimeout,
		JoinGroupBackoff:       rc.JoinGroupBackoff,
		RetentionTime:          rc.RetentionTime,
		StartOffset:            rc.StartOffset,
	}
	if err := gc.Validate(); err != nil {
		return rc, fmt.Errorf("%w: reader group: %w", ErrInvalidConfig, err)
	}
	lo, hi := rc.ReadBackoffMin, rc.ReadBackoffMax
	if lo == 0 {
		lo = 100 * time.Millisecond
	}
	if hi == 0 {
		hi = time.Second
	}
	if hi < lo {
		return rc, fmt.Errorf("%w: reader: ReadBackoffMax %v is below ReadBackoffMin %v", ErrInvalidConfig, hi, lo)
	}
	return rc, nil
}

// Run joins the group and consumes until ctx ends, then drains (see the
// package documentation) and returns nil. It returns an error only for a
// failure that retrying cannot fix, such as an authorization error, after
// draining in the same way. Transient broker errors are logged and retried.
//
// Run may be called once; a second call, or a call after Close, returns
// ErrClosed.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return ErrClosed
	}
	c.started = true
	ctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	c.mu.Unlock()
	defer close(c.done)
	defer cancel()

	reader := kafkago.NewReader(c.rc)
	c.statsMu.Lock()
	c.statsReader = reader
	c.statsMu.Unlock()
	transport := newTransport(c.cfg.Dialer)
	writer := c.newWriter(transport)
	err := c.consume(ctx, reader, writer)
	c.closing.Store(true)
	// Close leaves the group, so the other members take over at once.
	if cerr := reader.Close(); cerr != nil {
		c.log.Warn("closing kafka reader", "topic", c.cfg.Topic, "error", cerr)
	}
	// The reader's goroutines have ended: collect what they counted last.
	c.statsMu.Lock()
	c.stats.add(reader.Stats())
	c.statsReader = nil
	c.statsMu.Unlock()
	if cerr := writer.Close(); cerr != nil {
		c.log.Warn("closing dead-letter writer", "topic", c.cfg.DeadLetterTopic, "error", cerr)
	}
	transport.CloseIdleConnections()
	return err
}

// Close stops a running Run as if its context had ended and waits for it to
// return. Close before Run makes Run return ErrClosed. Close also releases
// the broker connections that Backlog keeps between calls (once Backlog
// calls in progress return), and Backlog returns ErrClosed afterwards.
// Close is idempotent and always returns nil.
func (c *Consumer) Close() error {
	c.mu.Lock()
	c.started = true
	cancel := c.cancel
	release := !c.closed && c.backlogCalls == 0
	c.closed = true
	c.mu.Unlock()
	if cancel != nil {
		cancel()
		<-c.done
	}
	if release {
		c.adminTransport.CloseIdleConnections()
	}
	return nil
}

// ReaderStats are counts of what the kafka-go reader that Run uses did, so
// that operators can see the health of its broker connections: kafka-go
// reconnects by itself, so Config.Observer's Reconnected is never called
// for Kafka. Every field is a total since Run started; it never decreases.
// A ReaderStats is a plain value, safe to copy.
//
// The counts are kafka-go's (kafkago.ReaderStats), which counts per
// partition: a replica that owns several partitions dials and fetches for
// each of them.
type ReaderStats struct {
	// Dials counts the attempts, successful or not, to connect to the
	// leader of a partition: one when the reader starts on a partition
	// (first at the join, again after every rebalance), plus one for each
	// reconnection after a broker or network failure or a leader change.
	// Connections to the group coordinator are not counted.
	Dials int64
	// Errors counts the errors that kafka-go retried by itself: failed
	// attempts to join the group, failed connections to a partition
	// leader, and broken connections while fetching. Errors kafka-go
	// passes on to FetchMessage instead, such as those of a leader still
	// unreachable after ReaderConfig.MaxAttempts, are logged by the
	// consumer and not counted here.
	Errors int64
	// Rebalances counts the group generations the reader joined, the
	// first join included, plus the partitions it had to find again
	// because their leader moved (NotLeaderForPartition or
	// UnknownTopicOrPartition).
	Rebalances int64
	// Timeouts counts the fetches that returned no message: kafka-go
	// counts the broker's RequestTimedOut, and also a long poll that
	// ended empty after ReaderConfig.MaxWait. On an idle topic it grows
	// with Fetches, so only Timeouts growing while Messages does not,
	// with messages waiting, hints at trouble.
	Timeouts int64
	// Fetches counts the fetch requests sent to partition leaders. On an
	// idle topic it grows by about one per owned partition per
	// ReaderConfig.MaxWait (DefaultMaxWait unless ConfigureReader sets it).
	Fetches int64
	// Messages counts the messages fetched from the brokers, when they
	// are fetched and before a handler sees them. A message fetched again
	// after a rebalance or a reconnection counts again, and read-ahead
	// messages dropped at shutdown count too, so Messages may exceed the
	// messages handled.
	Messages int64
	// Bytes is the size of the keys and values of the messages counted by
	// Messages.
	Bytes int64
}

// add adds the counts of s, which kafka-go resets on every Stats call, to
// the totals.
func (t *ReaderStats) add(s kafkago.ReaderStats) {
	t.Dials += s.Dials
	t.Errors += s.Errors
	t.Rebalances += s.Rebalances
	t.Timeouts += s.Timeouts
	t.Fetches += s.Fetches
	t.Messages += s.Messages
	t.Bytes += s.Bytes
}

// ReaderStats returns the counts of the kafka-go reader that Run uses,
// totalled since Run started. The totals are monotonic: a call never
// returns less, in any field, than an earlier call, so each field suits a
// Prometheus counter. Unlike kafka-go's Reader.Stats, which returns the
// counts since its previous call and resets them, ReaderStats does not
// reset anything: any number of callers may read it at any interval.
//
// Before Run it returns zero. After Run returned, it returns the final
// totals, which include everything the reader counted until Run closed
// it. It is safe for concurrent use, with Run and with itself; it does not
// block on the brokers.
func (c *Consumer) ReaderStats() ReaderStats {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	if c.statsReader != nil {
		c.stats.add(c.statsReader.Stats())
	}
	return c.stats
}

// Backlog returns the consumer group's lag on its topic: for every partition,
// the last offset minus the group's committed offset, summed. That is the
// number of messages the group has not committed yet, including those that
// a replica fetched or is handling. A partition without a committed offset
// counts from where the group would start on it (Config.StartOffset): all
// its messages with FirstOffset, the default, and none with LastOffset. A
// committed offset below the partition's first offset, whose messages
// retention deleted, counts from the first offset. The result is never
// negative. The last offset honours the reader's IsolationLevel.
//
// The value belongs to the group, not to this replica: every replica of
// the group reports the same value, so a dashboard that collects it from
// several replicas should aggregate with max, not sum.
//
// Each call makes three round trips: ListOffsets to the partition leaders
// for the first and last offsets, then FindCoordinator and OffsetFetch for
// the group's committed offsets. The partitions come from cluster metadata
// that the client caches and refreshes in the background every few seconds,
// so a partition added to the topic is counted a few seconds later. That
// suits a metric read every few seconds, not a call per message.
//
// Backlog reads the group's offsets from the brokers, so it works whether
// Run is running, has not started, or has returned. It is safe for
// concurrent use. ctx bounds the call; give it a deadline, since a broker
// that accepts connections but does not answer holds the call until ctx
// ends. The connections are kept for the next call until Close, after
// which Backlog returns an error wrapping ErrClosed. A per-partition error
// in a broker's response fails the call, naming the partition.
func (c *Consumer) Backlog(ctx context.Context) (int64, error) {
	wrap := func(err error) error {
		return fmt.Errorf("reading lag of group %q on topic %q: %w", c.cfg.Group, c.cfg.Topic, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, wrap(ErrClosed)
	}
	c.backlogCalls++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.backlogCalls--
		release := c.closed && c.backlogCalls == 0
		c.mu.Unlock()
		if release {
			c.adminTransport.CloseIdleConnections()
		}
	}()
	if err := ctx.Err(); err != nil {
		return 0, wrap(err)
	}
	lag, err := c.backlog(ctx)
	if err != nil {
		return 0, wrap(err)
	}
	return lag, nil
}

func (c *Consumer) backlog(ctx context.Context) (int64, error) {
	topic := c.cfg.Topic
	md, err := c.admin.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("listing partitions: %w", err)
	}
	var partitions []int
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return 0, fmt.Errorf("listing partitions: %w", t.Error)
		}
		for _, p := range t.Partitions {
			partitions = append(partitions, p.ID)
		}
	}
	if len(partitions) == 0 {
		return 0, errors.New("listing partitions: the metadata lists none")
	}

	reqs := make([]kafkago.OffsetRequest, 0, 2*len(partitions))
	for _, p := range partitions {
		reqs = append(reqs, kafkago.FirstOffsetOf(p), kafkago.LastOffsetOf(p))
	}
	lo, err := c.admin.ListOffsets(ctx, &kafkago.ListOffsetsRequest{
		Topics:         map[string][]kafkago.OffsetRequest{topic: reqs},
		IsolationLevel: c.rc.IsolationLevel,
	})
	if err != nil {
		return 0, fmt.Errorf("listing offsets: %w", err)
	}
	bounds := make(map[int]kafkago.PartitionOffsets, len(partitions))
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return 0, fmt.Errorf("listing offsets of partition %d: %w", po.Partition, po.Error)
		}
		bounds[po.Partition] = po
	}

	of, err := c.admin.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{
		GroupID: c.cfg.Group,
		Topics:  map[string][]int{topic: partitions},
	})
	if err != nil {
		return 0, fmt.Errorf("fetching committed offsets: %w", err)
	}
	committed := make(map[int]int64, len(partitions))
	switch {
	case errors.Is(of.Error, kafkago.GroupIdNotFound):
		// A group that never committed may not exist yet: Kafka answers
		// -1 for each partition then, other brokers (kfake) this error.
		// Both mean that nothing is committed.
		for _, p := range partitions {
			committed[p] = -1
		}
	case of.Error != nil:
		return 0, fmt.Errorf("fetching committed offsets: %w", of.Error)
	default:
		for _, p := range of.Topics[topic] {
			if p.Error != nil {
				return 0, fmt.Errorf("fetching committed offset of partition %d: %w", p.Partition, p.Error)
			}
			committed[p.Partition] = p.CommittedOffset
		}
	}

	start := c.rc.StartOffset
	if start == 0 {
		start = kafkago.FirstOffset // kafka-go's default
	}
	var total int64
	for _, p := range partitions {
		b, ok := bounds[p]
		if !ok {
			return 0, fmt.Errorf("listing offsets: no answer for partition %d", p)
		}
		at, ok := committed[p]
		if !ok {
			return 0, fmt.Errorf("fetching committed offsets: no answer for partition %d", p)
		}
		total += partitionLag(b.FirstOffset, b.LastOffset, at, start)
	}
	return total, nil
}

// partitionLag is a partition's share of Backlog: the messages from the
// committed offset, or from where the group starts when it has none
// (committed < 0, as kafka-go reads it), up to the last offset.
func partitionLag(first, last, committed, start int64) int64 {
	from := committed
	if from < 0 {
		if start == kafkago.LastOffset {
			return 0
		}
		from = first
	}
	from = max(from, first)
	return max(last-from, 0)
}

// reader is what the consumer needs from a kafka-go Reader.
type reader interface {
	FetchMessage(ctx context.Context) (kafkago.Message, error)
	offsetCommitter
}

// consume fetches and dispatches until ctx ends or a fatal error, then
// drains the workers and makes the final commit.
func (c *Consumer) consume(ctx context.Context, r reader, w messageWriter) error {
	// Handlers, dead-letter writes and commits outlive ctx: they end at the
	// drain deadline, not when intake stops.
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()

	com := newCommitter(r, c.cfg.CommitTimeout, c.log)
	comCtx, stopCommitter := context.WithCancel(hctx)
	defer stopCommitter()
	comDone := make(chan struct{})
	go func() {
		defer close(comDone)
		com.run(comCtx)
	}()

	dl := &deadLetterer{w: w, topic: c.cfg.DeadLetterTopic, log: c.log}
	// A slot is taken before each fetch and given back when a worker takes
	// the message, so at most QueueSize messages wait, and a send to a
	// queue (of the same capacity) never blocks.
	slots := make(chan struct{}, c.cfg.QueueSize)
	var draining atomic.Bool
	queues := make([]chan kafkago.Message, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan kafkago.Message, c.cfg.QueueSize)
		wg.Add(1)
		go func(q <-chan kafkago.Message) {
			defer wg.Done()
			c.work(hctx, q, slots, &draining, dl, com)
		}(queues[i])
	}

	err := c.fetch(ctx, r, slots, queues)

	draining.Store(true)
	for _, q := range queues {
		close(q)
	}
	drained := make(chan struct{})
	go func() {
		wg.Wait()
		close(drained)
	}()
	timer := time.NewTimer(c.cfg.DrainTimeout)
	select {
	case <-drained:
	case <-timer.C:
		c.log.Warn("drain timeout reached; cancelling in-flight handlers, their messages stay uncommitted",
			"topic", c.cfg.Topic, "drain_timeout", c.cfg.DrainTimeout)
		cancelHandlers()
		<-drained
	}
	timer.Stop()

	stopCommitter()
	<-comDone
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	if ferr := com.flush(fctx); ferr != nil {
		c.log.Warn("final commit failed; messages handled since the last commit will be redelivered",
			"topic", c.cfg.Topic, "error", ferr)
	}
	return err
}

// fetch reads messages and dispatches each to the worker of its partition
// until ctx ends (nil) or a fatal error. It blocks while all slots are
// taken.
func (c *Consumer) fetch(ctx context.Context, r reader, slots chan struct{}, queues []chan kafkago.Message) error {
	// Partitions go to workers round-robin as they are first seen, which
	// spreads them more evenly than partition modulo workers when this
	// replica owns only some of them. A partition keeps its worker, so it
	// is never handled by two at once.
	workerOf := make(map[int]int)
	var delay time.Duration
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		m, err := r.FetchMessage(ctx)
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return nil
			}
			if isFatal(err) {
				return fmt.Errorf("fetching from topic %q: %w", c.cfg.Topic, err)
			}
			delay = nextBackoff(delay)
			c.log.Warn("fetching message failed; retrying", "topic", c.cfg.Topic, "error", err, "retry_in", delay)
			if sleep(ctx, delay) != nil {
				return nil
			}
			continue
		}
		delay = 0
		if c.cfg.Observer != nil {
			c.cfg.Observer.ObserveReceived(ToMessage(m))
		}
		w, ok := workerOf[m.Partition]
		if !ok {
			w = len(workerOf) % len(queues)
			workerOf[m.Partition] = w
		}
		queues[w] <- m
	}
}

// isFatal reports whether a fetch error cannot heal by retrying.
func isFatal(err error) bool {
	if errors.Is(err, io.EOF) {
		return true // the reader was closed under us
	}
	var kerr kafkago.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafkago.SASLAuthenticationFailed, kafkago.TopicAuthorizationFailed,
			kafkago.GroupAuthorizationFailed, kafkago.ClusterAuthorizationFailed,
			kafkago.InvalidGroupId:
			return true
		}
	}
	return false
}

// work handles the messages of its queue in order. After a message that
// could not be finished (the drain deadline passed), it handles nothing
// more, so no later message of that partition is committed.
func (c *Consumer) work(ctx context.Context, q <-chan kafkago.Message, slots <-chan struct{}, draining *atomic.Bool, dl *deadLetterer, com *committer) {
	stopped := false
	for m := range q {
		<-slots
		if stopped || draining.Load() || ctx.Err() != nil {
			continue // not started: left uncommitted, the group redelivers it
		}
		if c.handle(ctx, m, dl) {
			com.add(m)
		} else {
			stopped = true
		}
	}
}

// handle runs the retry policy for m and dead-letters it when needed. It
// reports whether m may be committed.
func (c *Consumer) handle(ctx context.Context, m kafkago.Message, dl *deadLetterer) bool {
	msg := ToMessage(m)
	out := c.cfg.Retry.Process(ctx, c.handler, msg, c.cfg.Observer)
	if out.Abandoned {
		c.log.Warn("handler did not finish before the drain deadline; message left uncommitted",
			"topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempts", out.Attempts)
		return false
	}
	if out.Err == nil {
		return true
	}
	if err := dl.send(ctx, m, consumer.DeadLetterHeaders(msg, out)); err != nil {
		c.log.Warn("dead-letter write abandoned at the drain deadline; message left uncommitted",
			"topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "error", err)
		return false
	}
	c.log.Warn("message dead-lettered",
		"topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
		"dead_letter_topic", dl.topic, "attempts", out.Attempts, "error", out.Err)
	c.cfg.Observer.ObserveDeadLettered(msg, out.Err)
	return true
}

// newTransport returns the dead-letter writer's transport, with the
// Dialer's TLS, SASL and dial settings.
func newTransport(d *kafkago.Dialer) *kafkago.Transport {
	t := &kafkago.Transport{}
	if d == nil {
		return t
	}
	t.ClientID = d.ClientID
	t.TLS = d.TLS
	t.SASL = d.SASLMechanism
	t.DialTimeout = d.Timeout
	t.Dial = d.DialFunc
	if t.Dial == nil {
		nd := &net.Dialer{LocalAddr: d.LocalAddr, KeepAlive: d.KeepAlive, FallbackDelay: d.FallbackDelay}
		if !d.DualStack {
			nd.FallbackDelay = -1
		}
		t.Dial = nd.DialContext
	}
	return t
}

func (c *Consumer) newWriter(t *kafkago.Transport) *kafkago.Writer {
	log := c.log
	w := &kafkago.Writer{
		Addr:                   kafkago.TCP(c.cfg.Brokers...),
		Balancer:               &kafkago.Hash{},
		RequiredAcks:           kafkago.RequireAll,
		AllowAutoTopicCreation: true,
		BatchTimeout:           10 * time.Millisecond,
		Transport:              t,
		ErrorLogger: kafkago.LoggerFunc(func(format string, args ...any) {
			log.Warn("kafka-go: "+fmt.Sprintf(format, args...), "topic", c.cfg.DeadLetterTopic)
		}),
	}
	if c.cfg.ConfigureWriter != nil {
		c.cfg.ConfigureWriter(w)
	}
	w.Topic = c.cfg.DeadLetterTopic
	w.Async = false
	return w
}

// nextBackoff doubles prev from 100ms up to 5s.
func nextBackoff(prev time.Duration) time.Duration {
	const lo, hi = 100 * time.Millisecond, 5 * time.Second
	if prev < lo {
		return lo
	}
	return min(2*prev, hi)
}

// sleep waits for d or until ctx ends, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
