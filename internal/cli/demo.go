package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

const demoHelp = `Usage: throttle demo [flags]

Shows several replicas sharing one rate, with nothing to set up. The demo
starts an in-process Kafka-protocol broker (kfake) and an in-process Redis
(miniredis, unless --redis is given), writes fake SMS events to a topic with
one partition per replica, and runs the replicas in this process, each with
its own Kafka consumer in one consumer group, its own Redis connection and
its own handle on the one shared bucket. These are the real code paths: the
kafka-go consumer with at-least-once commits and the bucket's Lua script.
The sink counts deliveries.

Every second it prints what each replica delivered and the total against the
limit. It ends when every message was delivered (or dead-lettered), after
--duration, or on Ctrl-C, with a summary: the achieved rate, the limit, and
the messages lost. Lost counts messages whose offsets were committed without
a delivery or a dead-letter; it must be 0, and the demo exits 1 otherwise.

Flags:
  --rate R          the shared limit, messages per second (default 20)
  --burst B         the bucket's capacity (default 5)
  --messages N      messages to write (default 300)
  --replicas N      replicas to run (default 3)
  --duration D      stop after D even if messages remain (default 20s)
  --redis ADDR      use the Redis at host:port instead of an in-process one
  --verbose         log the consumers' and the limiter's events to stderr
`

const (
	demoTopic = "sms"
	demoGroup = "throttle-demo"
)

// demoConfig holds the demo's flags.
type demoConfig struct {
	rate      float64
	burst     int
	messages  int
	replicas  int
	duration  time.Duration
	redisAddr string
	verbose   bool
}

// demoResult is what a demo run measured.
type demoResult struct {
	produced     int
	unique       int // messages delivered at least once
	deliveries   int // successful handler calls, redeliveries included
	deadLettered int
	pending      int // neither delivered nor committed: still in the topic
	lost         int // committed without a delivery or a dead-letter
	perReplica   []int64
	span         time.Duration // first to last delivery
	achieved     float64       // deliveries per second, see achievedRate
}

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo")
	var cfg demoConfig
	fs.Float64Var(&cfg.rate, "rate", 20, "")
	fs.IntVar(&cfg.burst, "burst", 5, "")
	fs.IntVar(&cfg.messages, "messages", 300, "")
	fs.IntVar(&cfg.replicas, "replicas", 3, "")
	fs.DurationVar(&cfg.duration, "duration", 20*time.Second, "")
	fs.StringVar(&cfg.redisAddr, "redis", "", "")
	fs.BoolVar(&cfg.verbose, "verbose", false, "")
	pos, err := parseArgs(fs, args, demoHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("demo", "unexpected argument %q", pos[0])
	case math.IsNaN(cfg.rate) || math.IsInf(cfg.rate, 0) || cfg.rate <= 0:
		return usagef("demo", "--rate must be a number > 0, got %v", cfg.rate)
	case cfg.burst < 1:
		return usagef("demo", "--burst must be >= 1, got %d", cfg.burst)
	case cfg.messages < 1:
		return usagef("demo", "--messages must be >= 1, got %d", cfg.messages)
	case cfg.replicas < 1 || cfg.replicas > 16:
		return usagef("demo", "--replicas must be between 1 and 16, got %d", cfg.replicas)
	case cfg.duration <= 0:
		return usagef("demo", "--duration must be > 0, got %v", cfg.duration)
	}
	res, err := runDemo(ctx, cfg, stdout, stderr)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted before the messages were written
		}
		return err
	}
	if res.lost > 0 {
		return fmt.Errorf("the demo lost %s", plural(res.lost, "message"))
	}
	return nil
}

// runDemo runs the demo and prints its table and summary to out.
func runDemo(ctx context.Context, cfg demoConfig, out, stderr io.Writer) (*demoResult, error) {
	level := slog.LevelError
	if cfg.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	redisAddr, redisDesc := cfg.redisAddr, "Redis at "+cfg.redisAddr
	if redisAddr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("starting the in-process redis: %w", err)
		}
		defer mr.Close()
		redisAddr, redisDesc = mr.Addr(), "in-process Redis (miniredis) at "+mr.Addr()
	}
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(int32(cfg.replicas), demoTopic),
		kfake.AllowAutoTopicCreation(), // the dead-letter topic
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
	if err != nil {
		return nil, fmt.Errorf("starting the in-process kafka broker: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, fmt.Errorf("connecting to the in-process kafka broker: %w", err)
	}
	defer kc.Close()

	bucketName := "demo-" + randomHex(4)
	fmt.Fprintf(out, "throttle demo: %d replicas share bucket %q at %s (burst %d)\n", cfg.replicas, bucketName, formatRate(cfg.rate), cfg.burst)
	fmt.Fprintf(out, "  kafka: in-process broker (kfake) at %s, topic %q with %d partitions\n", brokers[0], demoTopic, cfg.replicas)
	fmt.Fprintf(out, "  redis: %s\n", redisDesc)

	sink := newDemoSink(cfg.replicas)
	reps, err := startDemoReplicas(cfg, bucketName, redisAddr, brokers, sink, log)
	if err != nil {
		return nil, err
	}
	// A Redis that outlives the demo should not keep its bucket.
	defer reps.stop(cfg.redisAddr != "")

	// Messages are written once every replica has its partitions, so that
	// the group does not rebalance while they are consumed; a rebalance
	// makes the new owner of a partition redeliver what was handled but not
	// yet committed.
	joined := time.Now()
	if err := waitForGroup(ctx, kc, cfg.replicas); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "  %d replicas joined consumer group %q in %.1f s; writing %d messages\n\n",
		cfg.replicas, demoGroup, time.Since(joined).Seconds(), cfg.messages)
	if err := produceDemoMessages(ctx, kc, cfg.messages, cfg.replicas, sink); err != nil {
		return nil, err
	}

	start := time.Now()
	printDemoTable(ctx, out, cfg, sink, start)
	reps.stop(cfg.redisAddr != "")

	committed, err := fetchCommitted(ctx, kc)
	if err != nil {
		return nil, err
	}
	res := sink.result(committed, cfg.burst)
	printDemoSummary(out, cfg, res)
	return res, nil
}

// position is where a message was written.
type position struct {
	partition int32
	offset    int64
}

// demoEvent is the payload of a demo message.
type demoEvent struct {
	ID   string `json:"id"`
	To   string `json:"to"`
	Text string `json:"text"`
}

// produceDemoMessages writes n fake SMS events round-robin to the
// partitions and tells the sink where each went.
func produceDemoMessages(ctx context.Context, kc *kgo.Client, n, partitions int, sink *demoSink) error {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		ev := demoEvent{
			ID:   fmt.Sprintf("sms-%05d", i+1),
			To:   fmt.Sprintf("+1555%07d", i+1),
			Text: fmt.Sprintf("Your verification code is %06d", (i*7919)%1000000),
		}
		body, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encoding a demo message: %w", err)
		}
		recs[i] = &kgo.Record{Topic: demoTopic, Partition: int32(i % partitions), Key: []byte(ev.ID), Value: body}
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kc.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("writing the demo messages: %w", err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for _, r := range recs {
		sink.positions[string(r.Key)] = position{partition: r.Partition, offset: r.Offset}
	}
	sink.want = n
	sink.checkDone()
	return nil
}

// waitForGroup waits until the demo group is stable with n members.
func waitForGroup(ctx context.Context, kc *kgo.Client, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(kc)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		groups, err := adm.DescribeGroups(ctx, demoGroup)
		if err == nil {
			if g, ok := groups[demoGroup]; ok && g.Err == nil && g.State == "Stable" && len(g.Members) == n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d replicas to join the consumer group: %w", n, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// fetchCommitted returns the demo group's committed offset by partition.
func fetchCommitted(ctx context.Context, kc *kgo.Client) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(kc).FetchOffsets(ctx, demoGroup)
	if err != nil {
		return nil, fmt.Errorf("reading the committed offsets: %w", err)
	}
	out := map[int32]int64{}
	for p, o := range resp[demoTopic] {
		if o.Err != nil {
			return nil, fmt.Errorf("reading the committed offset of partition %d: %w", p, o.Err)
		}
		out[p] = o.At
	}
	return out, nil
}

// demoSink records deliveries. It is safe for concurrent use.
type demoSink struct {
	mu           sync.Mutex
	positions    map[string]position // by message id, once written
	want         int                 // messages written; 0 until then
	deliveries   map[string]int
	deadLettered map[string]bool
	perReplica   []int64
	total        int
	first, last  time.Time
	done         chan struct{} // closed when every message was handled
	closed       bool
}

func newDemoSink(replicas int) *demoSink {
	return &demoSink{
		positions:    map[string]position{},
		deliveries:   map[string]int{},
		deadLettered: map[string]bool{},
		perReplica:   make([]int64, replicas),
		done:         make(chan struct{}),
	}
}

// handler returns replica i's handler.
func (s *demoSink) handler(i int) consumer.Handler {
	return func(_ context.Context, msg consumer.Message) error {
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.deliveries[string(msg.Key)]++
		s.perReplica[i]++
		s.total++
		if s.first.IsZero() {
			s.first = now
		}
		s.last = now
		s.checkDone()
		return nil
	}
}

func (s *demoSink) deadLetter(msg consumer.Message, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deadLettered[string(msg.Key)] = true
	s.checkDone()
}

// checkDone closes done once every message was delivered or
// dead-lettered. s.mu must be held.
func (s *demoSink) checkDone() {
	if s.closed {
		return
	}
	handled := len(s.deliveries)
	for id := range s.deadLettered {
		if s.deliveries[id] == 0 {
			handled++
		}
	}
	if s.want > 0 && handled >= s.want {
		s.closed = true
		close(s.done)
	}
}

// snapshot returns each replica's deliveries so far, their total, and the
// number of distinct messages delivered.
func (s *demoSink) snapshot() (perReplica []int64, total, unique int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.perReplica...), s.total, len(s.deliveries)
}

// result compares the deliveries with the committed offsets.
func (s *demoSink) result(committed map[int32]int64, burst int) *demoResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &demoResult{
		produced:   len(s.positions),
		unique:     len(s.deliveries),
		deliveries: s.total,
		perReplica: append([]int64(nil), s.perReplica...),
		span:       s.last.Sub(s.first),
	}
	for id, pos := range s.positions {
		switch {
		case s.deliveries[id] > 0:
		case s.deadLettered[id]:
			r.deadLettered++
		case pos.offset < committed[pos.partition]:
			r.lost++
		default:
			r.pending++
		}
	}
	r.achieved = achievedRate(r.deliveries, burst, r.span)
	return r
}

// achievedRate is the rate the bucket granted between the first and the
// last delivery. A full bucket hands out burst tokens at once and rate per
// second after that, so n deliveries over span give (n - burst) / span.
func achievedRate(n, burst int, span time.Duration) float64 {
	if span <= 0 {
		return 0
	}
	if n > burst {
		return float64(n-burst) / span.Seconds()
	}
	return float64(n) / span.Seconds()
}

// demoReplicas are the running replicas.
type demoReplicas struct {
	once    sync.Once
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	buckets []*limiter.Bucket
	stores  []*redislimiter.Store
	clients []interface{ Close() error }
	log     *slog.Logger
}

// startDemoReplicas starts the replicas, each with its own Redis client,
// bucket handle and Kafka consumer.
func startDemoReplicas(cfg demoConfig, bucketName, redisAddr string, brokers []string, sink *demoSink, log *slog.Logger) (*demoReplicas, error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &demoReplicas{cancel: cancel, log: log}
	obs := &consumer.MessageObserver{DeadLettered: sink.deadLetter}
	consumers := make([]*kafka.Consumer, 0, cfg.replicas)
	for i := range cfg.replicas {
		client, err := redisconn.New(config.Redis{Addr: redisAddr, Timeout: config.Duration(time.Second)})
		if err != nil {
			r.stop(false)
			return nil, fmt.Errorf("--redis: %w", err)
		}
		r.clients = append(r.clients, client)
		store, err := redislimiter.New(client, redislimiter.Config{Bucket: bucketName, Rate: cfg.rate, Burst: cfg.burst})
		if err != nil {
			r.stop(false)
			return nil, err
		}
		r.stores = append(r.stores, store)
		id := fmt.Sprintf("replica-%d", i+1)
		b, err := limiter.New(store, limiter.Options{ReplicaID: id, Logger: log.With("replica", id)})
		if err != nil {
			r.stop(false)
			return nil, err
		}
		r.buckets = append(r.buckets, b)
		c, err := kafka.New(kafka.Config{
			Options:         consumer.Options{Concurrency: cfg.replicas, Limiter: b, Retry: consumer.RetryPolicy{MaxAttempts: 3, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}, DrainTimeout: 5 * time.Second, Observer: obs, Logger: log.With("replica", id)},
			Brokers:         brokers,
			Topic:           demoTopic,
			Group:           demoGroup,
			ConfigureReader: demoReader,
		}, sink.handler(i))
		if err != nil {
			r.stop(false)
			return nil, err
		}
		consumers = append(consumers, c)
	}
	for i, c := range consumers {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := c.Run(ctx); err != nil {
				log.Error("consumer stopped", "replica", i+1, "error", err)
			}
		}()
	}
	return r, nil
}

// demoReader makes the consumer group settle within a second, where
// production settings take several.
func demoReader(rc *kafkago.ReaderConfig) {
	rc.HeartbeatInterval = 100 * time.Millisecond
	rc.SessionTimeout = time.Second
	rc.RebalanceTimeout = 2 * time.Second
	rc.JoinGroupBackoff = 100 * time.Millisecond
	rc.MaxWait = 100 * time.Millisecond
	rc.ReadBackoffMin = 10 * time.Millisecond
	rc.ReadBackoffMax = 100 * time.Millisecond
}

// stop stops the consumers, which drain and commit, then releases the
// buckets and clients. With forget, it first deletes the bucket's state.
// Only the first call does anything.
func (r *demoReplicas) stop(forget bool) {
	r.once.Do(func() { r.shutdown(forget) })
}

func (r *demoReplicas) shutdown(forget bool) {
	r.cancel()
	r.wg.Wait()
	for _, b := range r.buckets {
		if err := b.Close(); err != nil {
			r.log.Warn("closing a bucket", "error", err)
		}
	}
	if forget && len(r.stores) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := r.stores[0].Admin().Reset(ctx); err != nil {
			r.log.Warn("removing the demo bucket", "error", err)
		}
		cancel()
	}
	for _, c := range r.clients {
		_ = c.Close()
	}
}

// printDemoTable prints one row per second until every message was
// handled, cfg.duration passed, or ctx ended.
func printDemoTable(ctx context.Context, out io.Writer, cfg demoConfig, sink *demoSink, start time.Time) {
	names := make([]string, cfg.replicas)
	for i := range names {
		names[i] = fmt.Sprintf("%10s", fmt.Sprintf("replica-%d", i+1))
	}
	fmt.Fprintf(out, "%6s %s | %11s %8s | %s\n", "time", strings.Join(names, " "), "this second", "limit", "messages delivered")
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.NewTimer(cfg.duration)
	defer deadline.Stop()
	prev, prevTotal := make([]int64, cfg.replicas), 0
	row := func() {
		cur, total, unique := sink.snapshot()
		cols := make([]string, len(cur))
		for i := range cur {
			cols[i] = fmt.Sprintf("%10d", cur[i]-prev[i])
		}
		fmt.Fprintf(out, "%5.0fs %s | %11d %8s | %d/%d\n", time.Since(start).Seconds(), strings.Join(cols, " "),
			total-prevTotal, formatRate(cfg.rate), unique, cfg.messages)
		prev, prevTotal = cur, total
	}
	for {
		select {
		case <-tick.C:
			row()
		case <-sink.done:
			row()
			return
		case <-deadline.C:
			row()
			fmt.Fprintf(out, "--duration %v reached.\n", cfg.duration)
			return
		case <-ctx.Done():
			row()
			fmt.Fprintln(out, "Interrupted.")
			return
		}
	}
}

func printDemoSummary(out io.Writer, cfg demoConfig, r *demoResult) {
	per := make([]string, len(r.perReplica))
	for i, n := range r.perReplica {
		per[i] = fmt.Sprintf("replica-%d %d", i+1, n)
	}
	fmt.Fprintf(out, "\nSummary\n")
	fmt.Fprintf(out, "  delivered      %d of %d messages (%d redelivered, %d dead-lettered)\n",
		r.unique, r.produced, r.deliveries-r.unique, r.deadLettered)
	fmt.Fprintf(out, "  achieved rate  %.1f msg/s over %.1f s, against a limit of %s (burst %d)\n",
		r.achieved, r.span.Seconds(), formatRate(cfg.rate), cfg.burst)
	fmt.Fprintf(out, "  per replica    %s\n", strings.Join(per, ", "))
	if r.pending > 0 {
		fmt.Fprintf(out, "  not delivered  %d, still in the topic when the demo ended (not lost)\n", r.pending)
	}
	fmt.Fprintf(out, "  lost           %d\n", r.lost)
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
