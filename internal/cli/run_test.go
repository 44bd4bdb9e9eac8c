package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// servingAddr waits for the "serving metrics" record of a replica's JSON
// log and returns its address: tests listen on port 0 and let the system
// pick the port.
func servingAddr(t *testing.T, stderr *testenv.Buffer) string {
	t.Helper()
	re := regexp.MustCompile(`"msg":"serving metrics","addr":"([^"]+)"`)
	var addr string
	waitFor(t, 20*time.Second, "the \"serving metrics\" log record", func() bool {
		m := re.FindStringSubmatch(stderr.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

// metricValue returns the value of the unlabelled metric name in a
// Prometheus text exposition.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// waitFor waits up to d for what: testenv.Eventually.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, d, what, cond)
}

// TestRunKafkaToStdout runs one replica in process: kfake → shared bucket
// in Redis → stdout sink, then stops it as SIGTERM would.
func TestRunKafkaToStdout(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	topic := testenv.Name(t, "topic")
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	kc, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	const n = 5
	for i := range n {
		rec := &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i)), Headers: []kgo.RecordHeader{{Key: "cost", Value: []byte("1")}}}
		if err := kc.ProduceSync(testenv.Context(t, 10*time.Second), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	bucket := testenv.Name(t, "cli")
	path := writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
limit: {bucket: %s, rate: 50, burst: 2, cost_header: cost}
source:
  kafka: {brokers: [%q], topic: %s, group: %s}
sink: {stdout: {}}
metrics: {listen: "127.0.0.1:0"}
log: {format: json, level: debug}
`, redisAddr, bucket, cluster.ListenAddrs()[0], topic, testenv.Name(t, "group")))
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })
	// Another live replica, configured with another rate.
	client, store := redisStore(t, redisAddr, bucket, 1, 1)
	t.Cleanup(func() { client.Del(context.Background(), store.Keys()...) })
	heartbeat(t, client, bucket, "other-replica", 80, 2)
	defer func(d time.Duration) { monitorInterval = d }(monitorInterval)
	monitorInterval = 50 * time.Millisecond

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testenv.Buffer
	codec := make(chan int, 1)
	go func() { codec <- Run(ctx, []string{"run", "--config", path}, &stdout, &stderr) }()
	metricsAddr := servingAddr(t, &stderr)

	waitFor(t, 30*time.Second, "5 messages on stdout", func() bool { return strings.Count(stdout.String(), "\n") >= n })
	if code, _ := get(t, "http://"+metricsAddr+"/readyz"); code != 200 {
		t.Errorf("/readyz while running: %d", code)
	}
	_, body := get(t, "http://"+metricsAddr+"/metrics")
	if !strings.Contains(body, fmt.Sprintf(`throttle_messages_delivered_total{broker="kafka"} %d`, n)) {
		t.Errorf("/metrics does not count %d deliveries:\n%s", n, body)
	}
	// Once the offsets are committed, the group has no lag.
	waitFor(t, 10*time.Second, "throttle_source_backlog 0", func() bool {
		_, body := get(t, "http://"+metricsAddr+"/metrics")
		return strings.Contains(body, `throttle_source_backlog{broker="kafka"} 0`)
	})
	_, body = get(t, "http://"+metricsAddr+"/metrics")
	for _, name := range []string{"throttle_kafka_reader_dials_total", "throttle_kafka_rebalances_total", "throttle_kafka_partitions_assigned"} {
		if v, ok := metricValue(body, name); !ok || v < 1 {
			t.Errorf("%s = %v (served: %v), want at least 1 after joining the group", name, v, ok)
		}
	}
	if v, ok := metricValue(body, "throttle_kafka_dropped_at_revocation_total"); !ok || v != 0 {
		t.Errorf("throttle_kafka_dropped_at_revocation_total = %v (served: %v), want 0 without a revocation", v, ok)
	}
	cancel()
	select {
	case code := <-codec:
		if code != ExitOK {
			t.Errorf("exit code %d after cancel, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop within 30 s of cancel")
	}
	for _, want := range []string{`"msg":"starting"`, `"msg":"configuration"`, `"msg":"shutting down`, `"msg":"stopped"`,
		`"msg":"this replica's config configures 50/s burst 2, but live replicas run 80/s burst 2 on other-replica; without an override`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, stderr.String())
		}
	}
	if !strings.Contains(stdout.String(), `"body":{"n":4}`) {
		t.Errorf("stdout lacks the last message:\n%s", stdout.String())
	}
}

func TestRunMetricsPortBusy(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	path := writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
limit: {bucket: %s, rate: 5}
source:
  rabbitmq: {url: "amqp://guest:guest@127.0.0.1:1/", queue: q}
sink: {stdout: {}}
metrics: {listen: %q}
`, redisAddr, testenv.Name(t, "cli"), ln.Addr().String()))
	code, _, stderr := runCLI(t, "run", "--config", path)
	if code != ExitFailure || !strings.Contains(stderr, "metrics.listen") {
		t.Errorf("exit code %d, stderr %q; want %d naming metrics.listen", code, stderr, ExitFailure)
	}
}

// idleRunner is a consumer that does nothing until its context ends.
type idleRunner struct{ started chan struct{} }

func (r idleRunner) Run(ctx context.Context) error {
	close(r.started)
	<-ctx.Done()
	return nil
}

// TestRunLogsShutdownInOrder stops a replica whose consumer returns as soon
// as its context ends, many times, and checks that "shutting down" is
// logged before "stopped" each time (they once raced, and
// "stopped" could come first).
func TestRunLogsShutdownInOrder(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	bucket := testenv.Name(t, "cli")
	path := writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
limit: {bucket: %s, rate: 5}
source:
  rabbitmq: {url: "amqp://127.0.0.1:1/", queue: q}
sink: {stdout: {}}
metrics: {listen: "off"}
log: {format: json}
`, redisAddr, bucket))
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })
	var started chan struct{}
	defer func(f func(builder, *limiter.Bucket, consumer.Handler) (runner, error)) { buildConsumer = f }(buildConsumer)
	buildConsumer = func(builder, *limiter.Bucket, consumer.Handler) (runner, error) {
		return idleRunner{started: started}, nil
	}
	for i := range 20 {
		started = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr testenv.Buffer
		codec := make(chan int, 1)
		go func() { codec <- Run(ctx, []string{"run", "--config", path}, &stdout, &stderr) }()
		select {
		case <-started:
		case code := <-codec:
			t.Fatalf("run #%d exited with %d before its consumer ran:\n%s", i+1, code, stderr.String())
		}
		cancel()
		if code := <-codec; code != ExitOK {
			t.Fatalf("run #%d: exit code %d, want 0:\n%s", i+1, code, stderr.String())
		}
		logs := stderr.String()
		down, stopped := strings.Index(logs, `"msg":"shutting down`), strings.Index(logs, `"msg":"stopped"`)
		if down < 0 || stopped < 0 || stopped < down {
			t.Fatalf("run #%d: want \"shutting down\" (at %d) logged before \"stopped\" (at %d):\n%s", i+1, down, stopped, logs)
		}
		// JSON logs once gave durations in nanoseconds.
		if !strings.Contains(logs, `"drain_timeout":"30s"`) {
			t.Fatalf("run #%d: the JSON log does not give drain_timeout as \"30s\":\n%s", i+1, logs)
		}
	}
}

// TestPauseReporterBoundsTheRate checks that push-back pauses are logged at
// most once per interval, and that the next line counts the ones left out.
func TestPauseReporterBoundsTheRate(t *testing.T) {
	var buf testenv.Buffer
	r := newPauseReporter(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: logReplaceAttr})), time.Hour)
	r.report(3*time.Second, "replica r2")
	r.report(2*time.Second, "another replica")
	r.report(time.Second, "another replica")
	r.last = r.last.Add(-time.Hour) // the interval has passed
	r.report(1500*time.Millisecond, "replica r1")
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(got) != 2 ||
		!strings.Contains(got[0], `"msg":"bucket paused 3s by push-back from replica r2","pause":"3s"`) ||
		!strings.Contains(got[1], `"msg":"bucket paused 1.5s by push-back from replica r1","pause":"1.5s","pauses_not_logged":2`) {
		t.Errorf("log:\n%s\nwant the first pause, then the fourth counting 2 left out", buf.String())
	}
}

func TestSendsInFlightCapped(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      config.Config
		key      string
		handlers int
		maxConns int
		ok       bool
	}{
		{"rabbitmq above the default", config.Config{Source: config.Source{RabbitMQ: &config.RabbitMQ{Concurrency: 100}}, Sink: config.Sink{HTTP: &config.HTTP{}}},
			"rabbitmq.concurrency", 100, httpsink.DefaultMaxConns, true},
		{"rabbitmq within max_conns", config.Config{Source: config.Source{RabbitMQ: &config.RabbitMQ{Concurrency: 100}}, Sink: config.Sink{HTTP: &config.HTTP{MaxConns: 128}}},
			"rabbitmq.concurrency", 100, 128, false},
		{"rabbitmq at the library's default", config.Config{Source: config.Source{RabbitMQ: &config.RabbitMQ{}}, Sink: config.Sink{HTTP: &config.HTTP{MaxConns: 4}}},
			"", 0, 4, false},
		{"kafka, the larger of the two", config.Config{Source: config.Source{Kafka: &config.Kafka{Concurrency: 16, MaxInFlight: 500}}, Sink: config.Sink{HTTP: &config.HTTP{}}},
			"kafka.max_in_flight", 500, httpsink.DefaultMaxConns, true},
		{"not an HTTP sink", config.Config{Source: config.Source{RabbitMQ: &config.RabbitMQ{Concurrency: 100}}, Sink: config.Sink{Stdout: &config.Stdout{}}},
			"", 0, 0, false},
	} {
		key, handlers, maxConns, ok := sendsInFlightCapped(tc.cfg.Source, tc.cfg.Sink)
		if key != tc.key || handlers != tc.handlers || maxConns != tc.maxConns || ok != tc.ok {
			t.Errorf("%s: got %q %d, max_conns %d, %v; want %q %d, %d, %v", tc.name, key, handlers, maxConns, ok, tc.key, tc.handlers, tc.maxConns, tc.ok)
		}
	}
}
