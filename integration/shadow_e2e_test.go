package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// shadowRun starts the binary on a RabbitMQ queue of its own with limit
// (the YAML under limit:, after bucket, indented two spaces), publishes n
// messages whose bodies body gives, waits until every one is delivered and
// checks that none was dead-lettered. It returns the binary, the config
// file, the sink and the replica's /metrics once all were delivered.
func shadowRun(t *testing.T, limit string, n int, body func(id int) []byte) (bin, cfgPath string, sink *cliSink, metrics string) {
	t.Helper()
	bin = cliBuild(t)
	name := cliName(t)
	sink = cliNewSink(t)
	conn, ch := cliQueue(t, testenv.AMQPURL(t), name)
	var addrs []string
	cfgPath, addrs = cliRabbitFleet(t, bin, conn, name, 1, limit, "    prefetch: 20", sink.srv.URL+"/send")
	metricsAddr := addrs[0]

	ctx := testenv.Context(t, 60*time.Second)
	for id := range n {
		err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent,
			MessageId: strconv.Itoa(id), Body: body(id),
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	cliWait(t, 30*time.Second, "every message delivered", func() bool {
		_, unique := sink.counts()
		return unique == n
	})
	if dl := cliQueueState(conn, name+".dlq").Messages; dl != 0 {
		t.Errorf("%d messages dead-lettered, want 0: a shadow refuses nothing", dl)
	}
	_, metrics = cliGet("http://" + metricsAddr + "/metrics")
	return bin, cfgPath, sink, metrics
}

// TestShadowLayerEndToEnd runs the binary with a per-recipient shadow
// layer of 1/h (on_exceed dead_letter) under a shared bucket of 50/s, and
// 100 messages to one recipient: all 100 are delivered at the shared rate,
// none is dead-lettered, and the layer counts the 99 it would have refused
// (throttle_limit_exceeded_total{shadow="true"}), observes 100 would-be
// waits, and keeps its state apart from an enforced layer's.
func TestShadowLayerEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		n    = 100
		rate = 50.0
	)
	to := cliName(t) + "-r0"
	bin, cfgPath, sink, body := shadowRun(t, fmt.Sprintf(`  rate: %v
  burst: 1
  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/h
      on_exceed: dead_letter
      shadow: true`, rate), n, func(id int) []byte { return fmt.Appendf(nil, `{"id":%d,"to":%q}`, id, to) })
	// At the shared rate: burst 1, so the 100 sends span 99/rate.
	ts := sink.times()
	span := ts[len(ts)-1].Sub(ts[0])
	t.Logf("%d messages of one recipient delivered over %v (shared rate %v/s: %v)", n, span, rate, time.Duration(float64(n-1)/rate*float64(time.Second)))
	if want := time.Duration(float64(n-1) / rate * 0.9 * float64(time.Second)); span < want {
		t.Errorf("delivered over %v, want at least %v: the shared bucket must still hold the rate", span, want)
	}
	if got := cliMetric(body, `throttle_limit_exceeded_total{action="dead_letter",layer="per-recipient",shadow="true"}`); got != n-1 {
		t.Errorf("throttle_limit_exceeded_total{per-recipient,dead_letter,shadow} = %v, want %d", got, n-1)
	}
	if got := cliMetric(body, `throttle_limit_exceeded_total{action="dead_letter",layer="per-recipient",shadow="false"}`); got != 0 {
		t.Errorf("throttle_limit_exceeded_total{per-recipient,dead_letter,enforced} = %v, want 0", got)
	}
	if got := cliMetric(body, `throttle_limit_shadow_wait_seconds_count{layer="per-recipient"}`); got != n {
		t.Errorf("throttle_limit_shadow_wait_seconds_count = %v, want %d", got, n)
	}
	// The operator's view marks the layer, and its state is its own: one
	// token spent by the first message.
	out := cliRun(t, bin, "bucket", "status", "--config", cfgPath)
	if !strings.Contains(out, "SHADOW") {
		t.Errorf("bucket status --config: want the layer marked SHADOW, got\n%s", out)
	}
	out = cliRun(t, bin, "bucket", "status", "--config", cfgPath, "--layer", "per-recipient", "--key", to)
	if !strings.Contains(out, "tokens:  0.00") || !strings.Contains(out, "of 1 (full in 59m") {
		t.Errorf("bucket status --layer --key: want about 0 of 1 tokens, full in 59m, got\n%s", out)
	}
}

// TestShadowSharedBucketEndToEnd runs the binary with limit.shadow: true on
// a shared bucket of 1/s (burst 1) and 100 messages: all are delivered at
// once rather than over 99 s, none is dead-lettered, the shadow bucket
// counts the ones it would have made wait
// (throttle_limit_exceeded_total{layer="bucket",action="wait",shadow="true"})
// and observes 100 would-be waits, the real bucket's state is never
// charged, and 'bucket status' marks the bucket a shadow.
func TestShadowSharedBucketEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 100
	// Enforced, 1/s would take 99 s; shadowRun waits 30 s at the most.
	bin, cfgPath, sink, body := shadowRun(t, "  rate: 1\n  burst: 1\n  shadow: true", n, func(id int) []byte { return fmt.Appendf(nil, `{"id":%d}`, id) })
	ts := sink.times()
	span := ts[len(ts)-1].Sub(ts[0])
	// One token comes back per second of the span: that many messages
	// found room and are not counted.
	would := cliMetric(body, `throttle_limit_exceeded_total{action="wait",layer="bucket",shadow="true"}`)
	t.Logf("%d messages delivered over %v under a shadow bucket of 1/s, burst 1; %v counted would-wait", n, span, would)
	if most, least := float64(n-1), float64(n-1)-span.Seconds()-1; would > most || would < least {
		t.Errorf("throttle_limit_exceeded_total{bucket,wait,shadow} = %v, want between %v and %v (%d messages over %v at 1/s)", would, least, most, n, span)
	}
	if got := cliMetric(body, `throttle_limit_shadow_wait_seconds_count{layer="bucket"}`); got != n {
		t.Errorf("throttle_limit_shadow_wait_seconds_count{bucket} = %v, want %d", got, n)
	}
	out := cliRun(t, bin, "bucket", "status", "--config", cfgPath)
	if !strings.Contains(out, "SHADOW") {
		t.Errorf("bucket status --config: want the bucket marked SHADOW, got\n%s", out)
	}
	// The real bucket was never charged: full.
	if !strings.Contains(out, "tokens      1 of 1") {
		t.Errorf("bucket status --config: want the real bucket full (1 of 1), got\n%s", out)
	}
}
