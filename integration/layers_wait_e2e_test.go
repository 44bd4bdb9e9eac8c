package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestLayersWaitAndDelayEndToEnd runs the binary on RabbitMQ with a
// per-recipient bucket of 5/s, burst 1, under on_exceed wait and delay:
// every message is delivered, none is dead-lettered, and no recipient gets
// two messages closer than the layer allows (200 ms, less a margin for the
// sink's clock), while different recipients are not held up by each other.
func TestLayersWaitAndDelayEndToEnd(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	for _, action := range []string{"wait", "delay"} {
		t.Run(action, func(t *testing.T) {
			t.Parallel()
			const (
				recipients = 4
				perRecip   = 6
			)
			name := cliName(t)
			sink := cliNewSink(t)
			conn, ch := cliQueue(t, amqpURL, name)
			cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
			cfg := fmt.Sprintf(`
redis:
  addr: %q
  timeout: 2s
limit:
  bucket: %s
  rate: 1000
  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 5/s
      burst: 1
      on_exceed: %s
source:
  rabbitmq:
    url: %q
    queue: %s
    prefetch: 50
    concurrency: 24
    declare: true
sink:
  http:
    url: %q
    timeout: 5s
delivery:
  drain_timeout: 10s
metrics:
  listen: %q
`, redisAddr, name, action, amqpURL, name, sink.srv.URL+"/send", cliMetricsListen)
			if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			p := cliStart(t, bin, "run", "--config", cfgPath)
			t.Cleanup(func() { p.stop(t, 15*time.Second) })
			t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
			cliWait(t, 20*time.Second, "a consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })
			ctx := testenv.Context(t, 60*time.Second)
			to := func(id int) string { return fmt.Sprintf("%s-r%d", name, id%recipients) }
			start := time.Now()
			for id := range recipients * perRecip {
				err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
					ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(id),
					Body: []byte(fmt.Sprintf(`{"id":%d,"to":%q}`, id, to(id))),
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			cliWait(t, 30*time.Second, "every message delivered", func() bool {
				_, unique := sink.counts()
				return unique == recipients*perRecip
			})
			took := time.Since(start)
			if n := cliQueueState(conn, name+".dlq").Messages; n != 0 {
				t.Errorf("%d messages dead-lettered, want none", n)
			}
			// 5/s is 200 ms apart (see spacingPerRecipient). Serialised
			// recipients would take 24 × 200 ms.
			sp := spacingPerRecipient(sink, to, 200*time.Millisecond)
			if !sp.ok() {
				t.Errorf("messages to one recipient above 5/s: %v", sp)
			}
			if took > 4*time.Second {
				t.Errorf("delivering %d messages took %v: recipients held each other up (want about %v)", recipients*perRecip, took, time.Duration(perRecip-1)*200*time.Millisecond)
			}
			t.Logf("%s: %v; all %d delivered in %v", action, sp, recipients*perRecip, took)
		})
	}
}
