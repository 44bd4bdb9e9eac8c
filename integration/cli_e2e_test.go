package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestCLIEndToEnd builds the throttle binary and runs it against the real
// Redis and RabbitMQ and an HTTP sink.
func TestCLIEndToEnd(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	if out := cliRun(t, bin, "version"); !strings.HasPrefix(out, "throttle "+cliVersion+" ") {
		t.Errorf("throttle version: %q, want the version set with -ldflags", out)
	}
	t.Run("two replicas share the rate and follow bucket set", func(t *testing.T) {
		cliTestSharedRate(t, bin, redisAddr, amqpURL)
	})
	t.Run("a second SIGTERM exits at once", func(t *testing.T) {
		cliTestSecondSignal(t, bin, redisAddr, amqpURL)
	})
}

// cliTestSharedRate runs two replicas and checks that every message
// arrives, that together they keep the configured rate, that 'throttle
// bucket set' changes the rate of both within 1 s, and that SIGTERM drains
// and exits 0.
func cliTestSharedRate(t *testing.T, bin, redisAddr, amqpURL string) {
	const (
		rate       = 30.0
		burst      = 5
		newRate    = 60.0
		phase1     = 300 // messages measured at rate
		phase2     = 360 // messages measured at newRate
		total      = phase1 + phase2
		replicas   = 2
		rateBound  = 0.03
		afterBound = 0.03
	)
	name := cliName(t)
	sink := cliNewSink(t)

	conn, ch := cliQueue(t, amqpURL, name)
	dir := t.TempDir()
	metrics := make([]string, replicas)
	procs := make([]*cliProcess, replicas)
	var cfgPath string
	for i := range replicas {
		cfgPath = filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i+1))
		// A Redis answer slower than redis.timeout (250 ms by default)
		// sends a replica to its local fallback, as designed. A loaded CI
		// machine can be that slow; this test measures sharing, not
		// fallback (the fault tests do), so it allows 2 s.
		cfg := fmt.Sprintf(`
redis:
  addr: %q
  timeout: 2s
limit:
  bucket: %s
  rate: %v
  burst: %d
source:
  rabbitmq:
    url: %q
    queue: %s
    prefetch: 20
    declare: true
sink:
  http:
    url: %q
    timeout: 5s
delivery:
  drain_timeout: 10s
metrics:
  listen: %q
`, redisAddr, name, rate, burst, amqpURL, name, sink.srv.URL+"/send", cliMetricsListen)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		procs[i] = cliStart(t, bin, "run", "--config", cfgPath)
		metrics[i] = cliServingAddr(t, procs[i])
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })

	// Both replicas consume once RabbitMQ counts two consumers on the queue.
	cliWait(t, 20*time.Second, "two consumers on the queue", func() bool { return cliQueueState(conn, name).Consumers == replicas })
	for _, addr := range metrics {
		if code, body := cliGet("http://" + addr + "/readyz"); code != 200 {
			t.Fatalf("/readyz of %s: %d %s", addr, code, body)
		}
	}
	type limits struct {
		Rate  float64 `json:"rate"`
		Burst int     `json:"burst"`
	}
	var st struct {
		Configured *limits `json:"configured"`
		Replicas   []struct {
			ID         string  `json:"id"`
			Configured *limits `json:"configured"`
		} `json:"replicas"`
	}
	cliWait(t, 5*time.Second, "two live replicas in bucket status", func() bool {
		out := cliRun(t, bin, "bucket", "status", name, "--redis", redisAddr, "--json")
		return json.Unmarshal([]byte(out), &st) == nil && len(st.Replicas) == replicas
	})
	// Without --config, the configured limits come from the replicas.
	if want := (limits{rate, burst}); st.Configured == nil || *st.Configured != want {
		t.Errorf("bucket status --redis: configured %+v, want %+v reported by the replicas", st.Configured, want)
	}

	ctx := testenv.Context(t, 60*time.Second)
	for i := range total {
		err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    strconv.Itoa(i),
			Body:         []byte(fmt.Sprintf(`{"id":%d,"to":"+1555%07d"}`, i, i)),
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}

	// Phase 1 at the configured rate, then the override.
	cliWait(t, 30*time.Second, "the first messages", func() bool { n, _ := sink.counts(); return n >= phase1 })
	// The replicas read the queue's backlog every 5 s and phase 1 lasts
	// 10 s, so the last reading came after the publishing and counts every
	// message not yet delivered or held in the replicas' prefetch (20 each).
	_, body := cliGet("http://" + metrics[0] + "/metrics")
	if n := cliMetric(body, "throttle_source_backlog"); n < total-phase1-replicas*20 || n > total {
		t.Errorf("throttle_source_backlog = %v during phase 1, want between %d and %d", n, total-phase1-replicas*20, total)
	} else {
		t.Logf("throttle_source_backlog during phase 1: %v", n)
	}
	cliRun(t, bin, "bucket", "set", "--config", cfgPath, "--rate", strconv.FormatFloat(newRate, 'f', -1, 64))
	setAt := time.Now()
	// Every replica's limiter sees the new rate with its next token request.
	for _, addr := range metrics {
		cliWait(t, time.Second, "the new rate in the limiter of "+addr, func() bool {
			_, body := cliGet("http://" + addr + "/metrics")
			return cliMetric(body, "throttle_bucket_effective_rate") == newRate
		})
	}
	followed := time.Since(setAt)
	cliWait(t, 30*time.Second, "every message", func() bool { _, u := sink.counts(); return u >= total })

	requests, unique := sink.counts()
	if unique != total {
		t.Errorf("%d distinct messages arrived, want %d", unique, total)
	}
	ts := sink.times()
	before := cliRate(ts[:phase1], burst)
	// The override is announced on the bucket's change channel, so slots
	// reserved at the old rate are taken again at once: from 1 s after the
	// command the deliveries run at the new rate.
	var after []time.Time
	perSecond := make([]int, 3)
	for _, at := range ts {
		d := at.Sub(setAt)
		if d >= 0 && d < 3*time.Second {
			perSecond[d/time.Second]++
		}
		if d >= time.Second {
			after = append(after, at)
		}
	}
	afterRate := cliRate(after, 0)
	t.Logf("%d replicas, limit %v/s burst %d: %d messages at %.2f msg/s (%+.2f%%) over %.2f s",
		replicas, rate, burst, phase1, before, 100*(before-rate)/rate, ts[phase1-1].Sub(ts[0]).Seconds())
	t.Logf("'bucket set --rate %v': both limiters at the new rate %v after the command; deliveries in seconds 1, 2, 3 after it: %v; from 1 s on %.2f msg/s (%+.2f%%) over %d messages",
		newRate, followed.Round(time.Millisecond), perSecond, afterRate, 100*(afterRate-newRate)/newRate, len(after))
	t.Logf("%d requests for %d messages (%d redelivered)", requests, unique, requests-unique)
	if math.Abs(before-rate)/rate > rateBound {
		t.Errorf("aggregate rate %.2f msg/s, want %v ±%.0f%%", before, rate, 100*rateBound)
	}
	if math.Abs(afterRate-newRate)/newRate > afterBound {
		t.Errorf("rate after bucket set %.2f msg/s, want %v ±%.0f%%", afterRate, newRate, 100*afterBound)
	}
	if float64(perSecond[1]) > 1.1*newRate+burst {
		t.Errorf("%d deliveries in the second second after bucket set, want at most %v: slots reserved at the old rate overlapped the new ones", perSecond[1], 1.1*newRate+burst)
	}
	if float64(perSecond[1]) < 0.9*newRate {
		t.Errorf("%d deliveries in the second second after bucket set, want at least %v: the new rate came late", perSecond[1], 0.9*newRate)
	}

	var delivered float64
	for _, addr := range metrics {
		_, body := cliGet("http://" + addr + "/metrics")
		delivered += cliMetric(body, "throttle_messages_delivered_total")
		if cliMetric(body, "throttle_bucket_effective_rate") != newRate {
			t.Errorf("throttle_bucket_effective_rate of %s is %v, want %v", addr, cliMetric(body, "throttle_bucket_effective_rate"), newRate)
		}
	}
	if int(delivered) != requests {
		t.Errorf("the replicas count %v deliveries, the sink %d requests", delivered, requests)
	}

	for i, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("replica %d exited with %d after SIGTERM, want 0", i+1, code)
		}
	}
}

// cliTestSecondSignal checks that a second SIGTERM during the drain ends the
// process at once with exit code 130, and that the message whose delivery
// it cut short goes back to the queue.
func cliTestSecondSignal(t *testing.T, bin, redisAddr, amqpURL string) {
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	blocking := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // lets the server notice the client going away
		select {
		case entered <- struct{}{}:
		default:
		}
		select { // until the process goes away, or the test ends
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(blocking.Close)
	t.Cleanup(func() { close(release) }) // runs before blocking.Close
	cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
	cfg := fmt.Sprintf(`
redis: {addr: %q}
limit: {bucket: %s, rate: 100}
source:
  rabbitmq: {url: %q, queue: %s, prefetch: 1, declare: true}
sink:
  http: {url: %q, timeout: 60s}
delivery: {drain_timeout: 60s}
metrics: {listen: "off"}
`, redisAddr, name, amqpURL, name, blocking.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := cliStart(t, bin, "run", "--config", cfgPath)
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	cliWait(t, 20*time.Second, "a consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })
	err := ch.PublishWithContext(testenv.Context(t, 10*time.Second), "", name, true, false, amqp.Publishing{Body: []byte(`{"id":1}`)})
	if err != nil {
		t.Fatalf("publishing: %v", err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the message never reached the sink")
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cliWait(t, 5*time.Second, "the drain to start", func() bool { return strings.Contains(p.stderr.String(), "shutting down") })
	select {
	case <-p.done:
		t.Fatalf("the process exited during the drain: %v", p.err)
	case <-time.After(300 * time.Millisecond):
	}
	start := time.Now()
	if code := p.stop(t, 5*time.Second); code != 130 {
		t.Errorf("exit code %d after the second SIGTERM, want 130", code)
	}
	t.Logf("the second SIGTERM ended the process in %v", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(p.stderr.String(), "second") {
		t.Errorf("stderr does not explain the exit:\n%s", p.stderr.String())
	}
	cliWait(t, 5*time.Second, "the unacked message back in the queue", func() bool { return cliQueueState(conn, name).Messages == 1 })
}
