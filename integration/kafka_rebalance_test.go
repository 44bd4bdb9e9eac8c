package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/internal/testenv"
)

// kafkaE2E runs throttle replicas, built from this tree, against one Kafka
// topic (kfake, or KAFKA_BROKERS when set), the real Redis and an HTTP sink
// that counts every request.
type kafkaE2E struct {
	t                  *testing.T
	bin, redis         string
	brokers            []string
	topic, group, name string
	sink               *cliSink
	dir                string
	rate               float64
	burst, conc        int
	partitions         int32
	// extraLimit and extraSource are YAML lines added to the limit and
	// source.kafka sections, indented.
	extraLimit, extraSource string
	// extraDelivery is YAML lines added to the delivery section,
	// indented.
	extraDelivery string
	admin         *kadm.Client
	replicas      []*cliProcess
}

const kafkaE2EPartitions = 6

func newKafkaE2E(t *testing.T, bin string, rate float64) *kafkaE2E {
	return newKafkaE2EWith(t, bin, rate, kafkaE2EPartitions)
}

func newKafkaE2EWith(t *testing.T, bin string, rate float64, partitions int32) *kafkaE2E {
	t.Helper()
	e := &kafkaE2E{
		t: t, bin: bin, redis: testenv.RedisAddr(t), name: cliName(t),
		sink: cliNewSink(t), dir: t.TempDir(), rate: rate, burst: 5, partitions: partitions,
	}
	e.topic, e.group = e.name+"-topic", e.name+"-group"
	if brokers := testenv.KafkaBrokers(); len(brokers) > 0 {
		e.brokers = brokers
	} else {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, e.topic),
			kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
		if err != nil {
			t.Fatalf("starting kfake: %v", err)
		}
		t.Cleanup(c.Close)
		e.brokers = c.ListenAddrs()
	}
	e.admin = kadm.NewClient(suiteKgo(t, e.brokers))
	if len(testenv.KafkaBrokers()) > 0 {
		ctx := testenv.Context(t, 30*time.Second)
		if _, err := e.admin.CreateTopic(ctx, partitions, -1, nil, e.topic); err != nil {
			t.Fatalf("creating topic %s: %v", e.topic, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = e.admin.DeleteTopics(ctx, e.topic, e.topic+".dlq")
			_, _ = e.admin.DeleteGroup(ctx, e.group)
		})
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", e.name, "--redis", e.redis) })
	return e
}

// produce writes messages {"id":from} .. {"id":to-1} round-robin over the
// partitions.
func (e *kafkaE2E) produce(from, to int) {
	e.t.Helper()
	cl := suiteKgo(e.t, e.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for id := from; id < to; id++ {
		recs = append(recs, &kgo.Record{Topic: e.topic, Partition: int32(id % kafkaE2EPartitions),
			Key: fmt.Appendf(nil, "k%d", id), Value: fmt.Appendf(nil, `{"id":%d}`, id)})
	}
	ctx := testenv.Context(e.t, 30*time.Second)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("producing: %v", err)
	}
}

// start starts one more replica.
func (e *kafkaE2E) start() *cliProcess {
	e.t.Helper()
	i := len(e.replicas) + 1
	var extra strings.Builder
	if e.conc > 0 {
		fmt.Fprintf(&extra, "    concurrency: %d\n", e.conc)
	}
	extra.WriteString(e.extraSource)
	cfg := fmt.Sprintf(`
redis:
  addr: %q
  timeout: 2s
limit:
  bucket: %s
  rate: %v
  burst: %d
%ssource:
  kafka:
    brokers: [%s]
    topic: %s
    group: %s
%ssink:
  http:
    url: %q
    timeout: 5s
delivery:
  drain_timeout: 10s
%smetrics:
  listen: %q
log:
  level: info
`, e.redis, e.name, e.rate, e.burst, e.extraLimit, kafkaE2EList(e.brokers), e.topic, e.group, extra.String(), e.sink.srv.URL+"/send",
		e.extraDelivery, cliMetricsListen)
	path := filepath.Join(e.dir, fmt.Sprintf("replica-%d.yaml", i))
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	p := cliStart(e.t, e.bin, "run", "--config", path)
	e.replicas = append(e.replicas, p)
	return p
}

// kafkaE2EList renders addresses as the items of a YAML flow list.
func kafkaE2EList(addrs []string) string {
	q := make([]string, len(addrs))
	for i, a := range addrs {
		q[i] = fmt.Sprintf("%q", a)
	}
	return strings.Join(q, ", ")
}

// waitMembers waits until the group is stable with n members that all
// have partitions.
func (e *kafkaE2E) waitMembers(n int, d time.Duration) {
	e.t.Helper()
	testenv.WaitGroupStable(e.t, e.admin, e.group, n, d)
}

// waitDelivered waits until the sink received n distinct messages.
func (e *kafkaE2E) waitDelivered(n int, d time.Duration) {
	e.t.Helper()
	cliWait(e.t, d, fmt.Sprintf("%d distinct messages at the sink", n), func() bool {
		_, unique := e.sink.counts()
		return unique >= n
	})
}

// duplicates returns the requests beyond the first of each message, and
// the ids received more than once.
func (e *kafkaE2E) duplicates() (int, []int) {
	e.sink.mu.Lock()
	defer e.sink.mu.Unlock()
	var ids []int
	for id, n := range e.sink.seen {
		if n > 1 {
			ids = append(ids, id)
		}
	}
	return len(e.sink.arrivals) - len(e.sink.seen), ids
}

// revocations returns the "partitions revoked" log lines of p.
func revocations(p *cliProcess) []string {
	var out []string
	for _, l := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(l, "partitions revoked") {
			out = append(out, l)
		}
	}
	return out
}

// TestKafkaRebalanceNoDuplicates runs the binary as a new user would and
// grows the group from one replica to three while messages flow, the third
// joining mid-run, then lets one leave with SIGTERM: every message arrives
// exactly once, since each generation drops what it did not start and
// commits what it finished before the members rejoin. With ordering: key,
// the messages finished after the committed offset travel in the commit
// metadata.
func TestKafkaRebalanceNoDuplicates(t *testing.T) {
	t.Parallel()
	bin := cliBuild(t)
	for _, ordering := range []string{"partition", "key"} {
		t.Run(ordering, func(t *testing.T) {
			t.Parallel()
			if ordering != "partition" && testing.Short() {
				t.Skip("one ordering is enough in -short")
			}
			kafkaRebalance(t, bin, ordering)
		})
	}
}

func kafkaRebalance(t *testing.T, bin, ordering string) {
	const total = 600
	e := newKafkaE2E(t, bin, 40)
	e.extraSource = fmt.Sprintf("    ordering: %s\n", ordering)
	e.produce(0, total)

	e.start()
	e.waitMembers(1, 30*time.Second)
	e.waitDelivered(60, 30*time.Second)
	e.start()
	e.waitMembers(2, 30*time.Second)
	e.waitDelivered(180, 30*time.Second)
	e.start() // joins mid-run, with every partition busy
	e.waitMembers(3, 30*time.Second)
	e.waitDelivered(300, 30*time.Second)
	if code := e.replicas[1].stop(t, 30*time.Second); code != 0 {
		t.Fatalf("replica 2 exited %d after SIGTERM", code)
	}
	e.waitMembers(2, 30*time.Second)
	e.waitDelivered(total, 60*time.Second)
	for i, p := range []*cliProcess{e.replicas[0], e.replicas[2]} {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Fatalf("replica %d exited %d after SIGTERM", []int{1, 3}[i], code)
		}
	}
	requests, unique := e.sink.counts()
	dups, ids := e.duplicates()
	for i, p := range e.replicas {
		for _, l := range revocations(p) {
			t.Logf("replica %d: %s", i+1, l)
		}
	}
	t.Logf("ordering %s: %d messages, %d requests at the sink, %d duplicates", ordering, unique, requests, dups)
	if unique != total {
		t.Errorf("%d distinct messages arrived, want %d", unique, total)
	}
	if dups != 0 {
		t.Errorf("%d duplicates (ids %v), want 0 on clean joins and a SIGTERM leave", dups, ids)
	}
}

// TestKafkaCrashDuplicatesBounded kills one of two replicas with SIGKILL
// mid-run. The survivor takes its partitions once the group's session
// timeout (kafka-go's default, 30s) expires: nothing is lost, and the
// messages handled twice are at most what the killed replica had fetched
// and not committed, its in-flight bound (concurrency + queue size).
func TestKafkaCrashDuplicatesBounded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for the group's 30s session timeout")
	}
	const total = 400
	e := newKafkaE2E(t, cliBuild(t), 40)
	e.extraSource = ""
	e.conc = 3
	e.produce(0, total)
	e.start()
	killed := e.start()
	e.waitMembers(2, 30*time.Second)
	e.waitDelivered(120, 30*time.Second)
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-killed.done
	e.waitDelivered(total, 90*time.Second)
	if code := e.replicas[0].stop(t, 30*time.Second); code != 0 {
		t.Fatalf("the survivor exited %d after SIGTERM", code)
	}
	requests, unique := e.sink.counts()
	dups, ids := e.duplicates()
	// The consumer's defaults: kafka.DefaultQueueSize.
	bound := e.conc + 32
	t.Logf("SIGKILL: %d messages, %d requests at the sink, %d duplicates (bound %d)", unique, requests, dups, bound)
	if unique != total {
		t.Errorf("%d distinct messages arrived, want %d: a crash must lose nothing", unique, total)
	}
	if dups > bound {
		t.Errorf("%d duplicates (ids %v), want at most the killed replica's in-flight bound %d", dups, ids, bound)
	}
}
