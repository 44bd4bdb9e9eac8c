package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/connstate"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// Defaults of Config.
const (
	// DefaultDrainTimeout is the default of Options.DrainTimeout, the
	// same for every backend.
	DefaultDrainTimeout  = kit.DefaultDrainTimeout
	DefaultCommitTimeout = 10 * time.Second
)

// DefaultQueueSize is the default of Config.QueueSize.
const DefaultQueueSize = 32

// DefaultConcurrency is the default of Options.Concurrency with
// consumer.OrderKey and consumer.OrderNone. With consumer.OrderPartition,
// which handles the messages of a partition one at a time, it is 1.
const DefaultConcurrency = 1000

// DefaultMaxWait is the fetch long-poll time the consumer gives kafka-go's
// reader unless ConfigureReader sets MaxWait. kafka-go's own default is
// 10s, and its reader cannot interrupt a fetch: closing it, and every
// rebalance, waits for the fetch to end. 500ms is the Java client's
// default and keeps shutdown and rebalances quick, at the cost of one
// fetch request per partition per 500ms when the topic is idle.
const DefaultMaxWait = 500 * time.Millisecond

// invalid returns an error of New for a configuration it rejects, with
// the message format makes of args: it wraps consumer.ErrInvalidConfig,
// as every backend's does.
func invalid(format string, args ...any) error {
	return fmt.Errorf("kafka: %w: "+format, append([]any{consumer.ErrInvalidConfig}, args...)...)
}

// Config configures a Consumer. Brokers, Topic and Group are required; every
// other field documents its default. The embedded consumer.Options are the
// settings every backend shares (limiter, cost, push-back, concurrency,
// set aside, retry policy, drain timeout, ordering, observer, logger).
//
// Ordering, for Kafka: consumer.OrderPartition (the default) handles the
// messages of a partition one at a time, in order, so up to
// Options.Concurrency partitions in parallel. consumer.OrderKey handles the
// messages of one key (Options.OrderingKey, by default the Kafka message
// key) within a partition one at a time, in order, and different keys
// concurrently, up to Options.Concurrency messages at once.
// consumer.OrderNone handles any messages concurrently, up to
// Options.Concurrency. Options.Concurrency defaults to 1 under
// consumer.OrderPartition and to DefaultConcurrency under the others.
// With Options.SetAside, the messages set aside go to DelayTopic, which
// the group consumes too (see Setting aside in the package
// documentation). With classes (Options.Priority), a
// fetched message of a higher class starts ahead of lower-class ones as
// far as the ordering allows, and the lower classes leave a reserve of the
// workers and of the fetch window free (see consumer.Ordering).
type Config struct {
	consumer.Options

	// Brokers are the bootstrap broker addresses, host:port.
	Brokers []string
	// Topic is the topic to consume.
	Topic string
	// Group is the consumer group. Replicas with the same Group share the
	// topic's partitions.
	Group string
	// QueueSize bounds the fetched messages that wait for a worker, across
	// all partitions, on top of the messages being handled
	// (Options.Concurrency); when it is reached, fetching blocks. A larger queue
	// keeps more workers busy when one partition or key has a backlog.
	// A freed place goes to the partition holding the fewest; under
	// consumer.OrderPartition one partition holds at most its share,
	// (Concurrency + QueueSize) / partitions assigned, rounded up, and at
	// least 2 (one handled, the next queued).
	// Queued messages are dropped, not handled, when their partition is
	// revoked. Each partition reader also reads ahead up to QueueSize
	// messages (kafka-go's ReaderConfig.QueueCapacity). A throttled
	// consumer gains nothing from a deep read-ahead: messages wait for
	// tokens either way. Default 32.
	QueueSize int
	// DeadLetterTopic receives the messages that fail permanently or run
	// out of attempts. Default Topic + ".dlq". The writer may create it
	// (AllowAutoTopicCreation), but production clusters usually disable
	// auto-creation, so create it with the topic.
	DeadLetterTopic string
	// DelayTopic receives the messages set aside (Options.SetAside). Default
	// Topic + ".delay". Run creates it, with as many partitions as Topic,
	// when it does not exist; when it can neither find nor create it, it
	// logs a warning and the handlers wait out the delays instead.
	DelayTopic string
	// StartOffset is where the group starts on a partition of Topic
	// without a committed offset: kafkago.FirstOffset (the default) or
	// kafkago.LastOffset. A partition of DelayTopic without a committed
	// offset always starts at its first offset, so that no message set
	// aside is skipped.
	StartOffset int64

	// CommitTimeout bounds the final commit of a generation, at a
	// rebalance and at shutdown, so Run returns at most DrainTimeout +
	// CommitTimeout after its context ends (plus leaving the group). It is
	// also the timeout of each request to the group coordinator
	// (kafka-go's ConsumerGroupConfig.Timeout). Default 10s.
	CommitTimeout time.Duration

	// Dialer connects to the brokers, for SASL and TLS (see the package
	// documentation). Default kafka-go's DefaultDialer.
	Dialer *kafkago.Dialer

	// ConfigureReader, when set, may adjust the kafka-go reader
	// configuration after the consumer filled it in: timeouts, fetch sizes,
	// balancers. Its group fields (GroupBalancers, HeartbeatInterval,
	// SessionTimeout, RebalanceTimeout, JoinGroupBackoff, RetentionTime,
	// WatchPartitionChanges, PartitionWatchInterval) configure the
	// group membership, its other fields each partition's reader.
	// Brokers, GroupID, Topic, GroupTopics and Partition are reset
	// afterwards; CommitInterval is ignored, since the consumer commits
	// itself.
	//
	// The consumer sets MaxWait to DefaultMaxWait. The group timeouts keep
	// kafka-go's defaults unless set here: HeartbeatInterval 3s,
	// SessionTimeout 30s, RebalanceTimeout 30s, JoinGroupBackoff 5s. A
	// crashed replica's partitions move after SessionTimeout.
	ConfigureReader func(*kafkago.ReaderConfig)
	// ConfigureWriter, when set, may adjust the dead-letter and delay
	// writers, such as their batching or compression. Topic is reset
	// afterwards, Async is forced off and RequiredAcks to RequireAll: the
	// consumer must know that a write succeeded, on every in-sync replica,
	// before it commits past the message.
	ConfigureWriter func(*kafkago.Writer)
	// Assigned, when set, is called with the number of partitions (of
	// Topic and DelayTopic) this replica owns, at each assignment, and
	// with 0 at each revocation. A member given none is idle: pass a
	// function that tells the limiter, such as
	// func(n int) { bucket.SetIdle(n == 0) } for a *limiter.Bucket, so
	// that the replicas that consume do not count it in their fallback
	// shares. Called from the group's goroutine; it must not block.
	Assigned func(partitions int)
}

// Consumer consumes one topic in a consumer group. Create it with New, run
// it with Run, stop it by cancelling Run's context or with Close.
//
// A Consumer is safe for concurrent use: Close may be called from any
// goroutine, but not from a handler, since it waits for Run to return.
type Consumer struct {
	cfg  Config
	proc *kit.Processor
	rc   kafkago.ReaderConfig
	log  *slog.Logger
	life kit.Lifecycle
	// state is the group session as Connected reports it, with the
	// connection events it observes and logs.
	state *connstate.State
	// closing turns kafka-go's error log down to debug level while the
	// reader shuts down, when its errors are expected.
	closing atomic.Bool

	// admin reads offsets for Backlog over adminTransport, which keeps its
	// connections between calls until Close.
	admin          *kafkago.Client
	adminTransport *kafkago.Transport

	mu sync.Mutex
	// cancel stops Run; fatal is the first error that ends it (fail).
	cancel context.CancelFunc
	fatal  error
	// closed is set by Close; backlogCalls counts the Backlog calls in
	// progress. Whichever of Close and the last such call comes later
	// releases adminTransport's connections.
	closed       bool
	backlogCalls int

	// gc configures the group membership; prc is the template of each
	// partition's reader (Partition is set per partition).
	gc  kafkago.ConsumerGroupConfig
	prc kafkago.ReaderConfig

	stats statsCounter
	// otherGroupLogged holds the delay partitions (topicPartition) on
	// which a copy of another group was skipped, so that it is logged at
	// info level once per partition.
	otherGroupLogged sync.Map
	// clock tells the time and waits for the heads of the delay topic's
	// partitions; tests replace it.
	clock clock
}

// New validates cfg and returns a Consumer for h. It does not connect to the
// brokers: Run does.
func New(cfg Config, h consumer.Handler) (*Consumer, error) {
	if h == nil {
		return nil, invalid("handler must not be nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, invalid("%w", err)
	}
	opts, err := kit.WithDefaults(cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err) // unreachable: Validate checked them; wraps consumer.ErrInvalidConfig
	}
	cfg.Options = opts
	cfg.setDefaults()
	// The processor waits on the limiter through revocableLimiter and
	// calls h through markStarted, so that a revocation drops a message
	// whose first wait has not ended (see firstWait).
	log := cfg.Logger.With("broker", Broker)
	popts := opts
	popts.Logger = log
	if popts.Limiter != nil {
		popts.Limiter = revocableLimiter{popts.Limiter}
	}
	procOpts := []kit.ProcessorOption{kit.ConsumerGroup(cfg.Group), kit.MarksLater()}
	if cfg.SetAside {
		procOpts = append(procOpts, kit.SetsAside())
	}
	proc, err := kit.NewProcessor(popts, markStarted(h), procOpts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err) // wraps consumer.ErrInvalidConfig
	}
	c := &Consumer{cfg: cfg, proc: proc, log: log, clock: realClock{},
		state: connstate.New(Broker, cfg.Observer, log.With("topic", cfg.Topic, "group", cfg.Group))}
	c.stats.assigned = cfg.Assigned
	if err := c.readerConfig(); err != nil {
		return nil, err
	}
	// The transport connects on first use, so New still does not.
	c.adminTransport = newTransport(cfg.Dialer)
	c.adminTransport.MetadataTopics = c.backlogTopics()
	c.admin = &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Transport: c.adminTransport}
	return c, nil
}

// Validate returns nil or every problem of cfg, each a
// *consumer.FieldError naming the Go field at fault ("Brokers[0]", "Topic",
// "Retry.MaxAttempts"), joined with errors.Join (read them with
// consumer.FieldErrors). New calls it; the config package calls it to name
// its own keys. It does not run ConfigureReader: New checks the reader
// configuration that hook makes.
func (cfg Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &consumer.FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if len(cfg.Brokers) == 0 {
		bad("Brokers", "required (at least one host:port)")
	}
	for i, b := range cfg.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil {
			bad(fmt.Sprintf("Brokers[%d]", i), "%q is not host:port", b)
		} else if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			bad(fmt.Sprintf("Brokers[%d]", i), "%q has no port between 1 and 65535", b)
		}
	}
	if cfg.Topic == "" {
		bad("Topic", "required")
	} else if err := checkTopicName(cfg.Topic); err != nil {
		bad("Topic", "%w", err)
	}
	if cfg.Group == "" {
		bad("Group", "required")
	}
	if cfg.QueueSize < 0 {
		bad("QueueSize", "%d must not be negative", cfg.QueueSize)
	}
	if cfg.CommitTimeout < 0 {
		bad("CommitTimeout", "%v must not be negative", cfg.CommitTimeout)
	}
	if cfg.DeadLetterTopic != "" {
		if err := checkTopicName(cfg.DeadLetterTopic); err != nil {
			bad("DeadLetterTopic", "%w", err)
		} else if cfg.DeadLetterTopic == cfg.Topic {
			bad("DeadLetterTopic", "must differ from the topic %q", cfg.Topic)
		}
	}
	// The delay topic's name is checked when it is set or used; the
	// default one must not be the dead-letter topic either way, so that
	// adding a delay layer later cannot break a valid configuration.
	delay, dlq := cfg.DelayTopic, cfg.DeadLetterTopic
	if delay == "" {
		delay = cfg.Topic + ".delay"
	}
	if dlq == "" {
		dlq = cfg.Topic + ".dlq"
	}
	switch {
	case cfg.DelayTopic == "" && !cfg.SetAside:
		if cfg.Topic != "" && delay == dlq {
			bad("DelayTopic", "must differ from the dead-letter topic %q", dlq)
		}
	case checkTopicName(delay) != nil:
		bad("DelayTopic", "%w", checkTopicName(delay))
	case delay == cfg.Topic:
		bad("DelayTopic", "must differ from the topic %q", cfg.Topic)
	case delay == dlq:
		bad("DelayTopic", "must differ from the dead-letter topic %q", dlq)
	}
	switch cfg.StartOffset {
	case 0, kafkago.FirstOffset, kafkago.LastOffset:
	default:
		bad("StartOffset", "%d must be kafka-go's FirstOffset or LastOffset", cfg.StartOffset)
	}
	if err := cfg.Options.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkTopicName reports whether name is a legal Kafka topic name.
func checkTopicName(name string) error {
	ok := len(name) <= 249 && name != "." && name != ".."
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%q is not a Kafka topic name (at most 249 of a-z A-Z 0-9 . _ -, not . or ..)", name)
	}
	return nil
}

// setDefaults fills in the defaults of the Kafka fields; Validate checked
// them.
func (cfg *Config) setDefaults() {
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
		if cfg.Ordering == consumer.OrderPartition {
			cfg.Concurrency = 1
		}
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.DeadLetterTopic == "" {
		cfg.DeadLetterTopic = cfg.Topic + ".dlq"
	}
	if cfg.DelayTopic == "" {
		cfg.DelayTopic = cfg.Topic + ".delay"
	}
	if cfg.StartOffset == 0 {
		cfg.StartOffset = kafkago.FirstOffset
	}
	if cfg.CommitTimeout == 0 {
		cfg.CommitTimeout = DefaultCommitTimeout
	}
}

// readerConfig builds the kafka-go group and partition reader
// configurations (c.gc, c.prc, and c.rc that they come from) and checks
// them the way kafka-go would, so that Run never panics on them.
func (c *Consumer) readerConfig() error {
	log := c.log
	rc := kafkago.ReaderConfig{
		Dialer:      c.cfg.Dialer,
		StartOffset: c.cfg.StartOffset,
		MaxWait:     DefaultMaxWait,
		ErrorLogger: kafkago.LoggerFunc(func(format string, args ...any) {
			msg := fmt.Sprintf(format, args...)
			level := slog.LevelWarn
			if c.closing.Load() || strings.Contains(msg, kafkago.RebalanceInProgress.Title()) {
				// Expected while closing, and at every rebalance: the
				// consumer logs the revocation and the assignment itself.
				level = slog.LevelDebug
			}
			log.Log(context.Background(), level, "kafka-go: "+msg, "topic", c.cfg.Topic, "group", c.cfg.Group)
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
		return invalid("reader: %w", err)
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
		Timeout:                c.cfg.CommitTimeout,
		Logger:                 rc.Logger,
		ErrorLogger:            rc.ErrorLogger,
	}
	if err := gc.Validate(); err != nil {
		return invalid("reader group: %w", err)
	}
	lo, hi := rc.ReadBackoffMin, rc.ReadBackoffMax
	if lo == 0 {
		lo = 100 * time.Millisecond
	}
	if hi == 0 {
		hi = time.Second
	}
	if hi < lo {
		return invalid("reader: ReadBackoffMax %v is below ReadBackoffMin %v", hi, lo)
	}
	prc := rc
	prc.GroupID = ""
	prc.CommitInterval = 0
	if err := prc.Validate(); err != nil {
		return invalid("partition reader: %w", err)
	}
	c.rc, c.gc, c.prc = rc, gc, prc
	return nil
}

// Run joins the group and consumes until ctx ends, then drains (see the
// package documentation) and returns nil. It returns an error only for a
// failure that retrying cannot fix, such as an authorization error, after
// draining in the same way. Transient broker errors are logged and retried.
//
// Run may be called once; a second call, or a call after Close, returns
// consumer.ErrStopped.
func (c *Consumer) Run(ctx context.Context) error {
	ctx, end, err := c.life.Start(ctx)
	if err != nil {
		return err
	}
	defer end()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.Lock()
	c.cancel = cancel
	c.mu.Unlock()

	// One transport for the dead-letter and delay writers, the commits
	// with metadata and the delay topic's creation, closed when Run
	// returns.
	transport := newTransport(c.cfg.Dialer)
	writer := c.newWriter(transport, c.cfg.DeadLetterTopic)
	client := &kafkago.Client{Addr: kafkago.TCP(c.cfg.Brokers...), Transport: transport}
	dl := &deadLetterer{w: writer, topic: c.cfg.DeadLetterTopic, log: c.log}
	gc := c.gc
	var delay *deadLetterer
	if c.cfg.SetAside && c.ensureDelayTopic(ctx, client) {
		dw := c.newWriter(transport, c.cfg.DelayTopic)
		defer func() {
			if cerr := dw.Close(); cerr != nil {
				c.log.Warn("closing delay writer", "topic", c.cfg.DelayTopic, "err", cerr)
			}
		}()
		delay = &deadLetterer{w: dw, topic: c.cfg.DelayTopic, log: c.log, delay: true}
		gc.Topics = []string{c.cfg.Topic, c.cfg.DelayTopic}
	}

	cg, err := kafkago.NewConsumerGroup(gc)
	if err != nil {
		return invalid("reader group: %w", err) // checked by New
	}

	var cur *generation
	defer c.state.Stopped()
	for {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) {
				break
			}
			if errors.Is(err, kafkago.RebalanceInProgress) {
				// Another member joined or left while this one joined:
				// kafka-go joins again at once.
				c.log.Debug("rebalance in progress; joining again", "topic", c.cfg.Topic, "group", c.cfg.Group)
				continue
			}
			c.stats.joinFailed()
			if isFatal(err) {
				c.fail(fatalError(fmt.Sprintf("joining group %q", c.cfg.Group), err))
				break
			}
			// kafka-go retries after JoinGroupBackoff. A failed join is
			// where a lost connection shows: the generation before it
			// ended as at a rebalance.
			err = fmt.Errorf("joining group %q: %w", c.cfg.Group, err)
			if c.state.Connected() == nil {
				c.state.Lost(err, c.gc.JoinGroupBackoff)
			} else {
				c.state.Attempted(err)
				c.state.Retry(ctx, err, c.gc.JoinGroupBackoff, false)
			}
			continue
		}
		c.state.Attempted(nil)
		c.state.Up(slog.Int("concurrency", c.cfg.Concurrency), slog.String("ordering", string(c.cfg.Ordering)),
			slog.String("dead_letter_topic", c.cfg.DeadLetterTopic), slog.Bool("set_aside", delay != nil))
		c.stats.joined()
		g := c.newGeneration(ctx, client, gen, ctx.Done())
		cur = g
		gen.Start(func(gctx context.Context) { c.runGeneration(gctx, g, dl, delay) })
	}
	if cur != nil {
		// The generation drains and commits while it is live; then
		// leaving the group ends it.
		<-cur.drained
	}
	c.closing.Store(true)
	_ = cg.Close() // leaves the group; always nil
	if cerr := writer.Close(); cerr != nil {
		c.log.Warn("closing dead-letter writer", "topic", c.cfg.DeadLetterTopic, "err", cerr)
	}
	transport.CloseIdleConnections()
	c.log.Info(kit.LogStopped, "topic", c.cfg.Topic, "group", c.cfg.Group)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fatal
}

// Connected returns nil while the consumer is a member of its group: from
// the first generation it joined until a join of the group fails, as it
// does when the connection to the group coordinator is lost (the
// generation then ends as at a rebalance, and the next join fails; a
// rebalance alone does not disconnect). Otherwise it returns an error
// wrapping consumer.ErrNotConnected with the reason: Run has not joined
// yet, the last join error, or Run returned. kafka-go reconnects by
// itself; each join attempt after a failure is reported to
// MessageObserver.ReconnectAttempt, the failed join of a member to
// Disconnected and the next successful one to Reconnected. It is
// consumer.Consumer's Connected, for a readiness probe. It is safe for
// concurrent use and does not block on the network.
func (c *Consumer) Connected() error { return c.state.Connected() }

// fail records err as the error Run returns and stops Run. The first error
// wins.
func (c *Consumer) fail(err error) {
	c.mu.Lock()
	if c.fatal == nil {
		c.fatal = err
	}
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// newGeneration wraps a kafka-go generation for runGeneration. With
// OrderPartition and without SetAside it commits through the generation.
// With OrderKey and OrderNone, whose messages finish out of order, and
// with SetAside, whose delay topic's copies finish in the order they are
// due (dueReader), it commits with each offset the messages that finished
// after it (as metadata, which kafka-go's Generation cannot send, so
// through client with the generation's ID and member ID), and reads what
// the previous owners committed so, to skip those messages.
func (c *Consumer) newGeneration(ctx context.Context, client *kafkago.Client, gen *kafkago.Generation, shutdown <-chan struct{}) *generation {
	var parts []assignment
	for _, topic := range []string{c.cfg.Topic, c.cfg.DelayTopic} {
		as := slices.Clone(gen.Assignments[topic])
		slices.SortFunc(as, func(a, b kafkago.PartitionAssignment) int { return a.ID - b.ID })
		for _, a := range as {
			parts = append(parts, assignment{topicPartition{topic, a.ID}, c.startOffset(topic, a.Offset)})
		}
	}
	byTopic := make(map[string]map[int]int64) // reused by each commit
	g := &generation{
		id:         gen.ID,
		partitions: parts,
		commit: func(offsets map[topicPartition]int64, _ map[topicPartition]string) error {
			for _, ps := range byTopic {
				clear(ps)
			}
			for tp, o := range offsets {
				if byTopic[tp.topic] == nil {
					byTopic[tp.topic] = make(map[int]int64)
				}
				byTopic[tp.topic][tp.partition] = o
			}
			for topic, ps := range byTopic {
				if len(ps) == 0 {
					delete(byTopic, topic) // a topic without partitions is not for the request
				}
			}
			return gen.CommitOffsets(byTopic)
		},
		open:     c.openPartition,
		shutdown: shutdown,
		drained:  make(chan struct{}),
	}
	if c.cfg.Ordering == consumer.OrderPartition && !c.cfg.SetAside {
		return g
	}
	g.commit = func(offsets map[topicPartition]int64, metadata map[topicPartition]string) error {
		return c.commitWithMetadata(client, gen, offsets, metadata)
	}
	g.skips = c.readFinished(ctx, client, parts)
	return g
}

// startOffset returns the offset to start reading a partition of topic
// at, given the offset kafka-go assigned: the committed offset, or
// Config.StartOffset (FirstOffset or LastOffset, both negative) when the
// group has none. kafka-go applies StartOffset to every topic of the
// group, but a partition of the delay topic without a committed offset
// starts at its first offset whatever StartOffset says: its copies'
// originals were committed, so a copy skipped there would be lost. A
// delay partition has no committed offset until a copy on it was handled,
// which a consumer stopped before the first copy was due never did.
func (c *Consumer) startOffset(topic string, assigned int64) int64 {
	if topic == c.cfg.DelayTopic && c.cfg.SetAside && assigned < 0 {
		return kafkago.FirstOffset
	}
	return assigned
}

// commitWithMetadata commits offsets and metadata in gen.
func (c *Consumer) commitWithMetadata(client *kafkago.Client, gen *kafkago.Generation, offsets map[topicPartition]int64, metadata map[topicPartition]string) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
	defer cancel()
	commits := make(map[string][]kafkago.OffsetCommit)
	for tp, o := range offsets {
		commits[tp.topic] = append(commits[tp.topic], kafkago.OffsetCommit{Partition: tp.partition, Offset: o, Metadata: metadata[tp]})
	}
	resp, err := client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
		GroupID:      c.cfg.Group,
		GenerationID: int(gen.ID),
		MemberID:     gen.MemberID,
		Topics:       commits,
	})
	if err != nil {
		return err
	}
	var errs []error
	for topic, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("topic %s partition %d: %w", topic, p.Partition, p.Error))
			}
		}
	}
	return errors.Join(errs...)
}

// readFinished reads, for each assigned partition, the messages that the
// previous owner finished after the committed offset. On an error it logs
// and returns what it has: those messages are then handled again.
func (c *Consumer) readFinished(ctx context.Context, client *kafkago.Client, parts []assignment) map[topicPartition]finishedSet {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	ids := make(map[string][]int)
	for _, a := range parts {
		ids[a.topic] = append(ids[a.topic], a.partition)
	}
	resp, err := client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{
		GroupID: c.cfg.Group,
		Topics:  ids,
	})
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		c.log.Warn("reading the messages finished after the committed offsets failed; they will be handled again",
			"topic", c.cfg.Topic, "group", c.cfg.Group, "err", err)
		return nil
	}
	out := make(map[topicPartition]finishedSet)
	for topic, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error == nil && p.CommittedOffset >= 0 {
				if f := parseFinished(p.CommittedOffset, p.Metadata); f.len() > 0 {
					out[topicPartition{topic, p.Partition}] = f
				}
			}
		}
	}
	return out
}

// openPartition starts a reader of one partition at offset, which may be
// kafka-go's FirstOffset or LastOffset.
func (c *Consumer) openPartition(tp topicPartition, offset int64) (partitionReader, func()) {
	rc := c.prc
	rc.Topic = tp.topic
	rc.Partition = tp.partition
	r := kafkago.NewReader(rc)
	_ = r.SetOffset(offset) // fails only on a closed reader
	c.stats.addReader(r)
	return r, func() {
		if err := r.Close(); err != nil {
			c.log.Debug("closing partition reader", "topic", tp.topic, "partition", tp.partition, "err", err)
		}
		c.stats.removeReader(r)
	}
}

// Close stops a running Run as if its context had ended and waits for it to
// return. Close before Run makes Run return consumer.ErrStopped. Close also
// releases the broker connections that Backlog keeps between calls (once
// Backlog calls in progress return), and Backlog returns
// consumer.ErrStopped afterwards.
// Close is idempotent and always returns nil.
func (c *Consumer) Close() error {
	_ = c.life.Close()
	c.mu.Lock()
	release := !c.closed && c.backlogCalls == 0
	c.closed = true
	c.mu.Unlock()
	if release {
		c.adminTransport.CloseIdleConnections()
	}
	return nil
}

// fatalError wraps a fatal error of what; an authentication or
// authorization error also wraps consumer.ErrAccessRefused.
func fatalError(what string, err error) error {
	var kerr kafkago.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafkago.SASLAuthenticationFailed, kafkago.TopicAuthorizationFailed,
			kafkago.GroupAuthorizationFailed, kafkago.ClusterAuthorizationFailed:
			return fmt.Errorf("%s: %w: %w", what, consumer.ErrAccessRefused, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// isFatal reports whether a fetch or join error cannot heal by retrying:
// an authentication or authorization error (fatalError wraps it with
// consumer.ErrAccessRefused), an invalid group, or a closed reader.
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

// newTransport returns the writers' and admin client's transport, with the
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

// newWriter returns the writer of the dead-letter or the delay topic.
func (c *Consumer) newWriter(t *kafkago.Transport, topic string) *kafkago.Writer {
	log := c.log
	w := &kafkago.Writer{
		Addr:                   kafkago.TCP(c.cfg.Brokers...),
		Balancer:               &kafkago.Hash{},
		RequiredAcks:           kafkago.RequireAll,
		AllowAutoTopicCreation: true,
		BatchTimeout:           10 * time.Millisecond,
		Transport:              t,
		ErrorLogger: kafkago.LoggerFunc(func(format string, args ...any) {
			log.Warn("kafka-go: "+fmt.Sprintf(format, args...), "topic", topic)
		}),
	}
	if c.cfg.ConfigureWriter != nil {
		c.cfg.ConfigureWriter(w)
	}
	w.Topic = topic
	w.Async = false
	w.RequiredAcks = kafkago.RequireAll
	return w
}

// backoff is the delay between retries of a fetch, a commit or a
// dead-letter write.
var backoff = kit.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
