package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestLayersThroughput measures `throttle run` (RabbitMQ → HTTP) with the
// shared bucket alone and with a keyed layer over as many keys as messages,
// in alternation, and logs messages/s. It is a measurement, not a check:
// it runs only with THROTTLE_LAYERS_BENCH=1.
//
//	THROTTLE_LAYERS_BENCH=1 go test ./integration/ -run TestLayersThroughput -v
func TestLayersThroughput(t *testing.T) {
	if os.Getenv("THROTTLE_LAYERS_BENCH") != "1" {
		t.Skip("a measurement: set THROTTLE_LAYERS_BENCH=1")
	}
	layersThroughput(t, 20000, 5, "  extra:\n    - {name: per-recipient, key: '{{.JSON.to}}', rate: 1000, burst: 1000}\n", "per-recipient layer", 10000000)
}

// layersThroughput runs n messages to keys distinct keys (the JSON field
// to) through one replica, with and without extra (limit.extra's YAML),
// rounds times in alternation, and logs messages/s and their ratio.
func layersThroughput(t *testing.T, n, rounds int, extraYAML, what string, keys int) {
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	run := func(layered bool) float64 {
		name := cliName(t) + strconv.FormatBool(layered)
		sink := cliNewSink(t)
		_, ch := cliQueue(t, amqpURL, name)
		extra := ""
		if layered {
			extra = extraYAML
		}
		cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
		cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit:
  bucket: %s
  rate: 1000000
%ssource:
  rabbitmq: {url: %q, queue: %s, prefetch: 100, concurrency: 100, declare: true}
sink:
  http: {url: %q, timeout: 5s}
metrics: {listen: %q}
`, redisAddr, name, extra, amqpURL, name, sink.srv.URL+"/send", cliMetricsListen)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		// Declare the queue and fill it before the replica starts.
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
			"x-dead-letter-exchange": name + ".dlx",
		}); err != nil {
			t.Fatal(err)
		}
		ctx := testenv.Context(t, 120*time.Second)
		for i := range n {
			err := ch.PublishWithContext(ctx, "", name, false, false, amqp.Publishing{
				ContentType: "application/json",
				Body:        []byte(fmt.Sprintf(`{"id":%d,"to":"+1555%07d"}`, i, i%keys)),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		p := cliStart(t, bin, "run", "--config", cfgPath)
		cliWait(t, 120*time.Second, "every message delivered", func() bool { _, u := sink.counts(); return u == n })
		p.stop(t, 15*time.Second)
		ts := sink.times()
		// The first 10% warm the replica up (connections, scripts).
		from := ts[n/10]
		return float64(n-n/10) / ts[n-1].Sub(from).Seconds()
	}
	var shared, layered, ratios []float64
	for range rounds {
		a, z := run(false), run(true)
		shared, layered, ratios = append(shared, a), append(layered, z), append(ratios, z/a)
		t.Logf("shared %.0f msgs/s, shared + %s %.0f msgs/s (%.2f×)", a, what, z, z/a)
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	t.Logf("medians over %d alternations of %d messages to %d keys: shared %.0f msgs/s, with the %s %.0f msgs/s, ratio %.2f×", rounds, n, min(n, keys), median(shared), what, median(layered), median(ratios))
}
